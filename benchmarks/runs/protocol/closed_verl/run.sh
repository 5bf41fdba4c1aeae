#!/usr/bin/env bash
# The learning protocol's CLOSED task (train/protocol.py, docs/training.md) through verl's own trainer
# on this CPU, against the protocol's record benchmarks/runs/protocol/closed: seed k runs on tool build
# k mod 3 (the ground tool pinned by the content hash the record's identity block names) from that
# build's val-chosen warm start (checked against the record before anything runs, step 1).
# verl 0.9.1 main_ppo (TaskRunnerV1), FSDP actor + reference on gloo, vLLM-CPU rollout, our agent loop
# and env. docs/verl.md, "The learning protocol's task through verl". Run from the repository root of a
# clean checkout after scripts/setup_verl_cpu.sh, once the native protocol's warm starts exist under
# $NATIVE (train.protocol --stages warm writes them; they are deterministic, so a rerun gives the
# recorded SHA-256); nothing else verl-sized at the same time. Each run folder gets run_record.json
# (train.verl_integration.launch.run_record: tools by hash, policy and data by SHA-256, clean commit).
#
# Environment: RECORD (the native protocol's protocol.json; default benchmarks/runs/protocol/closed's),
# NATIVE (its work folder, where its warm starts are; default runs/protocol/closed), B (work folder),
# D (where the record's files go; default the record's folder + _verl), SEEDS ("0 1 2 3 4"), STEPS (30),
# BATCH (8 questions), N (8 rollouts each), EVAL (200). The reward and the update are not settable here:
# the format penalty, the KL coefficient, the learning rate and the sampling temperature are the record's
# own (train.protocol.recorded_args; a record made before issue 42 ran with format_penalty 0), so every
# reward-trained run of a protocol gets the same reward (tests/train/test_verl_launcher_settings.py).
# DRY_RUN=1 prints them and each seed's verl arguments, and runs nothing. A machine whose tool builds differ from the
# record's (their content hashes say so: float kernels differ between CPUs) runs the native protocol
# itself first and points RECORD at its export, so that verl's seed k meets the native seed k's build.
#
# The policy: the warm start is the native tiny Qwen2-VL (text head_dim 16), which vLLM-CPU does not
# serve; train.verl_integration.widen_heads writes the same function with head_dim 64 (zero
# coordinates that stay zero; logits checked equal, medvqa_widened.json). The one difference in
# training: its q_proj is stored x2, so Adam moves q_proj at half the rate in the original's units.
#
# Native recipe (train.protocol -> train.grpo) -> verl key, as set below:
#   --prompts_per_step 8        -> data.train_batch_size=$BATCH
#   --group_size 8              -> actor_rollout_ref.rollout.n=$N
#   on-policy, 1 update/step    -> actor.ppo_mini_batch_size=$BATCH (= train batch), actor.ppo_epochs=1
#   --temperature (the record's)-> actor_rollout_ref.rollout.temperature=$TEMPERATURE
#   --lr (the record's grpo_lr) -> actor.optim.lr=$LR (constant, no warm-up: lr_warmup_steps_ratio=0)
#   --weight_decay 0 (default)  -> actor.optim.weight_decay=0 (verl's default is 0.01)
#   --max_grad_norm 1 (default) -> actor.optim.clip_grad=1.0
#   AdamW betas (0.9, 0.999)    -> actor.optim.betas (verl's default, the same)
#   --kl_coef (the record's)    -> actor.use_kl_loss=true, kl_loss_coef=$KL, kl_loss_type=low_var_kl (k3, capped)
#   --format_penalty (record's) -> medvqa.env.format_penalty=$FORMAT_PENALTY (a turn that neither calls nor answers)
#   clip 0.2/0.2, dual clip 3   -> actor.clip_ratio_low/high=0.2, clip_ratio_c=3 (verl's defaults)
#   token-mean                  -> actor.loss_agg_mode=token-mean
#   GRPO adv, unbiased std      -> algorithm.adv_estimator=grpo, norm_adv_by_std_in_grpo=true
#   --micro_batch 64            -> actor.ppo_micro_batch_size_per_gpu=min(64, BATCH*N) (one micro-batch per update)
#   --max_turns 1               -> medvqa.env.max_turns=1, multi_turn.max_assistant_turns=2, max_user_turns=1
#   --max_new_tokens 32         -> medvqa.max_action_length=32 (per turn)
#   --tools ground=trained      -> medvqa.env.tools.ground.engine=trained (the same cached model)
#   --tool-opt ground.seed=k%3  -> medvqa.env.tools.ground.seed=k%3, .content_hash=<the record's hash>
#   --dataset embedded, n=800   -> medvqa.env.dataset=embedded, medvqa.env.dataset_options.n=800
#   --answer_types CLOSED       -> the parquet holds the CLOSED questions only (all of train)
#   reward (default: rule +-1)  -> the env's default reward, as the native one
#   the saved demo prompt       -> medvqa.checkpoint_settings=true (the warm start's medvqa_run.json:
#                                  its system prompt, images thumbnailed to its encoder's 224 px)
#   --eval_split test, --eval_size 200, --eval_every 5, greedy
#                               -> val parquet = the first $EVAL CLOSED test questions, trainer.test_freq=5,
#                                  val_before_train=true, val_kwargs greedy (temperature 0, 32 tokens a turn)
#   every held-out answer       -> medvqa.episode_log_dir (one line per episode, validation ones flagged)
#   --seed S                    -> data.seed=S (question order), rollout.seed=S (vLLM's sampling)
# Cannot be mapped: the native --seed also seeds torch (its sampling on CPU); verl's sampling is vLLM's,
# so seed S here is not the native seed S's sequence of questions or samples. The native held-out
# evaluation also runs image ablations (blank, shuffle) at the end; verl's validation has none.
set -euo pipefail
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
PY=${PY:-.venv-verl/bin/python}
RECORD=${RECORD:-benchmarks/runs/protocol/closed/protocol.json}
NATIVE=${NATIVE:-runs/protocol/closed}
B=${B:-runs/protocol/closed_verl}
D=${D:-$(dirname "$RECORD")_verl}  # beside the record: bench_learning_protocol.py pairs <setting>_verl with <setting>
SEEDS=${SEEDS:-0 1 2 3 4}
STEPS=${STEPS:-30}
BATCH=${BATCH:-8}
N=${N:-8}
EVAL=${EVAL:-200}
MICRO=$(( BATCH * N < 64 ? BATCH * N : 64 ))  # verl wants the batch divisible by it
# the record's own settings (what its native GRPO runs were given): BUILDS FORMAT_PENALTY KL LR TEMPERATURE
SETTINGS=$($PY - "$RECORD" <<'EOF'
import json, sys
from pathlib import Path
from train.protocol import recorded_args
a = recorded_args(json.load(open(sys.argv[1]))["args"], Path(sys.argv[1]).parent)
print(a.tool_builds, a.format_penalty, a.kl_coef, a.grpo_lr, a.temperature)
EOF
)
read -r BUILDS FORMAT_PENALTY KL LR TEMPERATURE <<< "$SETTINGS"
build_of() {  # the tool build (and warm start) of seed $1, as train.protocol.build_of: its own with tool_builds 0
  if (( BUILDS > 0 )); then echo $(( $1 % BUILDS )); else echo "$1"; fi
}
DRY_RUN=${DRY_RUN:-0}
if [[ $DRY_RUN != 1 ]]; then
  mkdir -p "$B" "$D"
  B=$(cd "$B" && pwd)
fi
identity() {  # identity tools|warm BUILD: the record's ground-tool hash / warm-start checkpoint
  $PY - "$RECORD" "$1" "$2" <<'EOF'
import json, sys
ident, kind, build = json.load(open(sys.argv[1]))["identity"], sys.argv[2], sys.argv[3]
if kind == "tools":
    print(ident["tools"]["ground"][build]["content_hash"])
else:
    print(ident["warm_starts"][build]["checkpoint"])
EOF
}

verl_argv() {  # verl_argv SEED BUILD OUT: one seed's train.verl_integration.launch arguments, in ARGV
  local seed=$1 build=$2 out=$3
  ARGV=(
    --device cpu --output-dir "$out"
    --train-files "$B/data/train.parquet" --val-files "$B/data/val.parquet"
    actor_rollout_ref.model.path="$B/policy_b$build" medvqa.checkpoint_settings=true
    medvqa.env.dataset=embedded medvqa.env.dataset_options.n=800 medvqa.env.tools.ground.engine=trained
    medvqa.env.tools.ground.seed="$build" "medvqa.env.tools.ground.content_hash='$(identity tools "$build")'"
    medvqa.env.max_turns=1 medvqa.env.format_penalty="$FORMAT_PENALTY" actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2
    actor_rollout_ref.rollout.multi_turn.max_user_turns=1 medvqa.max_action_length=32 medvqa.max_obs_length=256
    data.max_prompt_length=1024 data.max_response_length=512 actor_rollout_ref.rollout.max_model_len=1600
    data.train_batch_size="$BATCH" actor_rollout_ref.rollout.n="$N" actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH"
    actor_rollout_ref.actor.ppo_epochs=1 actor_rollout_ref.rollout.temperature="$TEMPERATURE"
    actor_rollout_ref.rollout.val_kwargs.temperature=0 actor_rollout_ref.rollout.val_kwargs.do_sample=false
    actor_rollout_ref.actor.optim.lr="$LR" actor_rollout_ref.actor.optim.weight_decay=0
    actor_rollout_ref.actor.optim.clip_grad=1.0 actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0
    actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef="$KL"
    actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.loss_agg_mode=token-mean
    actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.2
    actor_rollout_ref.actor.clip_ratio_c=3.0 algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=true
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO"
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$MICRO"
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$MICRO"
    data.seed="$seed" actor_rollout_ref.rollout.seed="$seed"
    trainer.total_training_steps="$STEPS" trainer.total_epochs=100 'trainer.logger=[console,file]'
    trainer.save_freq=-1 trainer.test_freq=5 trainer.val_before_train=true
    trainer.default_local_dir="$out/checkpoints" medvqa.episode_log_dir="$out/episodes"
  )
}
if [[ $DRY_RUN == 1 ]]; then  # what every seed would be given, nothing run
  echo "record $RECORD: tool_builds=$BUILDS format_penalty=$FORMAT_PENALTY kl_coef=$KL grpo_lr=$LR temperature=$TEMPERATURE"
  for seed in $SEEDS; do
    verl_argv "$seed" "$(build_of "$seed")" "$B/verl_s$seed"
    printf 'seed %s:' "$seed"; printf ' %q' "${ARGV[@]}"; echo
  done
  exit 0
fi

# 1. each build's warm start, checked against the record, widened for vLLM-CPU (same logits). A record
# with policy_sha256 (train.checkpoint.policy_sha256) is checked by it; an older one names the whole
# folder's SHA-256, which moves with the trainer's wall time, so the rerun's SFT log (every step's loss,
# every held-out answer) must equal the committed one instead.
check_warm() {  # check_warm CHECKPOINT BUILD
  $PY - "$RECORD" "$NATIVE" "$1" "$2" <<'EOF'
import gzip, json, sys
from pathlib import Path
from train.checkpoint import policy_sha256
record, native, checkpoint, build = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
entry = json.loads(record.read_text())["identity"]["warm_starts"][build]
if "policy_sha256" in entry:
    got = policy_sha256(native / checkpoint)
    sys.exit(0 if got == entry["policy_sha256"] else f"error: {native / checkpoint}: policy SHA-256 {got}, "
             f"the record names {entry['policy_sha256']}")
run = checkpoint.split("/checkpoints/")[0]
steps = lambda p: [{k: v for k, v in json.loads(l).items() if not k.startswith("time/")} for l in open(p)]
same_log = steps(native / run / "metrics.jsonl") == steps(record.parent / run / "metrics.jsonl")
same_answers = (native / run / "heldout_answers.jsonl").read_bytes() == gzip.open(record.parent / run / "heldout_answers.jsonl.gz").read()
sys.exit(0 if same_log and same_answers else f"error: {native / run} is not the recorded warm start "
         f"(same losses: {same_log}, same held-out answers: {same_answers})")
EOF
}
for seed in $SEEDS; do
  build=$(build_of "$seed")
  policy=$B/policy_b$build
  [[ -f $policy/medvqa_widened.json ]] && continue
  checkpoint=$(identity warm "$build")
  check_warm "$checkpoint" "$build"
  $PY -m train.verl_integration.widen_heads --src "$NATIVE/$checkpoint" --out "$policy"
done

# 2. the data: every CLOSED training question; the first $EVAL CLOSED test questions (the native eval's)
if [[ ! -f $B/data/val.parquet ]]; then
  $PY - "$B/data" "$EVAL" <<'EOF'
import sys
from train.verl_integration.data import convert
env = {"dataset": "embedded", "dataset_options": {"n": 800}, "max_turns": 1,
       "tools": {"ground": {"backend": "local", "engine": "trained"}}}
convert(env, f"{sys.argv[1]}/train.parquet", split="train", image_mode="none", answer_types=["CLOSED"])
convert(env, f"{sys.argv[1]}/val.parquet", split="test", image_mode="none", answer_types=["CLOSED"], limit=int(sys.argv[2]))
EOF
fi

# 3. one verl run per seed, its CPU seconds sampled over every process it starts (Ray's included)
for seed in $SEEDS; do
  out=$B/verl_s$seed
  build=$(build_of "$seed")
  if [[ -f $out/cpu.json ]] && grep -q '"rc": 0' "$out/cpu.json"; then continue; fi
  rm -rf "$out"
  mkdir -p "$out"
  verl_argv "$seed" "$build" "$out"
  nice -n 5 $PY -m train.verl_integration.tree_cpu --out "$out/cpu.json" -- \
    $PY -m train.verl_integration.launch "${ARGV[@]}" \
    > "$out/launch.log" 2>&1 || { tail -40 "$out/launch.log"; exit 1; }
done

# 4. the small files (no weights) for the record
portable() {  # a record holds no absolute path of this machine: the checkout -> relative, /tmp -> <scratch>
  sed -e "s|$PWD/||g" -e "s|: $PWD\$|: .|" -e "s|/tmp/|<scratch>/|g" "$1"
}
for seed in $SEEDS; do
  build=$(build_of "$seed")
  portable "$B/policy_b$build/medvqa_widened.json" > "$D/medvqa_widened_b$build.json"
  cp "$B/policy_b$build/config.json" "$D/policy_config.json"
done
for seed in $SEEDS; do
  out=$B/verl_s$seed
  rm -rf "${D:?}/verl_s$seed"
  mkdir -p "$D/verl_s$seed/episodes"
  cp "$out/metrics.jsonl" "$out/cpu.json" "$D/verl_s$seed/"
  portable "$out/verl_config.yaml" > "$D/verl_s$seed/verl_config.yaml"
  portable "$out/run_record.json" > "$D/verl_s$seed/run_record.json"
  cat "$out"/episodes/*.jsonl | gzip -n > "$D/verl_s$seed/episodes/episodes.jsonl.gz"
  grep -v -E 'it/s\]|s/it\]' "$out/launch.log" | tail -400 > "$D/verl_s$seed/launch.log.tail"
done
