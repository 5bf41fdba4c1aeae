#!/usr/bin/env bash
# verl's own trainer on CPU beside the native trainer, OPEN questions with ARMed, from the same
# 60-step SFT warm start (docs/verl.md, "A learning curve from verl itself"). Run from the
# repository root after scripts/setup.sh and scripts/setup_verl_cpu.sh; one verl run at a time
# (it needs several GiB of memory). R: the run folder.
set -euo pipefail
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
R=${R:-runs/vc_open}
T='/usr/bin/time -f %U_user_%S_sys_%e_wall'
TOOLS=image_zoom_in,segment=classical
mkdir -p "$R"
[ -f "$R/policy/config.json" ] || .venv/bin/python -m train.verl_integration.tiny_policy --out "$R/policy" --kind qwen2
[ -f "$R/sft/final/config.json" ] || $T .venv/bin/python -m train.sft --max_turns 1 --policy "$R/policy" --steps 60 --batch_size 16 \
    --lr 3e-3 --answer_types OPEN --tools $TOOLS --tool_share 1.0 --eval_size 64 --eval_every 20 --max_new_tokens 48 \
    --out "$R/sft" > "$R/sft.log" 2>&1
for s in ${NATIVE_SEEDS-0}; do
  [ -f "$R/native_s$s/final/config.json" ] || $T .venv/bin/python -m train.grpo --max_turns 1 --policy "$R/sft/final" --tools $TOOLS \
      --reward default --algo grpo --seed $s --steps ${STEPS:-30} --prompts_per_step 8 --group_size 8 --lr 5e-4 \
      --temperature 0.7 --answer_types OPEN --eval_size 64 --eval_every 5 --max_new_tokens 48 --micro_batch 64 \
      --save_every 10 --tensorboard false --out "$R/native_s$s" > "$R/native_s$s.log" 2>&1
done
OUT="$R/verl" POLICY="$R/sft/final" STEPS=${STEPS:-30} SCRIPTED_TOOL=0 $T bash scripts/train_verl_cpu.sh \
    data.train_batch_size=8 actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=0.7 \
    actor_rollout_ref.rollout.val_kwargs.temperature=0 actor_rollout_ref.actor.optim.lr=5e-4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 trainer.test_freq=5 trainer.val_before_train=true \
    > "$R/verl.log" 2>&1
.venv/bin/python scripts/plot_verl_vs_native.py --verl "$R/verl" $(for d in "$R"/native_s*/; do printf -- '--native %s ' "$d"; done) \
    --out docs/img/verl_vs_native_open_sft60.png --table "$R/summary.md"
