#!/usr/bin/env bash
# The whole test suite: installs nats-server and Chromium (for the page tests) if missing,
# checks formatting and lints, then runs every test of the workspace against real
# nats-server processes.
set -euo pipefail
cd "$(dirname "$0")/.."
NATS_SERVER_BIN=$(scripts/install-nats-server.sh | tail -n 1)
# tests/python_client.rs runs examples/python/raw_client.py (nats-py, nkeys) and
# crates/listener/tests/observe_python.rs runs examples/python/observed_app.py (nats-py) (a
# Debian/Ubuntu system Python refuses plain pip installs, PEP 668: then install them anyway,
# this is a test machine).
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
# OTel Weaver (the live-check of exported spans, crates/otel/tests/semconv.rs) is served by
# no package registry: it runs when WEAVER_BIN names it or `weaver` is on the PATH.
WEAVER_BIN=${WEAVER_BIN:-$(command -v weaver 2>/dev/null || true)}
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# --no-fail-fast: every failing test binary is reported, not only the first one.
status=0
cargo test --workspace --no-fail-fast "$@" || status=$?
if [ -n "$WEAVER_BIN" ]; then
  export WEAVER_BIN
  if cargo test -p msgtrail-otel --test semconv -- --ignored; then
    weaver_line="Weaver live-check: ran ($WEAVER_BIN), 0 violations"
  else
    status=1
    weaver_line="Weaver live-check: ran ($WEAVER_BIN) and FAILED"
  fi
else
  weaver_line="Weaver live-check: did not run (no WEAVER_BIN, no weaver on the PATH; build it from https://github.com/open-telemetry/weaver and set WEAVER_BIN). The conventions test without Weaver (crates/otel/tests/conventions.rs) ran."
fi
echo "$weaver_line"
exit "$status"
