#!/usr/bin/env bash
# A tiny tool-calling model made from Polar's own data (README.md here): scripted teacher -> polar generate -> polar
# export -> SFT on the traces' loss masks -> (with --eval-samples K) vLLM's CPU build serving it to the real CLIs.
#
#   bash examples/tiny_agent/run.sh [--out DIR] [--steps N] [--eval-samples K] ...   (--help for all)
#
# Needs the CLIs (polar harness install pi codex claude_code shell), polar_cli with the `train` extra and `datasets` in
# the Python that runs this ($PYTHON), and for --eval-samples the vLLM CPU venv (.ci/setup_vllm.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" "$root/examples/tiny_agent/tiny_agent.py" "$@"
