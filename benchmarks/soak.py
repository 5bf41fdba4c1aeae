"""Soak: hours-long behaviour in minutes. A vectorised rollout and background load clients run
against a real tool server through a real router while the server is killed, stalled and
restarted on a schedule. Nothing may crash or hang; memory and file descriptors must stay flat.

    python benchmarks/soak.py [--quick] [--minutes 10] [--envs 4] [--clients 4] [--fault-every 20]

Reported: episodes and tool calls completed, tool errors by kind (only expected ones: timeouts and
unreachable server during faults), unexpected exceptions (goal 0), and RSS / open file descriptors
of this process, the server and the router, sampled each fault period (goal: no upward trend).
The baseline is the first fault-free period of the same run.
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import collections
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load import ServerProcess, http_caller, run_load, test_image  # noqa: E402
from figures import record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

MiB = 1024 * 1024


def _kind(error: str | None) -> str:
    if not error:
        return "ok"
    for key in ("timed out", "could not reach", "answered 50", "refused"):
        if key in error:
            return key
    return "tool: " + error[:40]


def _usage(proc=None) -> tuple[float, int]:
    import psutil

    p = psutil.Process(proc.pid) if proc is not None else psutil.Process()
    return p.memory_info().rss / MiB, p.num_fds()


def soak(minutes: float, envs: int, clients: int, fault_every: float, timeout_s: float) -> dict:
    import gymnasium as gym

    import medvqa_env  # noqa: F401

    image = test_image(128)
    server = ServerProcess("serve", ["--tools", "segment,image_zoom_in", "--cache-size", "256"]).start()
    upstream = f"segment={server.url},image_zoom_in={server.url}"
    router = ServerProcess("router", ["--upstream", upstream, "--wait-s", "30", "--timeout-s", str(timeout_s)]).start()
    tools = {"segment": {"url": router.url, "timeout_s": timeout_s + 2, "retries": 2}, "image_zoom_in": "local"}
    venv = gym.make_vec("MedVQA-v0", envs, backend="process", workers=envs, group_size=1, dataset="embedded",
                        tools=tools, reward="rule", max_turns=2)  # one copy per worker process
    stats = collections.Counter()
    unexpected: list[str] = []
    samples: list[dict] = []
    stop = threading.Event()

    def background_load() -> None:  # clients that hammer the router meanwhile
        while not stop.is_set():
            r = run_load(http_caller(router.url, image, timeout_s=timeout_s + 2), clients, 2.0, image,
                         seed=random.randrange(10 ** 6))
            stats["load_calls"] += r.calls
            stats["load_errors"] += r.errors

    loader = threading.Thread(target=background_load, daemon=True)
    loader.start()
    rng = random.Random(0)
    schedule = ["none", "kill", "none", "stall", "none", "kill_restart_slow"]
    t_end = time.monotonic() + minutes * 60
    period = 0
    try:
        venv.reset(seed=list(range(envs)))
        while time.monotonic() < t_end:
            fault = schedule[period % len(schedule)]
            period += 1
            if fault == "kill":
                server.kill()
                threading.Timer(fault_every / 3, lambda: server.start()).start()
            elif fault == "stall":
                server.stall()
                threading.Timer(fault_every / 3, server.resume).start()
            elif fault == "kill_restart_slow":
                server.kill()
                threading.Timer(fault_every * 2 / 3, lambda: server.start()).start()
            t_period = time.monotonic() + fault_every
            while time.monotonic() < t_period:
                x, y = rng.randrange(60), rng.randrange(60)
                call = {"name": "segment", "arguments": {"bbox": [x, y, x + 40, y + 40]}}
                try:
                    _, _, _, _, info = venv.step([f"<tool_call>{json.dumps(call)}</tool_call>"] * envs)
                    for i in range(envs):
                        entries = info["final_info"]["tool_calls"][i] if info.get("_final_info", [False] * envs)[i] \
                            else info["tool_calls"][i]
                        for e in entries:
                            stats["tool_" + _kind(e["error"])] += 1
                    _, _, term, trunc, _ = venv.step(["\\boxed{yes}"] * envs)
                    stats["episodes"] += int(term.sum() + trunc.sum())
                except Exception as e:  # the point of the soak: there should be none
                    unexpected.append(f"{type(e).__name__}: {e}"[:300])
                    venv.reset(seed=list(range(envs)))
            while server.proc.poll() is not None or not _healthy(server):
                time.sleep(0.2)  # a restart may still be under way; sample a live server
            me, srv, rt, workers = _usage(), _usage(server), _usage(router), _workers_rss(server, router)
            samples.append({"t": round(minutes * 60 - (t_end - time.monotonic())), "fault": fault,
                            "client_rss": me[0], "client_fds": me[1], "workers_rss": workers,
                            "server_rss": srv[0], "server_fds": srv[1],
                            "router_rss": rt[0], "router_fds": rt[1], "episodes": stats["episodes"]})
    finally:
        stop.set()
        loader.join(30)
        venv.close()
        router.close()
        server.close()
    return {"stats": dict(stats), "unexpected": unexpected, "samples": samples}


def _workers_rss(*servers: ServerProcess) -> float:
    """RSS of the vector env's worker processes (this process's children that are not servers)."""
    import psutil

    skip = {s.pid for s in servers}
    total = 0
    for child in psutil.Process().children(recursive=False):
        if child.pid not in skip:
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
    return total / MiB


def _healthy(server: ServerProcess) -> bool:
    import httpx

    try:
        return httpx.get(server.url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def to_markdown(result: dict, command: str, minutes: float) -> str:
    s, samples = result["stats"], result["samples"]
    tool_total = sum(v for k, v in s.items() if k.startswith("tool_"))
    lines = ["## Soak: rollouts and load through a router while the tool server is killed and stalled", "",
             f"`{command}`", "",
             f"{minutes:g} min; schedule per period: none, kill (restart after 1/3), none, SIGSTOP (SIGCONT after 1/3), "
             "none, kill (restart after 2/3).", "",
             "| what | count |", "|---|---:|",
             f"| episodes finished | {s.get('episodes', 0)} |",
             f"| env tool calls | {tool_total} |"]
    for k in sorted(k for k in s if k.startswith("tool_")):
        lines.append(f"| - {k[5:]} | {s[k]} |")
    lines += [f"| background load calls | {s.get('load_calls', 0)} |",
              f"| - of which errors (during faults) | {s.get('load_errors', 0)} |",
              f"| unexpected exceptions | {len(result['unexpected'])} |", "",
              "| t s | fault in period | episodes | client RSS MiB | client fds | env workers RSS MiB | server RSS MiB | "
              "server fds | router RSS MiB | router fds |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in samples:
        lines.append(f"| {x['t']} | {x['fault']} | {x['episodes']} | {x['client_rss']:.0f} | {x['client_fds']} | "
                     f"{x['workers_rss']:.0f} | {x['server_rss']:.0f} | {x['server_fds']} | {x['router_rss']:.0f} | {x['router_fds']} |")
    if len(samples) >= 3:
        a, b = samples[1], samples[-1]  # after the first period (warm), and the end
        lines += ["", f"Growth from t={a['t']} s to t={b['t']} s: client RSS {b['client_rss'] - a['client_rss']:+.1f} MiB, "
                      f"fds {b['client_fds'] - a['client_fds']:+d}; env workers RSS {b['workers_rss'] - a['workers_rss']:+.1f} MiB; router RSS {b['router_rss'] - a['router_rss']:+.1f} MiB, "
                      f"fds {b['router_fds'] - a['router_fds']:+d} (the server restarts, so its figures reset)."]
    if result["unexpected"]:
        lines += ["", "Unexpected:", *[f"- `{u}`" for u in result["unexpected"][:10]]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 minute, 10 s periods")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--envs", type=int, default=4)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--fault-every", type=float, default=20.0, help="seconds per fault period")
    p.add_argument("--timeout-s", type=float, default=2.0, help="tool call deadline in the clients")
    p.add_argument("--out", default=None)
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                    "none with --quick)")
    args = p.parse_args(argv)
    minutes, every = (1.0, 10.0) if args.quick else (args.minutes, args.fault_every)
    result = soak(minutes, args.envs, args.clients, every, args.timeout_s)
    command = "python benchmarks/soak.py" + (" --quick" if args.quick else f" --minutes {minutes:g} --fault-every {every:g}")
    text = to_markdown(result, command, minutes)
    s = result["stats"]
    figures = {"minutes": minutes, "episodes": s.get("episodes", 0), "load_calls": s.get("load_calls", 0),
               "load_errors": s.get("load_errors", 0), "unexpected": len(result["unexpected"]),
               "tool_calls": sum(v for k, v in s.items() if k.startswith("tool_"))}
    figures.update({f"tool.{k[5:].replace(' ', '_')}": v for k, v in s.items() if k.startswith("tool_")})
    figures["tool_failed"] = figures["tool_calls"] - s.get("tool_ok", 0)
    samples = result["samples"]
    if len(samples) >= 3:
        a, b = samples[1], samples[-1]
        for k in ("client_rss", "workers_rss", "router_rss", "client_fds", "router_fds", "server_fds"):
            figures[f"growth.{k}"] = b[k] - a[k]
        figures.update({f"end.{k}": b[k] for k in ("client_fds", "router_fds", "server_fds")})
    record("soak", text, figures, command, results_dir_arg(args.quick, args.results))
    if args.out:
        Path(args.out).write_text(text)
    return 1 if result["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
