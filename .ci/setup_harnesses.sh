#!/usr/bin/env bash
# Install every registered harness CLI at its pinned version into Polar's managed prefixes
# (${POLAR_HOME:-~/.cache/polar}/harnesses/<name>-<version>/), through `polar harness install --all`.
#
# Idempotent and cached: a harness whose prefix is complete is skipped; npm's and pip's own caches make a reinstall
# fast. Needs Node.js >= 20 with npm (Debian's nodejs/npm packages are installed if node is missing) and the npm
# registry; the PyPI harnesses (mini_swe_agent, aider, gptme, hermes: one venv each, made with this Python) need PyPI.
# Runs with every installed plugin loaded (codex, claude_code, mini_swe_agent and aider are plugin packages), whatever
# the caller's POLAR_LOAD_PLUGINS says.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "setup_harnesses: installing Debian's nodejs and npm"
    SUDO=""
    if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nodejs npm >/dev/null
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
    echo "setup_harnesses: node $(node --version) is too old (the harness CLIs need >= 20)" >&2
    exit 1
fi

env -u POLAR_LOAD_PLUGINS python -m polar_cli harness install --all
env -u POLAR_LOAD_PLUGINS python -m polar_cli harness list
