#!/usr/bin/env bash
# Experiment 3: the CLOSED proof of docs/training.md rerun on the fixed objective (issue 10).
# Same recipe as experiment 2; run from the repository root. Seeds run one after another.
set -euo pipefail
export HF_HUB_OFFLINE=1
PY=".venv/bin/python"
T='/usr/bin/time -f %U_user_%S_sys_%e_wall'
[ -f runs/exp3/sft/final/config.json ] || nice -n 10 $T $PY -m train.sft --max_turns 1 --policy tiny-qwen2-vl --demo-prompt \
    --tools ground=oracle --steps 60 --batch_size 16 --lr 3e-3 --answer_types CLOSED --tool_share 0.5 \
    --eval_size 64 --eval_every 20 --max_new_tokens 32 --out runs/exp3/sft
for s in ${SEEDS-0 1 2 3 4 5}; do
  nice -n 10 $T $PY -m train.grpo --max_turns 1 --policy runs/exp3/sft/final --tools ground=oracle --algo grpo --seed $s \
      --steps 30 --prompts_per_step 8 --group_size 8 --lr 5e-4 --temperature 0.7 --answer_types CLOSED \
      --eval_size 64 --eval_every 5 --max_new_tokens 32 --micro_batch 64 --save_every 10 --tensorboard false \
      --out runs/exp3/grpo_s$s > runs/exp3/grpo_s$s.log 2>&1
  tail -1 runs/exp3/grpo_s$s.log
done
# Ablation (run with ABLATION=1): the seeds that did not learn in experiment 2, with the old
# loss aggregation (per-sequence mean), to see whether token-mean is what made them learn.
if [ -n "${ABLATION:-}" ]; then
  for s in ${ABLATION_SEEDS:-1 4 5}; do
    nice -n 10 $T $PY -m train.grpo --max_turns 1 --policy runs/exp3/sft/final --tools ground=oracle --algo grpo --seed $s \
        --steps 30 --prompts_per_step 8 --group_size 8 --lr 5e-4 --temperature 0.7 --answer_types CLOSED \
        --eval_size 64 --eval_every 5 --max_new_tokens 32 --micro_batch 64 --save_every 10 --tensorboard false \
        --loss_agg seq-mean-token-mean --out runs/exp3/grpo_seqmean_s$s > runs/exp3/grpo_seqmean_s$s.log 2>&1
    tail -1 runs/exp3/grpo_seqmean_s$s.log
  done
fi
