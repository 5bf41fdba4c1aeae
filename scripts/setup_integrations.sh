#!/usr/bin/env bash
# Create .venv-integrations: OpenEnv (openenv-core), verifiers and TRL's tool-calling GRPO beside MedVQA-Gym
# (docs/integrations.md).
#
# A venv of its own, because openenv-core and verifiers pull gradio, fastmcp and their pins, which
# would downgrade pillow and openai in the main .venv. torch comes in as the CPU wheel pinned by
# constraints.txt (the rewards extra: ARMed's BERTScore and cosine terms score OPEN answers), and
# no package here may pull torchvision or a CUDA torch: the last step checks.
# Idempotent: a second run only re-checks the stamp (seconds). INTEGRATIONS_VENV=<dir> picks another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${INTEGRATIONS_VENV:-.venv-integrations}
if [[ ! -x $VENV/bin/python ]]; then
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.medvqa-integrations-installed
want=$(cat scripts/setup_integrations.sh constraints.txt setup.cfg | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
pip=("$VENV/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip
# The env, its tools and rewards (CPU torch via constraints.txt), the tool server's web stack, and
# the frameworks at the versions the adapters were written against (scikit-image: the classical tool engines).
# TRL (with jmespath, which its tool-calling GRPO needs below transformers 5.13) is here too so that
# tests/integrations/ runs whole in this venv; CI runs the TRL test in .venv, where the trl extra has it.
"${pip[@]}" install -q -c constraints.txt -e ".[serve,rewards]" \
  "openenv-core==0.3.0" "verifiers==0.4.0" "trl==1.16.0" jmespath scikit-image pytest pytest-timeout
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
import torch
if not torch.__version__.endswith("+cpu"):
    sys.exit(f"torch {torch.__version__} is not the CPU build: an install pulled another torch")
if importlib.util.find_spec("torchvision") is not None:
    sys.exit("torchvision was installed: it cannot load beside the CPU torch (see NOTES.md)")
PY
echo "$want" > "$stamp"
