"""ARMed open-answer reward throughput against the strongest baseline: the same libraries, batched.

Workloads (1024 samples, scored in calls of 64 = 8 GRPO groups of 8): *GRPO groups* -- for each
VQA-RAD OPEN question (embedded fallback list when the data is absent) 8 candidates drawn from the
ground truth, its light paraphrases and other questions' answers, against the group's reference;
*all distinct* -- the same with every candidate made unique (no answer repeats to share).

Scorers, all computing BLEU-1, ROUGE-1, BERTScore F1 and cosine with all-MiniLM-L6-v2:

* **the same libraries, batched (baseline)**: per call ``BERTScorer.score(cands, refs,
  batch_size=64)`` (bert-score dedupes and length-sorts itself), ``SentenceTransformer.encode(cands
  + refs, batch_size=64)``, nltk ``sentence_bleu`` and rouge-score per pair;
* ``ARMedReward()(batch)`` with empty text caches and fresh threshold buffers;
* a naive per-sample loop (the libraries one completion at a time), on 128 samples, for scale;
* the floor: one plain MiniLM forward pass per distinct text (tokenised beforehand, length-sorted
  padded batches of 64) -- what any exact scorer has to pay at least once.

Baseline and ARMed alternate, repetition by repetition; rates come from the median (and best) of the
repetitions, wall-clock and CPU (one torch thread, so CPU time is what one dedicated core would
take). The run also checks that ARMed's four metrics equal the libraries' (max |difference|), and
times the phases of both scorers on the all-distinct workload.

    python benchmarks/bench_rewards.py [--quick] [--threads 1] [--reps 3]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import os
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from figures import record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)
from medvqa_env.records import AnswerType  # noqa: E402
from rewards.adaptive import AdaptiveThresholds  # noqa: E402
from rewards.armed import ARMedReward  # noqa: E402
from rewards.base import RewardInput  # noqa: E402
from rewards.validity import load_open_answers, paraphrases  # noqa: E402

VQA_RAD = Path(os.environ.get("MEDVQA_VQA_RAD", Path(__file__).resolve().parents[2] / "shared" / "data" / "vqa_rad"))
FALLBACK = ["left lung", "liver", "ct", "mri", "right kidney", "pneumothorax", "small bowel", "brain",
            "axial", "fracture", "spleen", "heart", "cyst", "mass in the pancreas", "t2 weighted", "aorta"]
CALL = 64


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


def all_distinct(batch: list[RewardInput]) -> list[RewardInput]:
    return [RewardInput(rf"\boxed{{{s.answer} {i}}}", f"{s.answer} {i}", s.ground_truth, s.answer_type)
            for i, s in enumerate(batch)]


class Libraries:
    """The four metrics from the libraries themselves, batched per call (the baseline)."""

    def __init__(self, path: str) -> None:
        from bert_score import BERTScorer
        from rouge_score import rouge_scorer
        from sentence_transformers import SentenceTransformer

        self.bert = BERTScorer(model_type=path, num_layers=6)
        self.st = SentenceTransformer(path)
        self.rouge = rouge_scorer.RougeScorer(["rouge1"])
        self.phases = {"bert-score": 0.0, "sentence-transformers": 0.0, "nltk + rouge-score": 0.0}

    def lexical(self, cands, refs):
        from nltk.translate.bleu_score import sentence_bleu

        bleu, rouge = [], []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for c, r in zip(cands, refs):
                ct, rt = self.rouge._tokenizer.tokenize(c), self.rouge._tokenizer.tokenize(r)
                bleu.append(float(sentence_bleu([rt], ct, weights=(1.0,))) if ct and rt else 0.0)
                rouge.append(self.rouge.score(r, c)["rouge1"].fmeasure)
        return bleu, rouge

    def __call__(self, batch):
        cands, refs = [s.answer for s in batch], [s.ground_truth for s in batch]
        t0 = time.perf_counter()
        f1 = self.bert.score(cands, refs, batch_size=CALL, verbose=False)[2].tolist()
        t1 = time.perf_counter()
        emb = self.st.encode(cands + refs, batch_size=CALL, normalize_embeddings=True, convert_to_numpy=True,
                             show_progress_bar=False)
        cos = (emb[: len(cands)] * emb[len(cands):]).sum(1).tolist()
        t2 = time.perf_counter()
        bleu, rouge = self.lexical(cands, refs)
        t3 = time.perf_counter()
        for k, v in zip(self.phases, (t1 - t0, t2 - t1, t3 - t2)):
            self.phases[k] += v
        return bleu, rouge, f1, cos


def naive(batch, libs: Libraries):
    out = []
    for s in batch:
        bleu, rouge = libs.lexical([s.answer], [s.ground_truth])
        f = float(libs.bert.score([s.answer], [s.ground_truth], verbose=False)[2][0])
        e = libs.st.encode([s.answer], normalize_embeddings=True)[0] @ libs.st.encode([s.ground_truth],
                                                                                     normalize_embeddings=True)[0]
        out.append((bleu[0], rouge[0], f, float(e)))
    return out


def floor(encoder, batch) -> None:
    """One plain padded forward per distinct text of ``batch`` (tokenised beforehand)."""
    import torch

    texts = list(dict.fromkeys([s.answer for s in batch] + [s.ground_truth for s in batch]))
    ids = sorted(encoder.tokenize(texts), key=len)
    batches = []
    for start in range(0, len(ids), CALL):
        chunk = ids[start:start + CALL]
        x = torch.zeros(len(chunk), len(chunk[-1]), dtype=torch.long)
        m = torch.zeros_like(x)
        for r, row in enumerate(chunk):
            x[r, : len(row)] = torch.tensor(row)
            m[r, : len(row)] = 1
        batches.append((x, m))
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for x, m in batches:
            encoder._model(input_ids=x, attention_mask=m)
    return time.perf_counter() - t0, time.process_time() - c0


def gemm_ceiling(encoder, batch, reps: int) -> dict[str, float]:
    """The physical limit: the encoder's matrix-product FLOPs for every distinct token of ``batch``
    divided by this core's fp32 matrix-product rate, measured on the FFN's shape (one call's tokens)."""
    import torch

    cfg = encoder._model.config
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    texts = list(dict.fromkeys([s.answer for s in batch] + [s.ground_truth for s in batch]))
    tokens = sum(len(t) for t in encoder.tokenize(texts))
    flops = tokens * 2 * (4 * h * h + 2 * h * i) * layers
    x, w = torch.randn(tokens * CALL // len(batch) * 9 // 8, h), torch.randn(i, h)
    with torch.inference_mode():
        torch.nn.functional.linear(x, w)
        best = float("inf")
        for _ in range(max(3, reps)):
            c0 = time.process_time()
            for _ in range(20):
                torch.nn.functional.linear(x, w)
            best = min(best, (time.process_time() - c0) / 20)
    rate = 2 * x.shape[0] * h * i / best
    return {"tokens": tokens, "gflop": flops / 1e9, "gemm_gflops": rate / 1e9, "seconds": flops / rate,
            "rate": len(batch) / (flops / rate)}


def run_armed(reward: ARMedReward, data):
    reward.thresholds = AdaptiveThresholds()  # fresh buffers
    reward._token_encoder.clear_cache()  # cold text cache: references are encoded again
    out = []
    for start in range(0, len(data), CALL):
        out += reward(data[start:start + CALL])
    return out


def run_libraries(libs: Libraries, data):
    out = []
    for start in range(0, len(data), CALL):
        out.append(libs(data[start:start + CALL]))
    return out


def timed(fn, *args):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - t0, time.process_time() - c0


def armed_phases(reward: ARMedReward, data) -> dict[str, float]:
    """ARMed's steps, one at a time, on ``data`` in calls of 64 (cold caches): seconds per phase."""
    from rewards.encoders import bertscore_f1, cosine
    from rewards.text_metrics import _counts, lexical_scores, tokenize

    enc = reward._token_encoder
    enc.clear_cache()
    tokenize.cache_clear(), _counts.cache_clear()
    phases = dict.fromkeys(["tokenise (one fast-tokenizer call)", "MiniLM forward, packed",
                            "pooling, normalising, weights", "BERTScore matching + cosine",
                            "BLEU-1 + ROUGE-1"], 0.0)
    seen: set[str] = set()
    for start in range(0, len(data), CALL):
        part = data[start:start + CALL]
        cands, refs = [s.answer for s in part], [s.ground_truth for s in part]
        t0 = time.perf_counter()
        lexical_scores(cands, refs)
        t1 = time.perf_counter()
        todo = [t for t in dict.fromkeys(cands + refs) if t not in seen]
        seen.update(todo)
        ids = enc.tokenize(todo)
        t2 = time.perf_counter()
        enc._packed(ids)
        t3 = time.perf_counter()
        encoded = enc._forward(todo)  # tokenise + forward + post-processing
        t4 = time.perf_counter()
        by_text = dict(zip(todo, encoded))
        for c, r in zip(cands, refs):
            if c in by_text and r in by_text:
                bertscore_f1(by_text[c], by_text[r]), cosine(by_text[c].sentence, by_text[r].sentence)
        t5 = time.perf_counter()
        phases["BLEU-1 + ROUGE-1"] += t1 - t0
        phases["tokenise (one fast-tokenizer call)"] += t2 - t1
        phases["MiniLM forward, packed"] += t3 - t2
        phases["pooling, normalising, weights"] += max(0.0, (t4 - t3) - (t3 - t1))
        phases["BERTScore matching + cosine"] += t5 - t4
    return phases


def main(argv: list[str] | None = None) -> str:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small run (smoke test)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads for every scorer (default 1: on a shared 2-core machine two "
                        "OpenMP threads collapse; 0 = torch's own choice)")
    p.add_argument("--reps", type=int, default=None, help="repetitions of each timed row (default 3; 1 quick)")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                   "none with --quick)")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from rewards.encoders import default_model_path

    groups, naive_n = (16, 16) if args.quick else (128, 128)
    reps = args.reps or (1 if args.quick else 3)
    grpo = workload(groups)
    data = {"grpo": grpo, "distinct": all_distinct(grpo)}
    libs = Libraries(default_model_path())
    reward = ARMedReward()
    warm = workload(2, seed=99)
    reward(warm), libs(warm)  # load models and code paths; timed runs start from empty caches

    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    outputs = {}
    for rep in range(reps):
        for w, batch in data.items():
            runners = [("libraries", lambda b=batch: run_libraries(libs, b)), ("armed", lambda b=batch: run_armed(reward, b))]
            for name, fn in (runners if rep % 2 == 0 else runners[::-1]):
                out, wall, cpu = timed(fn)
                times.setdefault((w, name), []).append((wall, cpu))
                outputs[(w, name)] = out
    for w, batch in data.items():
        times[(w, "floor")] = [floor(reward._token_encoder, batch) for _ in range(reps)]
    naive_out, naive_wall, naive_cpu = timed(naive, grpo[:naive_n], libs)
    ceiling = {w: gemm_ceiling(reward._token_encoder, batch, reps) for w, batch in data.items()}

    # agreement: with the libraries one pair at a time (the definition), and with their batched output
    keys = ("bleu1", "rouge1", "bertscore", "cosine")
    diff = {k: max(abs(a.components[k] - b[i]) for a, b in zip(outputs[("grpo", "armed")], naive_out))
            for i, k in enumerate(keys)}
    lib_out = [v for call in outputs[("distinct", "libraries")] for v in zip(*call)]
    diff_batched = {k: max(abs(a.components[k] - b[i]) for a, b in zip(outputs[("distinct", "armed")], lib_out))
                    for i, k in enumerate(keys)}

    libs.phases = dict.fromkeys(libs.phases, 0.0)
    run_libraries(libs, data["distinct"])
    lib_phases = dict(libs.phases)
    phases = armed_phases(reward, data["distinct"])
    _, armed_total, _ = timed(run_armed, reward, data["distinct"])

    n = len(grpo)
    med = statistics.median
    figures: dict[str, float] = {"samples": n, "reps": reps, "threads": torch.get_num_threads(),
                                 "naive.rate": naive_n / naive_wall, "naive.cpu_rate": naive_n / naive_cpu}
    for (w, name), ts in times.items():
        walls, cpus = [t[0] for t in ts], [t[1] for t in ts]
        figures[f"{w}.{name}.rate"] = n / med(walls)
        figures[f"{w}.{name}.rate_best"] = n / min(walls)
        figures[f"{w}.{name}.cpu_rate"] = n / med(cpus)
    for w in data:
        figures[f"{w}.rate"] = figures[f"{w}.armed.rate"]
        figures[f"{w}.vs_batched_libraries"] = figures[f"{w}.armed.rate"] / figures[f"{w}.libraries.rate"]
        figures[f"{w}.vs_batched_libraries_cpu"] = figures[f"{w}.armed.cpu_rate"] / figures[f"{w}.libraries.cpu_rate"]
        figures[f"{w}.vs_naive"] = figures[f"{w}.armed.rate"] / figures["naive.rate"]
        figures[f"{w}.floor_share"] = figures[f"{w}.armed.cpu_rate"] / figures[f"{w}.floor.cpu_rate"]
    for w, c in ceiling.items():
        figures.update({f"{w}.ceiling.{k}": v for k, v in c.items()})
    figures.update({f"max_diff.{k}": v for k, v in diff.items()})
    figures.update({f"max_diff_batched.{k}": v for k, v in diff_batched.items()})
    distinct_texts = {w: len({s.answer for s in b} | {s.ground_truth for s in b}) for w, b in data.items()}

    cmd = (f"python benchmarks/bench_rewards.py{' --quick' if args.quick else ''}"
           f"{f' --threads {args.threads}' if args.threads else ''}")
    lines = ["## Rewards: ARMed open-answer throughput against the same libraries, batched", "",
             f"`{cmd}` -- {torch.get_num_threads()} torch thread(s), all-MiniLM-L6-v2 for BERTScore and cosine in "
             f"every scorer; {n} samples per workload in calls of {CALL} (GRPO groups: {distinct_texts['grpo']} distinct "
             f"texts; all distinct: {distinct_texts['distinct']}). Median (best) of {reps} repetitions, baseline and "
             "ARMed alternating; *CPU* rates divide by the process's CPU seconds (one thread: what one dedicated core "
             "gives).", "",
             "| workload | scorer | rewards/s wall, median (best) | rewards/s per CPU-second | ratio to batched libraries (wall / CPU) |",
             "|---|---|---:|---:|---:|"]
    labels = {"libraries": "the same libraries, batched (**baseline**)", "armed": "**ARMedReward**",
              "floor": "floor: one plain MiniLM forward per distinct text"}
    for w, title in (("distinct", "all distinct"), ("grpo", "GRPO groups")):
        for name in ("libraries", "armed", "floor"):
            f = lambda k: figures[f"{w}.{name}.{k}"]  # noqa: E731
            ratio = (f"**{figures[f'{w}.vs_batched_libraries']:.2f}× / {figures[f'{w}.vs_batched_libraries_cpu']:.2f}×**"
                     if name == "armed" else ("1.00× / 1.00×" if name == "libraries" else "(no metrics)"))
            lines.append(f"| {title} | {labels[name]} | {f('rate'):.0f} ({f('rate_best'):.0f}) | {f('cpu_rate'):.0f} | {ratio} |")
    lines.append(f"| GRPO groups | naive per-sample loop ({naive_n} samples) | {figures['naive.rate']:.1f} | "
                 f"{figures['naive.cpu_rate']:.1f} | |")
    c = ceiling["distinct"]
    lines += ["", f"**Physical limit** (all distinct): {c['tokens']} distinct tokens × "
              f"{c['gflop'] * 1e9 / c['tokens'] / 1e6:.1f} MFLOP of matrix products each = {c['gflop']:.0f} GFLOP; "
              f"this core multiplies fp32 matrices of that shape at {c['gemm_gflops']:.0f} GFLOP/s (best of "
              f"{max(3, reps)}), so no exact fp32 scorer on one thread exceeds **{c['rate']:.0f} rewards/s** here "
              f"(matrix products alone, {c['seconds']:.2f} s). ARMed reaches "
              f"{100 * figures['distinct.armed.cpu_rate'] / c['rate']:.0f}% of it per CPU-second."]
    figures["distinct.ceiling_share"] = figures["distinct.armed.cpu_rate"] / c["rate"]
    figures["distinct.goal_600_share_of_ceiling"] = 600 / c["rate"]
    lines += ["", f"Agreement, max |difference| of ARMed's metrics from the libraries called one pair at a time "
              f"({naive_n} GRPO samples): " + ", ".join(f"{k} {v:.1e}" for k, v in diff.items())
              + "; from the batched libraries (all distinct): " + ", ".join(f"{k} {v:.1e}" for k, v in diff_batched.items())
              + ". bert-score's batched path multiplies padded similarities by 0, so for unrelated answers (every "
              "true similarity negative) a padding zero can win the greedy max: its batched scores then exceed its "
              "own one-pair scores; ARMed follows the one-pair definition.", "",
              "Where the time goes on the all-distinct workload (seconds for all 1024 samples, each phase timed "
              "on its own):", "",
              "| ARMedReward phase | s | | baseline phase | s |", "|---|---:|---|---|---:|"]
    a_rows = list(phases.items()) + [("whole reward (timed separately)", armed_total)]
    b_rows = list(lib_phases.items()) + [("", None)] * (len(a_rows) - len(lib_phases))
    for (a, av), (b, bv) in zip(a_rows, b_rows):
        lines.append(f"| {a} | {av:.3f} | | {b} | {'' if bv is None else f'{bv:.3f}'} |")
    figures.update({f"phase.armed.{i}": v for i, v in enumerate(phases.values())})
    figures.update({f"phase.libraries.{i}": v for i, v in enumerate(lib_phases.values())})
    lines += ["", f"Load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (the machine is "
              "shared: wall-clock rates are a floor, CPU rates and same-run ratios are steadier)."]
    text = "\n".join(lines) + "\n"
    record("rewards", text, figures, cmd, results_dir_arg(args.quick, args.results))
    return text


if __name__ == "__main__":
    main()
