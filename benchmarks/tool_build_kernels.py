"""Does a tool build come out with the same bits on another CPU, and do kernel pins make it?

The CLOSED protocol's ground build 0 (the recipe ``ground=trained`` builds on first use, seed 0,
one torch thread) is trained in a fresh cache under each kernel setting below, and its content
hash is recorded under this machine's name. MKL's conditional numerical reproducibility
(``MKL_CBWR``), oneDNN's ISA cap and ATen's dispatch cap choose which float kernels run. If two
machines give one hash under a setting, the builds are portable between them under that setting.
Entries of other machines already in the results file are kept. Run it on each VM type a session
gets, and compare.

    python benchmarks/tool_build_kernels.py            # ~2 CPU minutes per setting
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project (medvqa_env.cli) when run as a script

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

from figures import RESULTS, ROOT, command_line, record  # noqa: E402  (benchmarks/figures.py)

TOPIC = "tool_build_kernels"
SETTINGS = {
    "default": {},
    "avx512": {"MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
}
BUILD = ("from tool_backends.identity import describe_tools; "
         "print(describe_tools({'ground': {'engine': 'trained', 'seed': 0}}, build=True)['ground']['content_hash'])")


def machine_id() -> str:
    """A short name for this CPU: vendor, cpuid family-model-stepping, and ``amx`` where it has AMX."""
    from medvqa_env.provenance import cpuinfo, machine

    m = machine()
    vendor = "amd" if "AMD" in cpuinfo().get("vendor_id", "") + m["cpu"] else "intel"
    amx = "-amx" if "amx_tile" in m.get("kernel_flags", []) else ""
    return re.sub(r"[^A-Za-z0-9_\-]", "-", f"{vendor}-{m.get('cpuid', 'unknown').replace('/', '-')}{amx}")


RECORD = ROOT / "benchmarks" / "runs" / "protocol" / "closed" / "protocol.json"


def build_hash(setting: dict[str, str], code: Path = ROOT) -> str:
    """The content hash of the build, trained in a fresh cache in a fresh process under ``setting``,
    by the code checked out at ``code``."""
    with tempfile.TemporaryDirectory(prefix="medvqa-kernels-") as cache:
        env = {**os.environ, **setting, "MEDVQA_CACHE": cache, "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-c", BUILD], cwd=code, env=env, capture_output=True, text=True,
                              timeout=1800, check=True)
    return done.stdout.strip().splitlines()[-1]


def build_hash_at(commit: str) -> str:
    """:func:`build_hash` (no setting) by the code of ``commit``, in a temporary git worktree."""
    with tempfile.TemporaryDirectory(prefix="medvqa-kernels-code-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            return build_hash({}, tree)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help="which kernel settings to build under (comma-separated; empty: none)")
    ap.add_argument("--at-record-commit", action="store_true",
                    help="also build it (no setting) from the commit that wrote the CLOSED record")
    args = ap.parse_args(argv)
    wanted = [n for n in args.settings.split(",") if n]
    unknown = [n for n in wanted if n not in SETTINGS]
    if unknown:
        ap.error(f"unknown settings {unknown}; expected some of {list(SETTINGS)}")
    from medvqa_env.provenance import machine

    path = RESULTS / f"{TOPIC}.json"
    figures = json.loads(path.read_text())["figures"] if path.is_file() else {}
    me = machine_id()
    figures[f"{me}.cpu"] = machine()["cpu"]  # this machine's other entries stay unless rebuilt now
    figures[f"{me}.kernel_flags"] = " ".join(machine().get("kernel_flags", []))
    for name in wanted:
        figures[f"{me}.{name}"] = build_hash(SETTINGS[name])
        print(f"[kernels] {me} {name}: {figures[f'{me}.{name}']}", file=sys.stderr)
    record_commit = json.loads(RECORD.read_text())["identity"]["code"]["git_commit"]
    figures["record.commit"] = record_commit[:7]
    figures["record.ground_b0"] = json.loads(RECORD.read_text())["identity"]["tools"]["ground"]["0"]["content_hash"]
    if args.at_record_commit:
        figures[f"{me}.record_commit"] = build_hash_at(record_commit)
        print(f"[kernels] {me} at {record_commit[:7]}: {figures[f'{me}.record_commit']}", file=sys.stderr)
    machines = sorted({k.split(".")[0] for k in figures} - {"record"})
    lines = ["## A tool build's bits on each CPU (`benchmarks/tool_build_kernels.py`)", "",
             "The CLOSED protocol's ground build 0, trained in a fresh cache under each kernel setting, by content hash "
             "(first 12 hex digits). The same hash in one column on two machines: that setting makes the build "
             f"portable between them. The CLOSED record's build 0 (written at {figures['record.commit']} on an AMD EPYC "
             f"whose cpuid it did not keep): {figures['record.ground_b0'][:12]}.", "",
             "| machine | CPU flags that pick kernels | " + " | ".join(SETTINGS)
             + f" | none, code at {figures['record.commit']} |",
             "|---|---|" + "---|" * (len(SETTINGS) + 1)]
    for m in machines:
        cells = [str(figures.get(f"{m}.{s}", "–"))[:12] for s in (*SETTINGS, "record_commit")]
        lines.append(f"| {m} ({figures.get(f'{m}.cpu', '?')}) | {figures.get(f'{m}.kernel_flags', '')} | "
                     + " | ".join(cells) + " |")
    settings = "; ".join(f"*{n}*: " + (" ".join(f"`{k}={v}`" for k, v in s.items()) or "none") for n, s in SETTINGS.items())
    lines += ["", f"Settings: {settings}.", ""]
    record(TOPIC, "\n".join(lines), figures, command_line("tool_build_kernels.py", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
