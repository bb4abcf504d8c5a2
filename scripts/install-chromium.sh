#!/usr/bin/env bash
# Makes sure a headless Chromium and its WebDriver (chromedriver) are available for the
# browser tests of the listener page (tests/page.rs), installing Debian's chromium and
# chromium-driver packages when missing (as root, non-interactive; with sudo otherwise).
# Order: $CHROMEDRIVER (+ $CHROME_BIN), then chromedriver/chromium on PATH, then apt-get.
# Prints the chromedriver path on its second-to-last line and the browser's on its last.
set -euo pipefail

find_driver() {
  local c
  for c in "${CHROMEDRIVER:-}" "$(command -v chromedriver 2>/dev/null || true)" /usr/bin/chromedriver; do
    if [ -n "$c" ] && [ -x "$c" ]; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

find_browser() {
  local c
  for c in "${CHROME_BIN:-}" "$(command -v chromium 2>/dev/null || true)" /usr/bin/chromium \
    "$(command -v chromium-browser 2>/dev/null || true)" "$(command -v google-chrome 2>/dev/null || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

if driver=$(find_driver) && browser=$(find_browser); then
  echo "$driver"
  echo "$browser"
  exit 0
fi

echo "chromium/chromedriver not found: installing Debian's chromium and chromium-driver" >&2
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 && SUDO=(sudo -n)
fi
if command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq >&2 || true
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >&2 || true
fi

if driver=$(find_driver) && browser=$(find_browser); then
  echo "$driver"
  echo "$browser"
  exit 0
fi

echo "could not install chromium + chromedriver: run 'apt-get install chromium chromium-driver' (Debian/Ubuntu) or set CHROMEDRIVER and CHROME_BIN" >&2
exit 1
