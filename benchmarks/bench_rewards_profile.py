"""Where ARMed's open-answer reward spends its time beyond the one-thread fp32 ceiling (a profile).

``benchmarks/bench_rewards.py`` measures ARMed's rate against the *ceiling*: the encoder's matrix
products for every distinct token at this core's best fp32 rate on the FFN's shape (no exact fp32
scorer can beat it). This script accounts for the gap on the same all-distinct workload (1024
samples in calls of 64, one torch thread, cold caches), in one run:

* ARMed's CPU seconds (median of ``--reps``) and the ceiling's, measured side by side;
* the matrix products again at each of the model's own four shapes (fused QKV, attention output,
  FFN in, FFN out; one call's tokens): what the GEMMs cost at the sizes the model has;
* ``torch.profiler`` over one reward run: self CPU time per operator, grouped (matrix products,
  GELU, LayerNorm, attention, copies and element-wise adds, embedding lookups, other operators),
  and the rest of the process's CPU time outside any torch operator (tokenising, the per-group
  Python loop, pooling, BLEU/ROUGE, bookkeeping). The profiler adds its own overhead, so its
  seconds are read as shares of the profiled run's wall time and applied to the unprofiled CPU seconds.

    python benchmarks/bench_rewards_profile.py [--quick] [--reps 3]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_rewards import CALL, all_distinct, gemm_ceiling, run_armed, workload  # noqa: E402
from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

GROUPS = {  # operator name (prefix) -> group
    "aten::addmm": "matrix products", "aten::mm": "matrix products", "aten::bmm": "matrix products",
    "aten::linear": "matrix products", "mkldnn": "matrix products",
    "aten::gelu": "GELU", "aten::native_layer_norm": "LayerNorm", "aten::layer_norm": "LayerNorm",
    "aten::_scaled_dot_product": "attention (QKᵀ, softmax, AV)", "aten::scaled_dot_product": "attention (QKᵀ, softmax, AV)",
    "aten::_softmax": "attention (QKᵀ, softmax, AV)",
    "aten::copy_": "copies and element-wise adds", "aten::add": "copies and element-wise adds",
    "aten::cat": "copies and element-wise adds", "aten::clone": "copies and element-wise adds",
    "aten::contiguous": "copies and element-wise adds", "aten::index_put": "copies and element-wise adds",
    "aten::embedding": "embedding lookups", "aten::index_select": "embedding lookups",
}
ORDER = ["matrix products", "GELU", "LayerNorm", "attention (QKᵀ, softmax, AV)", "copies and element-wise adds",
         "embedding lookups", "other torch operators"]


def group_of(name: str) -> str:
    for prefix, group in GROUPS.items():
        if name.startswith(prefix):
            return group
    return "other torch operators"


def gemm_at_model_shapes(encoder, tokens: int, calls: int, reps: int) -> float:
    """CPU seconds of the encoder's matrix products at its own shapes for ``tokens`` tokens split
    into ``calls`` equal calls (best of ``reps``)."""
    import torch

    cfg = encoder._model.config
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    t = max(1, tokens // calls)
    shapes = [(h, 3 * h), (h, h), (h, i), (i, h)]  # (in, out): QKV fused, attention out, FFN in, FFN out
    total = 0.0
    with torch.inference_mode():
        for d_in, d_out in shapes:
            x, w, b = torch.randn(t, d_in), torch.randn(d_out, d_in), torch.randn(d_out)
            torch.nn.functional.linear(x, w, b)
            best = float("inf")
            for _ in range(max(3, reps)):
                c0 = time.process_time()
                for _ in range(20):
                    torch.nn.functional.linear(x, w, b)
                best = min(best, (time.process_time() - c0) / 20)
            total += best * calls * layers
    return total


def profile_run(reward, data) -> tuple[dict[str, float], float]:
    """Seconds per operator group over one reward run (the profiler's self time of each operator:
    wall time inside it), and the run's wall seconds (the rest is outside any torch operator)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        run_armed(reward, data)
        wall = time.perf_counter() - t0
    groups = dict.fromkeys(ORDER, 0.0)
    for event in prof.key_averages():
        groups[group_of(event.key)] += event.self_cpu_time_total / 1e6
    return groups, wall


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="16 groups, 1 repetition, nothing recorded")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = p.parse_args(argv)
    import torch

    from rewards.armed import ARMedReward

    torch.set_num_threads(1)
    reps = 1 if args.quick else args.reps
    data = all_distinct(workload(16 if args.quick else 128))
    reward = ARMedReward()
    reward(workload(2, seed=99))  # load the models; timed runs start from empty caches
    cpu_runs, ceilings = [], []
    for _ in range(reps):  # ARMed and the ceiling side by side, repetition by repetition
        c0 = time.process_time()
        run_armed(reward, data)
        cpu_runs.append(time.process_time() - c0)
        ceilings.append(gemm_ceiling(reward._token_encoder, data, 1))
    armed_cpu = statistics.median(cpu_runs)
    ceiling = min(ceilings, key=lambda c: c["seconds"])  # the best GEMM rate seen: the hardest limit
    shapes_s = gemm_at_model_shapes(reward._token_encoder, ceiling["tokens"], len(data) // CALL, reps)
    groups, profiled_wall = profile_run(reward, data)
    outside = max(0.0, profiled_wall - sum(groups.values()))
    scale = armed_cpu / profiled_wall  # the profiled run's shares, applied to the unprofiled CPU seconds

    n = len(data)
    figures = {"samples": n, "reps": reps, "armed.cpu_s": armed_cpu, "armed.cpu_rate": n / armed_cpu,
               "ceiling.seconds": ceiling["seconds"], "ceiling.rate": ceiling["rate"],
               "ceiling.gemm_gflops": ceiling["gemm_gflops"], "share_of_ceiling": ceiling["seconds"] / armed_cpu,
               "gemm_model_shapes_s": shapes_s, "profiled_wall_s": profiled_wall}
    lines = ["## Rewards: where the time goes beyond the one-thread fp32 ceiling (`benchmarks/bench_rewards_profile.py`)",
             "", f"`{command_line('bench_rewards_profile.py', argv)}` -- ARMed on the all-distinct workload ({n} samples, "
             f"calls of {CALL}, one torch thread, cold caches), median CPU seconds of {reps} runs; the ceiling measured "
             "alongside (the encoder's matrix-product FLOPs for every distinct token at this core's best fp32 rate on "
             "the FFN's shape, as in `bench_rewards.py`).", "",
             "| what | CPU s | rewards per CPU-second | share of the ceiling |", "|---|---:|---:|---:|",
             f"| ceiling: matrix products only, at the best shape's rate | {ceiling['seconds']:.3f} | "
             f"{ceiling['rate']:.0f} | 100 % |",
             f"| the same matrix products at the model's own four shapes | {shapes_s:.3f} | {n / shapes_s:.0f} | "
             f"{ceiling['seconds'] / shapes_s:.0%} |",
             f"| **ARMedReward** | {armed_cpu:.3f} | {n / armed_cpu:.0f} | **{ceiling['seconds'] / armed_cpu:.0%}** |",
             "", "Profile of one more run (`torch.profiler`: time inside each operator, grouped, and the rest of "
             f"the run's wall time outside any; each part's share of that run applied to ARMed's CPU seconds above, "
             f"so that the profiler's overhead and other jobs' preemption drop out; factor {scale:.2f}):", "",
             "| part | CPU s | share of ARMed's time |", "|---|---:|---:|"]
    for name in ORDER:
        s = groups[name] * scale
        figures[f"profile.{name.split(' ')[0].lower()}_s"] = s
        lines.append(f"| {name} | {s:.3f} | {s / armed_cpu:.0%} |")
    lines.append(f"| outside torch operators (tokenising, per-group Python loop, pooling, BLEU/ROUGE, bookkeeping) | "
                 f"{outside * scale:.3f} | {outside * scale / armed_cpu:.0%} |")
    figures["profile.outside_ops_s"] = outside * scale
    gemm_s = groups["matrix products"] * scale
    rest = armed_cpu - gemm_s
    forward_ops = sum(groups[k] for k in ORDER[1:]) * scale  # the forward's other operators
    budget = ceiling["seconds"] / 0.9 - gemm_s
    lines += ["", f"Reading: the matrix products take {gemm_s:.2f} s of ARMed's {armed_cpu:.2f} s ({gemm_s / armed_cpu:.0%}); "
              f"alone, at the model's own shapes, they take {shapes_s:.2f} s (the ceiling counts them all at the FFN "
              f"shape's best rate: {ceiling['seconds']:.2f} s). 90 % of the ceiling is {ceiling['seconds'] / 0.9:.2f} s "
              f"in all, which leaves {budget:.2f} s beside the products as they run here; the exact fp32 forward's "
              f"other operators alone (GELU over the 1536-wide FFN, LayerNorms, attention, residual adds) take "
              f"{forward_ops:.2f} s, and the work around the forward (tokenising, per-group loop, pooling, BLEU/ROUGE) "
              f"{outside * scale:.2f} s. Without approximating the model (bf16/int8 products, a tanh GELU) the rest "
              "cannot fit in that budget.", ""]
    figures["budget_beside_gemm_s"] = budget
    figures["forward_other_ops_s"] = forward_ops
    figures["rest_beyond_gemm_s"] = rest
    record("rewards_profile", "\n".join(lines), figures, command_line("bench_rewards_profile.py", argv),
           results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
