#!/usr/bin/env bash
# Headless Chromium for the polar view tests and bench/view.py: Debian's `chromium`, driven by Playwright from PyPI
# (the dev extra) with its executable path set (polar_cli/view/browser.py). `playwright install` is never run: no
# browser download is possible here. Idempotent: each step is skipped when its result is already there.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

if ! command -v chromium >/dev/null 2>&1; then
  echo "setup_browser: installing Debian's chromium"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
if ! python -c "import playwright.sync_api" >/dev/null 2>&1; then
  echo "setup_browser: installing playwright"
  python -m pip install -q --disable-pip-version-check playwright
fi
echo "setup_browser: $(chromium --version 2>/dev/null || echo 'chromium ?'), playwright $(python -c \
  'import importlib.metadata as m; print(m.version("playwright"))')"
