#!/usr/bin/env bash
# Runs the demo system (`msgtrail dev --demo`) for a while, then checks every trajectory it
# made with `msgtrail audit`: no state regression, no hop ending before it starts, no
# delivery before the message was deliverable, no span-ID collision, and a clock bound on
# every hop whose four timestamps were reported. Exits non-zero when one is found.
#
#   scripts/demo-audit.sh [seconds (default 600)] [extra `msgtrail dev` options]
#   scripts/demo-audit.sh 600 --demo-every 200ms
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-600}
shift || true
NATS_SERVER_BIN=$(scripts/install-nats-server.sh | tail -n 1)
export NATS_SERVER_BIN
cargo build --release -p msgtrail-cli
BIN=target/release/msgtrail
LOG=$(mktemp -t msgtrail-demo-audit.XXXXXX.log)
"$BIN" dev --demo "$@" >"$LOG" 2>&1 &
DEV=$!
trap 'kill "$DEV" 2>/dev/null || true; wait "$DEV" 2>/dev/null || true' EXIT
echo "demo running for ${SECS}s (log: $LOG)"
sleep "$SECS"
# Let the last messages' records reach the listener before reading them.
sleep 15
kill -0 "$DEV" 2>/dev/null || { echo "the demo system stopped early:"; tail -n 40 "$LOG"; exit 1; }
"$BIN" audit --since-secs $((SECS + 60))
