"""One source for every measured figure the docs quote: ``benchmarks/results/<topic>.json``.

Each benchmark records its run with :func:`record`: the Markdown section it prints
(``results/<topic>.md``, assembled into ``BENCHMARKS.md`` by ``run_all.py``) and its figures as
named numbers (``results/<topic>.json``: ``{"meta": {...}, "figures": {name: value}}``).

Prose quotes a figure inside a marker that names it and says how to print it (a Python format
spec), so the number on the page is always generated::

    remote segment costs <!-- fig tools.segment.overhead_ms +.1f -->+5.3<!-- /fig --> ms over in-process

A whole generated block (a table a benchmark printed, kept as a text figure) sits between block
markers on lines of their own; its lines are replaced by the figure::

    <!-- fig-block vqarad_baselines.table.selection -->
    | Run | ... |
    <!-- /fig-block -->

``python benchmarks/figures.py`` rewrites the text between markers in README.md, RELIABILITY.md,
docs/*.md and benchmarks/README.md from the results; ``--check`` only reports differences (and
``tests/test_doc_figures.py`` fails on any).

>>> text = "x <!-- fig t.rate .1f -->0<!-- /fig --> per s, <!-- fig t.n ,d -->0<!-- /fig --> calls"
>>> rewrite(text, {"t.rate": 409.74, "t.n": 10318})[0]
'x <!-- fig t.rate .1f -->409.7<!-- /fig --> per s, <!-- fig t.n ,d -->10,318<!-- /fig --> calls'
>>> rewrite("<!-- fig t.gone -->1<!-- /fig -->", {})[1]
["unknown figure 't.gone' (no such name in benchmarks/results/t.json)"]
>>> rewrite("a\\n<!-- fig-block t.table -->\\nold\\n<!-- /fig-block -->\\nb", {"t.table": "| x |\\n|---|"})[0]
'a\\n<!-- fig-block t.table -->\\n| x |\\n|---|\\n<!-- /fig-block -->\\nb'
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import datetime as dt
import json
import math
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"<!-- fig (?P<key>[A-Za-z0-9_.\-]+)(?: (?P<fmt>[^ ]*?))? -->(?P<text>.*?)<!-- /fig -->")
BLOCK = re.compile(r"<!-- fig-block (?P<key>[A-Za-z0-9_.\-]+) -->\n(?P<text>.*?)<!-- /fig-block -->", re.S)


def doc_files(root: Path = ROOT) -> list[Path]:
    """The Markdown files whose figures are generated (BENCHMARKS.md is assembled by run_all.py)."""
    files = [root / "README.md", root / "RELIABILITY.md", root / "benchmarks" / "README.md"]
    files += sorted((root / "docs").glob("*.md"))
    return [f for f in files if f.is_file()]


# -- recording ---------------------------------------------------------------------------------
def machine() -> str:
    """CPU model, cores, RAM, Python and torch versions of this machine, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        kb = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")).split()[1])
        mem = f"{kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        mem = "RAM unknown"
    try:
        import torch

        torch_v = f"torch {torch.__version__}"
    except ImportError:
        torch_v = "no torch"
    return f"{cpu}, {os.cpu_count()} cores, {mem}, Python {platform.python_version()}, {torch_v}"


def _clean(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    raise ValueError(f"expected a number, string, bool or None as a figure, got {value!r}")


def record(topic: str, section: str, figures: Mapping[str, Any], command: str,
           results_dir: Path | None = RESULTS) -> None:
    """Print ``section`` and keep it with its ``figures`` under ``results_dir`` (None: print only)."""
    print(section)
    if results_dir is None:
        return
    bad = [k for k in figures if not re.fullmatch(r"[A-Za-z0-9_.\-]+", k)]
    if bad:
        raise ValueError(f"expected figure names of letters, digits and _.-, got {bad!r}")
    results_dir.mkdir(parents=True, exist_ok=True)
    meta = {"command": command, "date": dt.datetime.now().isoformat(timespec="seconds"),
            "machine": machine(), "load_average": round(os.getloadavg()[0], 2)}
    payload = {"meta": meta, "figures": {k: _clean(v) for k, v in sorted(figures.items())}}
    (results_dir / f"{topic}.md").write_text(section.rstrip("\n") + "\n")
    (results_dir / f"{topic}.json").write_text(json.dumps(payload, indent=1) + "\n")


def command_line(script: str, argv: list[str] | None = None) -> str:
    """``python benchmarks/<script> <arguments>`` as it was run (``--results DIR`` left out).

    >>> command_line("bench_x.py", ["--quick", "--results", "/tmp/r", "--k", "2"])
    'python benchmarks/bench_x.py --quick --k 2'
    """
    args = list(sys.argv[1:] if argv is None else argv)
    kept, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--results":
            skip = True
            continue
        if a.startswith("--results="):
            continue
        kept.append(a)
    return " ".join(["python", f"benchmarks/{script}", *kept])


def results_dir_arg(quick: bool, given: str | None) -> Path | None:
    """Where a benchmark keeps its results: ``--results`` if given, none for ``--quick`` runs
    (smoke tests must not replace recorded figures), else ``benchmarks/results``."""
    if given:
        return Path(given)
    return None if quick else RESULTS


# -- reading and rewriting ---------------------------------------------------------------------
def load_figures(results_dir: Path = RESULTS) -> dict[str, Any]:
    """Every recorded figure as ``{"<topic>.<name>": value}``."""
    out: dict[str, Any] = {}
    for path in sorted(results_dir.glob("*.json")):
        data = json.loads(path.read_text())
        for name, value in data.get("figures", {}).items():
            out[f"{path.stem}.{name}"] = value
    return out


def format_figure(value: Any, fmt: str | None) -> str:
    """``value`` printed with the format spec ``fmt`` (``None``/empty: ``str``); a missing value is 'n/a'."""
    if value is None:
        return "n/a"
    return format(value, fmt) if fmt else str(value)


def rewrite(text: str, figures: Mapping[str, Any]) -> tuple[str, list[str]]:
    """``text`` with every marker's content regenerated, and the problems (unknown names, bad formats)."""
    problems: list[str] = []

    def fill(m: re.Match) -> str:
        key, fmt = m.group("key"), m.group("fmt")
        if key not in figures:
            topic = key.split(".", 1)[0]
            problems.append(f"unknown figure {key!r} (no such name in benchmarks/results/{topic}.json)")
            return m.group(0)
        try:
            shown = format_figure(figures[key], fmt)
        except (ValueError, TypeError) as e:
            problems.append(f"figure {key!r} cannot be printed with {fmt!r}: {e}")
            return m.group(0)
        head = m.group(0)[: m.start("text") - m.start()]
        return f"{head}{shown}<!-- /fig -->"

    def fill_block(m: re.Match) -> str:
        key = m.group("key")
        if key not in figures:
            topic = key.split(".", 1)[0]
            problems.append(f"unknown figure {key!r} (no such name in benchmarks/results/{topic}.json)")
            return m.group(0)
        body = format_figure(figures[key], None).strip("\n")
        return f"<!-- fig-block {key} -->\n{body}\n<!-- /fig-block -->"

    return MARKER.sub(fill, BLOCK.sub(fill_block, text)), problems


def markers(text: str) -> list[re.Match]:
    """Every block and inline marker of ``text``, in the order they appear."""
    return sorted([*BLOCK.finditer(text), *MARKER.finditer(text)], key=lambda m: m.start())


def stale(files: Iterable[Path] | None = None, results_dir: Path = RESULTS) -> list[str]:
    """One line per marker whose text differs from the results (or that names no figure)."""
    figures = load_figures(results_dir)
    out = []
    for path in files if files is not None else doc_files():
        text = path.read_text()
        new, problems = rewrite(text, figures)
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        out += [f"{rel}: {p}" for p in problems]
        for old_m, new_m in zip(markers(text), markers(new)):
            if old_m.group("text") != new_m.group("text"):
                line = text.count("\n", 0, old_m.start()) + 1
                was, now = old_m.group("text"), new_m.group("text")
                if old_m.re is BLOCK:  # a table: name its first differing line, not the whole block
                    diff = [(a, b) for a, b in zip(was.splitlines(), now.splitlines()) if a != b]
                    counts = (f"{len(was.splitlines())} lines", f"{len(now.splitlines())} lines")
                    was, now = diff[0] if diff else counts
                out.append(f"{rel}:{line}: {old_m.group('key')} is {was!r} in the doc, {now!r} in the results")
    return out


def update_docs(files: Iterable[Path] | None = None, results_dir: Path = RESULTS) -> list[str]:
    """Rewrite the markers in place; return the problems that were left (unknown names)."""
    figures = load_figures(results_dir)
    problems = []
    for path in files if files is not None else doc_files():
        text = path.read_text()
        new, found = rewrite(text, figures)
        problems += [f"{path.name}: {p}" for p in found]
        if new != text:
            path.write_text(new)
    return problems


# -- paths a doc names -------------------------------------------------------------------------
TOP_LEVEL = ("benchmarks", "tests", "docs", "medvqa_env", "tool_backends", "rewards", "agents", "eval", "train",
             "scripts", "configs", "examples")
FILE_TYPES = ("py", "md", "json", "jsonl", "cfg", "toml", "yaml", "yml", "txt", "sh", "png", "csv", "tsv")
PATH_IN_DOC = re.compile(r"(?<![\w/.\-])((?:%s)/[\w./\-]*[\w\-])" % "|".join(TOP_LEVEL))


def named_paths(text: str) -> list[str]:
    """Repository paths a doc names in code spans or links (``tests/x.py``, ``benchmarks/runs/``).

    >>> named_paths("`tests/eval/test_cli.py`, [runs](benchmarks/runs/), `eval/accuracy`, `tests/test_*.py`, `eval/open/*`")
    ['tests/eval/test_cli.py', 'benchmarks/runs']
    """
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"\]\(([^)\s#]+)", text)
    found = []
    for span in spans:
        for m in PATH_IN_DOC.finditer(span):
            path, after = m.group(1), span[m.end():m.end() + 1]
            if after in ("*", "<", "{"):  # a pattern, not a path
                continue
            folder = after == "/" and span[m.end() + 1:m.end() + 2] in ("", " ", ",", ".", ")")  # "docs/x/", not "eval/x/*"
            if folder or Path(path).suffix.lstrip(".") in FILE_TYPES:  # not a metric like eval/accuracy
                found.append(path)
    return list(dict.fromkeys(found))


def missing_paths(files: Iterable[Path] | None = None, root: Path = ROOT) -> list[str]:
    """``doc: path`` for every repository path a doc names that does not exist."""
    out = []
    for path in files if files is not None else [*doc_files(root), root / "BENCHMARKS.md"]:
        for name in named_paths(path.read_text()):
            if not (root / name).exists():
                out.append(f"{path.relative_to(root)}: {name}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="report stale figures, change nothing (exit 1 if any)")
    args = ap.parse_args(argv)
    if args.check:
        problems = stale() + [f"missing path {p}" for p in missing_paths()]
        print("\n".join(problems) or "every quoted figure matches benchmarks/results/")
        return 1 if problems else 0
    problems = update_docs()
    print("\n".join(problems) or "docs rewritten from benchmarks/results/", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
