#!/usr/bin/env bash
# The whole test suite: installs nats-server and Chromium (for the page tests) if missing,
# checks formatting and lints, then runs every test of the workspace against real
# nats-server processes.
set -euo pipefail
cd "$(dirname "$0")/.."
NATS_SERVER_BIN=$(scripts/install-nats-server.sh | tail -n 1)
# tests/python_client.rs runs examples/python/raw_client.py (a Debian/Ubuntu system Python
# refuses plain pip installs, PEP 668: then install them anyway, this is a test machine).
PY_PKGS=('nats-py>=2.6' 'nkeys>=0.2.1')
python3 -m pip install --quiet --disable-pip-version-check "${PY_PKGS[@]}" \
  || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "${PY_PKGS[@]}"
export NATS_SERVER_BIN
# tests/faults/skew.rs shifts brokers' and a consumer's wall clocks with libfaketime.
FAKETIME_LIB=$(scripts/install-faketime.sh | tail -n 1)
export FAKETIME_LIB
# tests/page.rs drives the listener page in a headless Chromium over chromedriver.
CHROME_PATHS=$(scripts/install-chromium.sh | tail -n 2)
CHROMEDRIVER=$(echo "$CHROME_PATHS" | head -n 1)
CHROME_BIN=$(echo "$CHROME_PATHS" | tail -n 1)
export CHROMEDRIVER CHROME_BIN
echo "using $CHROMEDRIVER ($("$CHROMEDRIVER" --version)) and $CHROME_BIN"
echo "using $NATS_SERVER_BIN ($("$NATS_SERVER_BIN" --version))"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace "$@"
