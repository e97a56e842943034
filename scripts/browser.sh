#!/usr/bin/env bash
# The dashboard's browser tests (tests/browser) drive Debian's Chromium at /usr/bin/chromium
# through Playwright: install it from Debian's packages when it is missing. Playwright's own
# browser download (`playwright install`) is never used.
set -euo pipefail

CHROMIUM=${DPRC_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "browser.sh: $CHROMIUM is missing and apt-get is not available; install Chromium" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "browser.sh: installing chromium from Debian's packages" >&2
$SUDO apt-get install -y chromium || { $SUDO apt-get update && $SUDO apt-get install -y chromium; }
test -x "$CHROMIUM"
