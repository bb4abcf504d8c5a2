#!/usr/bin/env bash
# OTel Weaver's live-check of the spans `msgtrail dev --demo` exports, against the project's
# semantic-convention registry (semconv/, which depends on the official model vendored in
# semconv/official/model; --include-unreferenced accepts the official attributes the
# project registry does not list itself). Runs offline. Prints the finding counts by level and exits
# non-zero when there is any violation.
#
#   scripts/semconv-live-check.sh [seconds of demo, default 30]
#
# Environment: MSGTRAIL_BIN (default target/release/msgtrail, built if missing),
# WEAVER_BIN (OTel Weaver's binary; default `weaver` on the PATH — build it from
# https://github.com/open-telemetry/weaver), REGISTRY (default semconv), LIVE_CHECK_OUT (report folder, default a temporary
# one), NATS_SERVER_BIN (as for `msgtrail dev`).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
weaver=${WEAVER_BIN:-$(command -v weaver || true)}
[ -n "$weaver" ] && [ -x "$weaver" ] || {
  echo "OTel Weaver not found: set WEAVER_BIN (build it from https://github.com/open-telemetry/weaver)" >&2
  exit 2
}
bin=${MSGTRAIL_BIN:-target/release/msgtrail}
registry=${REGISTRY:-semconv}
out=${LIVE_CHECK_OUT:-$(mktemp -d /tmp/msgtrail-live-check.XXXXXX)}
[ -x "$bin" ] || cargo build --release -p msgtrail-cli

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
otlp=$(free_port)
admin=$(free_port)

"$weaver" registry live-check -r "$registry" --include-unreferenced \
    --otlp-grpc-port "$otlp" --admin-port "$admin" --inactivity-timeout 120 \
    --format json -o "$out" >"$out/weaver.log" 2>&1 &
weaver_pid=$!
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$otlp") 2>/dev/null && break
    sleep 0.1
done

# Every trace exported (no tail sampling of healthy ones), a short grace.
OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$otlp" \
    MSGTRAIL_OTEL_SAMPLE_RATIO=1 MSGTRAIL_OTEL_GRACE_MS=200 \
    timeout -s INT -k 10 "$secs" "$bin" dev --demo --demo-every 50ms >"$out/dev.log" 2>&1 || true

curl -fsS -X POST "http://127.0.0.1:$admin/stop" >/dev/null || true
wait "$weaver_pid" || true

report="$out/live_check.json"
[ -s "$report" ] || { echo "no report in $out (see $out/weaver.log)" >&2; exit 2; }
jq -c '.statistics | {total_entities, advice_level_counts, no_advice_count: .no_advice_count}' "$report" 2>/dev/null \
    || jq -c '.statistics' "$report"
violations=$(jq '[.statistics.advice_level_counts.violation // 0] | add' "$report")
echo "violations: $violations (report: $report)"
[ "$violations" -eq 0 ]
