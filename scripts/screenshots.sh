#!/usr/bin/env bash
# Regenerates the page's screenshots in docs/ (docs/page-*.png): the same headless Chromium
# over WebDriver as the browser tests (tests/page.rs, test screenshots_of_the_main_views),
# against a real nats-server, broker and listener.
set -euo pipefail
cd "$(dirname "$0")/.."
NATS_SERVER_BIN=$(scripts/install-nats-server.sh | tail -n 1)
CHROME_PATHS=$(scripts/install-chromium.sh | tail -n 2)
CHROMEDRIVER=$(echo "$CHROME_PATHS" | head -n 1)
CHROME_BIN=$(echo "$CHROME_PATHS" | tail -n 1)
MSGTRAIL_SCREENSHOTS="$PWD/docs"
export NATS_SERVER_BIN CHROMEDRIVER CHROME_BIN MSGTRAIL_SCREENSHOTS
cargo test -p msgtrail-e2e --test page -- --exact screenshots_of_the_main_views
ls -l docs/page-*.png
