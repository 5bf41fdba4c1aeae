#!/usr/bin/env bash
# The OPEN/ARMed proof (issue 10): SFT warm start on OPEN questions, then GRPO with the default
# reward (ARMed for OPEN answers), per tool engine: TOOL=oracle (the tool's text names the lesion's
# organ) or TOOL=classical (blob boxes only: no oracle anywhere). Run from the repository root;
# seeds one after another.
set -euo pipefail
export HF_HUB_OFFLINE=1
PY=".venv/bin/python"
T='/usr/bin/time -f %U_user_%S_sys_%e_wall'
TOOL=${TOOL:-oracle}
SFT_STEPS=${SFT_STEPS:-60}   # the committed runs: 60 (oracle_sft150: 150)
OUT=runs/open/${NAME:-$TOOL}
mkdir -p $OUT
[ -f $OUT/sft/final/config.json ] || nice -n 10 $T $PY -m train.sft --max_turns 1 --policy tiny-qwen2-vl --demo-prompt \
    --tools ground=$TOOL --steps $SFT_STEPS --batch_size 16 --lr 3e-3 --answer_types OPEN --tool_share 0.5 \
    --eval_size 64 --eval_every 10 --max_new_tokens 32 --out $OUT/sft > $OUT/sft.log 2>&1
for s in ${SEEDS-0 1 2}; do
  nice -n 10 $T $PY -m train.grpo --max_turns 1 --policy $OUT/sft/final --tools ground=$TOOL --reward default --algo grpo \
      --seed $s --steps ${STEPS:-30} --prompts_per_step 8 --group_size 8 --lr 5e-4 --temperature 0.7 \
      --answer_types OPEN --eval_size 64 --eval_every 5 --max_new_tokens 32 --micro_batch 64 --save_every 10 \
      --tensorboard false ${EXTRA:-} --out $OUT/grpo_s$s > $OUT/grpo_s$s.log 2>&1
  tail -1 $OUT/grpo_s$s.log
done
