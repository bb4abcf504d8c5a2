#!/usr/bin/env bash
# Replaces semconv/official/ (the official OpenTelemetry semantic-convention model that
# semconv/manifest.yaml depends on) with the model and licence of one commit or tag of
# open-telemetry/semantic-conventions. Needs the network once; everything else is offline.
#
#   scripts/refresh-semconv.sh [ref, default the pinned commit below]
#
# Pinned: 384d66161cb18704c729645fa8136a148df9571c (v1.44.0 + 22 commits, schema 1.45.0).
# After a refresh: update the pin above, `schema_url` in semconv/manifest.yaml, and run
# `cargo test -p msgtrail-otel --test semconv`.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:-384d66161cb18704c729645fa8136a148df9571c}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL "https://github.com/open-telemetry/semantic-conventions/archive/$ref.tar.gz" \
  | tar -xz -C "$tmp" --strip-components=1 --wildcards '*/model' '*/LICENSE'
rm -rf semconv/official
mkdir -p semconv/official
mv "$tmp/model" "$tmp/LICENSE" semconv/official/
echo "semconv/official now holds open-telemetry/semantic-conventions@$ref"
