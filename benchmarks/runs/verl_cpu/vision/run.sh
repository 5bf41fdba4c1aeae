#!/usr/bin/env bash
# verl's own trainer with the vision policy on CPU (docs/verl.md, "The vision policy"): the two runs of
# the CI test itself (tests/train/test_verl_trainer_cpu.py -- one config, one place), kept here.
# One SFT warm start (sft/), then 2 GRPO steps with a prompted zoom turn on OPEN questions with ARMed
# (scripted/) and 2 GRPO steps where the policy writes its own tool calls on CLOSED questions
# (own_calls/). Run from the repository root after scripts/setup_verl_cpu.sh; nothing else verl-sized
# at the same time (a run holds several GiB). B: where pytest keeps the runs.
# Then: python benchmarks/bench_learning.py && python benchmarks/figures.py
set -euo pipefail
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
B=${B:-runs/verl_vision}
D=benchmarks/runs/verl_cpu/vision
rm -rf "$B"
/usr/bin/time -f %U_user_%S_sys_%e_wall .venv-verl/bin/python -m pytest -p no:cacheprovider -q \
    tests/train/test_verl_trainer_cpu.py --basetemp "$B" 2>&1 | tee "$D/pytest.log"
portable() {  # a record holds no absolute path of this machine: the checkout -> relative, /tmp -> <scratch>
  sed -e "s|$PWD/||g" -e "s|: $PWD\$|: .|" -e "s|/tmp/|<scratch>/|g" "$1"
}
mkdir -p "$D/sft"
cp "$B/verl_policy0/sft/metrics.jsonl" "$D/sft/metrics.jsonl"
for run in scripted own_calls; do
  rm -rf "${D:?}/$run"
  mkdir -p "$D/$run"
  cp "$B/verl_${run}0/metrics.jsonl" "$D/$run/"
  portable "$B/verl_${run}0/verl_config.yaml" > "$D/$run/verl_config.yaml"
  cp -r "$B/verl_${run}0/episodes" "$B/verl_${run}0/vision" "$D/$run/"
done
