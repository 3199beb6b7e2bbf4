#!/usr/bin/env bash
# Installs the system packages kvcar needs on a fresh Debian machine,
# through apt-get (as root or with sudo). Idempotent: what is present is
# not installed again.
#
#   scripts/deps.sh run    what building and running need: libzmq (cgo,
#                          found through pkg-config). make build/run.
#   scripts/deps.sh test   that, and the test tools: Debian's python3-zmq,
#                          the reference libzmq peer of the interop tests,
#                          python3-msgpack, an independent vLLM-format
#                          encoder,
#                          and chromium, which renders the status page for
#                          its screenshot test (hundreds of MB). make test.
#
# With KVCAR_DEPS_DRY_RUN=1 it only prints what it would install.
set -euo pipefail

what=${1:-}
case "$what" in
run | test) ;;
*)
	echo "usage: $0 run|test" >&2
	exit 2
	;;
esac

need=()
pkg-config --exists libzmq 2>/dev/null || need+=(libzmq3-dev pkg-config)
if [ "$what" = test ]; then
	/usr/bin/python3 -c 'import zmq' 2>/dev/null || need+=(python3-zmq)
	/usr/bin/python3 -c 'import msgpack' 2>/dev/null || need+=(python3-msgpack)
	command -v chromium >/dev/null || need+=(chromium)
fi
if [ ${#need[@]} -eq 0 ]; then
	[ "${KVCAR_DEPS_DRY_RUN:-}" = 1 ] && echo "nothing to install"
	exit 0
fi
if [ "${KVCAR_DEPS_DRY_RUN:-}" = 1 ]; then
	echo "would install: ${need[*]}"
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	SUDO=sudo
else
	SUDO=
fi
echo "installing: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
