#!/usr/bin/env bash
# Build the tiny tool-calling model of examples/tiny_agent (scripted teacher -> polar generate -> polar export -> SFT)
# for tests/examples/test_tiny_agent.py and test_trl_grpo.py. Built from the repository, never downloaded; cached under
# ${POLAR_HOME:-~/.cache/polar}/tiny-agent/<hash of its inputs>/model (tiny_agent.INPUTS), so a run whose inputs did
# not change takes a second. Needs the CLIs (.ci/setup_harnesses.sh, run before this) and polar with the train extra.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# every installed plugin loaded (codex and claude_code are plugin packages), whatever the caller's setting
model=$(env -u POLAR_LOAD_PLUGINS PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  python examples/tiny_agent/tiny_agent.py --cached | tail -n 1)
echo "setup_tiny_agent: $model ($(( $(date +%s) - start ))s)"
