#!/usr/bin/env bash
# Starts the whole system locally: installs nats-server if missing, builds msgtrail, and runs
# `msgtrail dev --demo` (nats-server + broker + demo load) until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
NATS_SERVER_BIN=$(scripts/install-nats-server.sh | tail -n 1)
export NATS_SERVER_BIN
cargo build --bin msgtrail
exec target/debug/msgtrail dev --demo "$@"
