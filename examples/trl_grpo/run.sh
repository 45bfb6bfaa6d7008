#!/usr/bin/env bash
# TRL's GRPOTrainer on Polar rollouts, on the CPU (README.md here): vLLM's CPU build serves tiny_agent's tool-calling
# model, `polar serve` runs the reference agent's sessions, TRL's rollout_func gets Polar groups, a callback loads each
# step's weights into vLLM in place.
#
#   bash examples/trl_grpo/run.sh [--steps N] [--out DIR] [--prompts-per-step P] [--num-generations G] ...   (--help)
#
# Needs the vLLM CPU venv (.ci/setup_vllm.sh; $POLAR_VLLM_VENV, default ~/.cache/polar/vllm-venv), tiny_agent's model
# (.ci/setup_tiny_agent.sh; built here when missing) and, in the Python that runs this, polar_cli with the `train`
# extra (torch, trl, matplotlib) and `datasets`. $PYTHON picks that Python.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" "$root/examples/trl_grpo/trl_grpo.py" "$@"
