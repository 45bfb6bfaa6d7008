#!/usr/bin/env bash
# Install every registered harness CLI at its pinned version into Polar's managed prefixes
# (${POLAR_HOME:-~/.cache/polar}/harnesses/<name>-<version>/), through `polar harness install --all`.
#
# Idempotent and cached: a harness whose prefix is complete is skipped; npm's and pip's own caches make a reinstall
# fast. Needs Node.js >= 20 with npm (.ci/setup_node.sh installs Debian's if node is missing) and the npm registry;
# the PyPI harnesses (mini_swe_agent, aider, gptme, hermes: one venv each, made with this Python) need PyPI.
# Runs with every installed plugin loaded (codex, claude_code, mini_swe_agent and aider are plugin packages), whatever
# the caller's POLAR_LOAD_PLUGINS says.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/setup_node.sh

env -u POLAR_LOAD_PLUGINS python -m polar_cli harness install --all
env -u POLAR_LOAD_PLUGINS python -m polar_cli harness list
