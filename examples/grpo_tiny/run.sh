#!/usr/bin/env bash
# A closed GRPO loop on the CPU (README.md here): vLLM's CPU build serves the tiny demo model, `polar serve` samples
# GRPO groups through the shell harness's reference agent, plain PyTorch trains, vLLM reloads the weights in place.
#
#   bash examples/grpo_tiny/run.sh [--steps N] [--out DIR] [--groups G] [--samples S] ...   (--help for all)
#
# Needs the vLLM CPU venv (.ci/setup_vllm.sh; $POLAR_VLLM_VENV, default ~/.cache/polar/vllm-venv) and, in the Python
# that runs this, polar_cli with the `train` extra (torch, transformers, matplotlib). $PYTHON picks that Python.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" "$root/examples/grpo_tiny/grpo.py" "$@"
