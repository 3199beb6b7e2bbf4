#!/usr/bin/env bash
# Installs the system packages kvcar needs on a fresh Debian machine:
# libzmq (cgo, through pkg-config), Debian's python3-zmq and
# python3-msgpack, which the interop tests use as a reference libzmq
# publisher and an independent vLLM-format encoder, and chromium, which
# renders the status page for its screenshot test. Idempotent.
set -euo pipefail

need=()
pkg-config --exists libzmq 2>/dev/null || need+=(libzmq3-dev pkg-config)
/usr/bin/python3 -c 'import zmq' 2>/dev/null || need+=(python3-zmq)
/usr/bin/python3 -c 'import msgpack' 2>/dev/null || need+=(python3-msgpack)
command -v chromium >/dev/null || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	SUDO=sudo
else
	SUDO=
fi
echo "installing: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
