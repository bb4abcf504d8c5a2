#!/usr/bin/env bash
# Makes sure libfaketime is available for the fault suite's skewed-clock scenarios
# (tests/faults/skew.rs runs a broker and a consumer with LD_PRELOAD=libfaketime and a
# FAKETIME offset), installing Debian's libfaketime package when missing (as root,
# non-interactive; with sudo otherwise). Order: $FAKETIME_LIB, then the multiarch library
# directories. Prints the path of libfaketime.so.1 on its last line.
set -euo pipefail

find_lib() {
  local c
  for c in "${FAKETIME_LIB:-}" /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 \
    /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1 \
    /usr/local/lib/faketime/libfaketime.so.1; do
    if [ -n "$c" ] && [ -f "$c" ]; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

if lib=$(find_lib); then
  echo "$lib"
  exit 0
fi

echo "libfaketime not found: installing Debian's libfaketime" >&2
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 && SUDO=(sudo -n)
fi
if command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends libfaketime >&2 \
    || { "${SUDO[@]}" apt-get update -qq >&2 || true
         "${SUDO[@]}" apt-get install -y -qq --no-install-recommends libfaketime >&2 || true; }
fi

if lib=$(find_lib); then
  echo "$lib"
  exit 0
fi

echo "could not install libfaketime: run 'apt-get install libfaketime' (Debian/Ubuntu) or set FAKETIME_LIB to libfaketime.so.1" >&2
exit 1
