#!/usr/bin/env bash
# The deployment of docker-compose.yml as plain processes on loopback, from the same config
# files: three nats-server nodes (nats/nats.conf), two brokers (R3, msgtrail/clients.json), a
# listener, and an OTLP receiver that prints spans (the devkit's otlp_dump) in place of
# Jaeger/Tempo. For machines without Docker.
#
#   deploy/local.sh start     # builds, starts everything, prints what runs where
#   deploy/local.sh stop      # stops what `start` started (by the PIDs it recorded)
#
# State and logs go to $MSGTRAIL_LOCAL_DIR (default /tmp/msgtrail-local). Ports: clients
# 14221-14223, monitoring 18221-18223, routes 16221-16223, listener 17380, OTLP 14317.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${MSGTRAIL_LOCAL_DIR:-/tmp/msgtrail-local}
PIDS="$DIR/pids"

stop() {
  if [ -f "$PIDS" ]; then
    while read -r pid; do kill "$pid" 2>/dev/null || true; done < "$PIDS"
    rm -f "$PIDS"
  fi
}

case "${1:-start}" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

stop
mkdir -p "$DIR/logs"
NATS=$(scripts/install-nats-server.sh | tail -n 1)
cargo build --quiet -p msgtrail-cli -p msgtrail-devkit --example otlp_dump
BIN=target/debug/msgtrail

export NATS_HOST=127.0.0.1
export NATS_SYS_PASSWORD=${NATS_SYS_PASSWORD:-dev-sys-secret}
export MSGTRAIL_BROKER_PASSWORD=${MSGTRAIL_BROKER_PASSWORD:-dev-broker-secret}
export MSGTRAIL_LISTENER_PASSWORD=${MSGTRAIL_LISTENER_PASSWORD:-dev-listener-secret}
export MSGTRAIL_CLIENT_PASSWORD=${MSGTRAIL_CLIENT_PASSWORD:-dev-client-secret}
export MSGTRAIL_APP_PASSWORD=${MSGTRAIL_APP_PASSWORD:-dev-app-secret}
export MSGTRAIL_OBSERVER_PASSWORD=${MSGTRAIL_OBSERVER_PASSWORD:-dev-observer-secret}
export NATS_ROUTE_1=nats://127.0.0.1:16221 NATS_ROUTE_2=nats://127.0.0.1:16222 NATS_ROUTE_3=nats://127.0.0.1:16223

for i in 1 2 3; do
  NATS_SERVER_NAME=nats-$i NATS_CLIENT_PORT=1422$i NATS_MONITOR_PORT=1822$i \
    NATS_CLUSTER_PORT=1622$i NATS_STORE_DIR="$DIR/nats-$i" \
    "$NATS" -c deploy/nats/nats.conf > "$DIR/logs/nats-$i.log" 2>&1 &
  echo $! >> "$PIDS"
done
for i in 1 2 3; do
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:1822$i/healthz" > /dev/null 2>&1 && break
    sleep 0.2
  done
done

target/debug/examples/otlp_dump grpc 127.0.0.1:14317 > "$DIR/logs/spans.log" 2>&1 &
echo $! >> "$PIDS"

# One broker at a time: the first creates the R3 streams and buckets.
for i in 1 2; do
  NATS_URL=nats://127.0.0.1:1422$i NATS_USER=broker NATS_PASSWORD=$MSGTRAIL_BROKER_PASSWORD \
    OTEL_SERVICE_NAME=msgtrail-broker \
    "$BIN" broker --replicas=3 --clients=deploy/msgtrail/clients.json \
    > "$DIR/logs/broker-$i.log" 2>&1 &
  echo $! >> "$PIDS"
  sleep 3
done

NATS_URL=nats://127.0.0.1:14223 NATS_USER=listener NATS_PASSWORD=$MSGTRAIL_LISTENER_PASSWORD \
  MSGTRAIL_LISTENER_ADDR=127.0.0.1:17380 MSGTRAIL_LISTENER_DATA_DIR="$DIR/listener" \
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:14317 OTEL_EXPORTER_OTLP_PROTOCOL=grpc \
  OTEL_SERVICE_NAME=msgtrail-broker \
  "$BIN" listener > "$DIR/logs/listener.log" 2>&1 &
echo $! >> "$PIDS"
sleep 2

K=deploy/msgtrail/demo-keys
cat <<EOF
running (logs in $DIR/logs; spans in $DIR/logs/spans.log; stop with: deploy/local.sh stop)
  NATS     nats://127.0.0.1:14221 .. 14223   listener http://127.0.0.1:17380
send:     $BIN send --nats-url nats://127.0.0.1:14221 --nats-nkey $K/shop.nk --inbox-prefix _INBOX_CLIENT.shop --client-id shop --seed-file $K/shop.nk --topic orders.eu --data hello
consume:  $BIN consume --nats-url nats://127.0.0.1:14222 --nats-nkey $K/billing-1.nk --inbox-prefix _INBOX_CLIENT.billing-1 --client-id billing-1 --seed-file $K/billing-1.nk --topic 'orders.>' --group billing --pull --max 1
EOF
