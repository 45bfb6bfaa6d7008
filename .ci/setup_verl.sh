#!/usr/bin/env bash
# Install veRL (PyPI `verl`) into its own venv, for tests/trainers/test_verl_loop.py: veRL pins a transformers older
# than vLLM's (<5.11), so it shares neither the vLLM venv nor Polar's. veRL goes in with --no-deps, with only what its
# agent-loop package imports (no CUDA stack, no wandb/datasets/peft), on torch's CPU build, plus Polar's own core
# dependencies so the test's driver imports polar_cli from the checkout (PYTHONPATH).
# Idempotent: a marker keyed by the pins below skips the work when the venv is already complete.
set -euo pipefail
cd "$(dirname "$0")/.."

VERL_VERSION="0.9.1"
TORCH_VERSION="2.13.0+cpu"          # as .ci/setup_vllm.sh; pip takes it from /opt/wheels on this machine kind
TRANSFORMERS_VERSION="5.10.2"       # verl 0.9.1 wants >=5.5.3,<5.11
VENV="${POLAR_VERL_VENV:-$HOME/.cache/polar/verl-venv}"
PYTHON="${POLAR_VERL_PYTHON:-python3.11}"
MARKER="$VENV/.polar-verl-${VERL_VERSION}-torch-${TORCH_VERSION}-tf-${TRANSFORMERS_VERSION}.ok"
# What `verl.experimental.agent_loop` imports at module level (read in verl 0.9.1), with verl's own bounds.
VERL_RUNTIME=("ray>=2.41.0" "hydra-core" "omegaconf" "pillow" "tensordict>=0.8.0,<=0.10.0,!=0.9.0" "numpy>=2.0.0"
  "pandas" "pyarrow>=19.0.0" "datasets" "fastapi" "uvicorn" "codetiming" "dill" "packaging>=20.0" "cachetools" "pybind11" "pylatexenc")

start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }

check() {
  "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch, transformers
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register  # noqa: F401
print(f"verl {md.version('verl')}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
}

quick_check() {
  "$VENV/bin/python" -c "import importlib.metadata as md, sys; sys.exit(md.version('verl') != '$VERL_VERSION')"
}

if [ -f "$MARKER" ] && quick_check >/dev/null 2>&1; then
  echo "setup_verl: already installed in $VENV ($(elapsed))"
  exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
echo "setup_verl: installing verl==$VERL_VERSION into $VENV"
rm -f "$VENV"/.polar-verl-*.ok
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# Polar's core dependencies, read from pyproject.toml (the test's driver imports polar_cli from the checkout).
mapfile -t POLAR_DEPS < <("$VENV/bin/python" -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))")
LOG="$VENV/setup_verl.log"
pip_install() {
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off ${POLAR_VERL_PIP_ARGS:-} "$@" \
    >>"$LOG" 2>&1 || { grep -v '^WARNING: Location' "$LOG" | tail -40 >&2
                       echo "setup_verl: pip install failed after $(elapsed); full log: $LOG" >&2; exit 1; }
}
: >"$LOG"
# The pins named together: with no torch, a bare torch requirement would pull a multi-GB CUDA build.
pip_install "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" "${VERL_RUNTIME[@]}" "${POLAR_DEPS[@]}"
pip_install --no-deps "verl==$VERL_VERSION"
echo "setup_verl: pip install done ($(elapsed))"
check
touch "$MARKER"
echo "setup_verl: done in $(elapsed); venv $(du -sh "$VENV" | cut -f1)"
