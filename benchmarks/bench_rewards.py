"""ARMed open-answer reward throughput: the batched reward vs a naive per-sample loop.

Workload: GRPO-like groups -- for each VQA-RAD OPEN question (embedded fallback list when the data
is absent) a group of 8 candidates drawn from the ground truth, its light paraphrases and other
questions' answers, scored against the group's reference. Both sides compute the same four metrics
with the same models (all-MiniLM-L6-v2): the naive side calls the libraries one completion at a
time (nltk BLEU-1, rouge-score, ``bert_score.BERTScorer.score([c], [r])``,
``SentenceTransformer.encode`` of candidate and reference); the batched side is
``ARMedReward()(batch)`` with empty text caches and fresh threshold buffers, models loaded beforehand on
both sides. A third row makes every candidate text unique (no reuse of identical answers).

    python benchmarks/bench_rewards.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from medvqa_env.records import AnswerType  # noqa: E402
from rewards.adaptive import AdaptiveThresholds  # noqa: E402
from rewards.armed import ARMedReward  # noqa: E402
from rewards.base import RewardInput  # noqa: E402
from rewards.validity import load_open_answers, paraphrases  # noqa: E402

VQA_RAD = Path(os.environ.get("MEDVQA_VQA_RAD", Path(__file__).resolve().parents[2] / "shared" / "data" / "vqa_rad"))
FALLBACK = ["left lung", "liver", "ct", "mri", "right kidney", "pneumothorax", "small bowel", "brain",
            "axial", "fracture", "spleen", "heart", "cyst", "mass in the pancreas", "t2 weighted", "aorta"]


def workload(groups: int, group_size: int = 8, seed: int = 0) -> list[RewardInput]:
    if (VQA_RAD / "qa.jsonl").is_file():
        refs = [a for _, a in load_open_answers(VQA_RAD, None)]
    else:
        refs = FALLBACK
    rng = random.Random(seed)
    batch = []
    for g in range(groups):
        ref = refs[g % len(refs)]
        pool = [ref, *sorted(paraphrases(ref)), *rng.sample(refs, min(6, len(refs)))]
        for _ in range(group_size):
            cand = rng.choice(pool)
            batch.append(RewardInput(rf"\boxed{{{cand}}}", cand, ref, AnswerType.OPEN))
    return batch


def naive_scores(batch, scorer, st):
    from nltk.translate.bleu_score import sentence_bleu
    from rouge_score import rouge_scorer

    rouge = rouge_scorer.RougeScorer(["rouge1"])
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in batch:
            c, r = s.answer, s.ground_truth
            b = sentence_bleu([r.lower().split()], c.lower().split(), weights=(1.0,))
            r1 = rouge.score(r, c)["rouge1"].fmeasure
            f = float(scorer.score([c], [r], verbose=False)[2][0])
            e = st.encode([c], normalize_embeddings=True)[0] @ st.encode([r], normalize_embeddings=True)[0]
            out.append((b, r1, f, float(e)))
    return out


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small run (smoke test)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads for both sides (default 1: on a shared 2-core machine two "
                        "OpenMP threads collapse; 0 = torch's own choice)")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from bert_score import BERTScorer
    from sentence_transformers import SentenceTransformer

    from rewards.encoders import default_model_path

    groups, naive_n = (16, 32) if args.quick else (128, 128)
    batch = workload(groups)
    unique = [RewardInput(rf"\boxed{{{s.answer} {i}}}", f"{s.answer} {i}", s.ground_truth, s.answer_type)
              for i, s in enumerate(batch)]

    path = default_model_path()
    scorer = BERTScorer(model_type=path, num_layers=6)
    st = SentenceTransformer(path)
    warm = ARMedReward()
    warm(workload(2, seed=99))  # load code paths once; timed runs start from empty caches

    rows = []
    t, cpu = time.perf_counter(), time.process_time()
    naive_scores(batch[:naive_n], scorer, st)
    naive_rate = naive_n / (time.perf_counter() - t)
    rows.append(("naive per-sample loop (libraries, one completion at a time)", naive_n, naive_rate,
                 naive_n / (time.process_time() - cpu)))

    for label, data in (("ARMedReward batched, GRPO groups (fresh caches)", batch),
                        ("ARMedReward batched, every candidate unique", unique)):
        reward = warm
        reward.thresholds = AdaptiveThresholds()  # fresh buffers
        reward._token_encoder.clear_cache()  # cold text cache: references are encoded again
        t, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(data), 64):  # 8 groups of 8 per reward call
            reward(data[start:start + 64])
        rows.append((label, len(data), len(data) / (time.perf_counter() - t), len(data) / (time.process_time() - cpu)))

    distinct = len({s.answer for s in batch} | {s.ground_truth for s in batch})
    lines = ["## Rewards: ARMed open-answer throughput", "",
             f"`python benchmarks/bench_rewards.py{' --quick' if args.quick else ''}"
             f"{f' --threads {args.threads}' if args.threads else ''}` -- "
             f"{torch.get_num_threads()} torch threads, all-MiniLM-L6-v2 for BERTScore and cosine on both sides; "
             f"workload {len(batch)} samples in groups of 8 ({distinct} distinct texts), calls of 64.", "",
             "| scorer | samples | rewards/s (wall) | vs naive | rewards per CPU-second |",
             "| --- | --- | --- | --- | --- |"]
    for label, n, rate, per_cpu in rows:
        lines.append(f"| {label} | {n} | {rate:.1f} | {rate / naive_rate:.1f}x | {per_cpu:.1f} |")
    lines += ["", f"Load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
              "(the machine is shared with other jobs, so wall-clock rates are a floor; rewards per CPU-second is "
              "what one dedicated core would give with --threads 1)."]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
