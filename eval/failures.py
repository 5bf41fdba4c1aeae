"""What failed in a run, named: counted per episode and per run, where the score is.

An episode *failed* when something outside the agent broke under it: its tools were unavailable
(a server down, a request timed out), a tool crashed, its image could not be decoded, its env
worker died, or the env or the agent raised. Each failure is named by what a person needs to fix
it: ``kind``, ``tool``, ``server`` (the URL from the tool config; ``local`` for in-process tools),
``file`` (the episode's images, for a decode failure or a worker crash) and ``reason`` (the
message, cut to :data:`REASON_CHARS`).

Kinds, and whether they count as a failure of the run (:data:`RUN_FAILURES`):

* ``tool_unavailable`` -- the tool's server could not be reached or did not answer in time
  (:class:`tool_backends.http_client.ServerUnavailable`); counts.
* ``tool_crash`` -- the tool raised a bug, or its server answered 5xx or garbage; counts.
* ``tool_error`` -- the tool refused the call (arguments it cannot use): the agent's mistake, the
  model sees why; named and counted, but not a failure of the run.
* every episode error kind (``dataset_error`` -- the image is missing or cannot be decoded --,
  ``worker_crash``, ``env_error``, ``agent_error``); counts. ``judge_error`` does not (the episode
  is scored; only its judge verdict is missing).

The run's verdict (:func:`failure_problem`): more than ``max_failure_rate`` of the episodes failed
(``medvqa-eval --max-failure-rate``, default :data:`MAX_FAILURE_RATE`), and the run exits 1.

>>> classify_tool_error("Tool 'segment' is unavailable: could not reach http://127.0.0.1:9 (ConnectionRefusedError). Try ...")
'tool_unavailable'
>>> classify_tool_error("Tool 'segment' crashed: ValueError: boom")
'tool_crash'
>>> classify_tool_error("bbox must lie inside the image")
'tool_error'
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

MAX_FAILURE_RATE = 0.05
"""``medvqa-eval --max-failure-rate``'s default: a run in which more than this share of the episodes
failed (:data:`RUN_FAILURES`) exits 1."""
REASON_CHARS = 240
MAX_SOURCES = 50
"""Distinct failure sources kept in ``summary.json`` (the rest are counted in ``failure_sources_omitted``)."""

TOOL_KINDS = ("tool_unavailable", "tool_crash", "tool_error")
NOT_RUN_FAILURES = ("tool_error", "judge_error")
"""Kinds named and counted that do not fail the run (see the module docstring)."""

_UNAVAILABLE = (" is unavailable: ", " timed out after ")  # tool_backends.http_client.ServerUnavailable
_CRASHED = (" crashed: ", "sent a malformed", "refused the call (5", "refused the batch (5")


def classify_tool_error(message: str) -> str:
    """``tool_unavailable``, ``tool_crash`` or ``tool_error`` for a failed call's message (the
    texts :mod:`tool_backends.http_client` and :class:`tool_backends.toolbox.Toolbox` write)."""
    text = str(message)
    if any(m in text for m in _UNAVAILABLE):
        return "tool_unavailable"
    if any(m in text for m in _CRASHED):
        return "tool_crash"
    return "tool_error"


def tool_servers(tools: Any) -> dict[str, str]:
    """Tool name -> where it runs: the URL of its server, or ``local``, from a resolved tool config.

    >>> tool_servers({"segment": {"backend": "http", "url": "http://127.0.0.1:8001"}, "ground": {"backend": "local"}})
    {'segment': 'http://127.0.0.1:8001', 'ground': 'local'}
    """
    if not isinstance(tools, Mapping):
        return {}
    out = {}
    for name, entry in tools.items():
        url = entry.get("url") if isinstance(entry, Mapping) else (entry if isinstance(entry, str) else None)
        out[str(name)] = str(url) if isinstance(url, str) and url.startswith(("http://", "https://")) else "local"
    return out


def _reason(text: Any) -> str:
    one_line = " ".join(str(text).split())
    return one_line if len(one_line) <= REASON_CHARS else one_line[:REASON_CHARS - 3] + "..."


def _server_in(message: str) -> str | None:
    found = re.search(r"https?://[^\s)(,;]+", message)
    return found.group(0).rstrip(".") if found else None


def episode_failures(row: Mapping[str, Any], servers: Mapping[str, str] | None = None,
                     files: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The named failures of one episode row: its error (if any) and its failed tool calls, one
    entry per distinct ``(kind, tool, server, reason)`` with ``calls`` (how many calls) and the
    ``turns`` they happened in.

    >>> row = {"error": None, "trace": [{"turn": 1, "tool_calls": [
    ...     {"name": "segment", "error": "Tool 'segment' is unavailable: could not reach http://h:1 (OSError).", "invalid": False},
    ...     {"name": "segment", "error": "Tool 'segment' is unavailable: could not reach http://h:1 (OSError).", "invalid": False}]}]}
    >>> [(f["kind"], f["tool"], f["server"], f["calls"]) for f in episode_failures(row, {"segment": "http://h:1"})]
    [('tool_unavailable', 'segment', 'http://h:1', 2)]
    """
    servers = servers or {}
    out: dict[tuple, dict[str, Any]] = {}
    err = row.get("error")
    if err:
        kind = str(err.get("kind", "unknown"))
        entry = {"kind": kind, "tool": None, "server": None, "file": list(files or row.get("image_paths") or []) or None,
                 "reason": _reason(err.get("message", "")), "calls": 0, "turns": []}
        out[(kind, None, None, entry["reason"])] = entry
    for turn in row.get("trace") or ():
        for call in turn.get("tool_calls") or ():
            message = call.get("error")
            if not message or call.get("invalid"):
                continue  # no error, or the agent's malformed/unknown call (the invalid-call rate counts those)
            kind = classify_tool_error(message)
            tool = str(call.get("name"))
            server = servers.get(tool) or _server_in(message) or "local"
            key = (kind, tool, server, _reason(message))
            entry = out.setdefault(key, {"kind": kind, "tool": tool, "server": server, "file": None,
                                         "reason": key[3], "calls": 0, "turns": []})
            entry["calls"] += 1
            if turn.get("turn") is not None and turn["turn"] not in entry["turns"]:
                entry["turns"].append(turn["turn"])
    return list(out.values())


def row_failures(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The row's recorded failures (``row["failures"]``), or derived from its error and trace for a
    row written before they were recorded (server then from the message, when it names one)."""
    recorded = row.get("failures")
    return list(recorded) if isinstance(recorded, list) else episode_failures(row)


def is_run_failure(kind: str) -> bool:
    return kind not in NOT_RUN_FAILURES


def _source_key(f: Mapping[str, Any]) -> tuple:
    # one source per tool and server, whatever the exact message (a URL's port, a latency in it)
    if f["kind"] in TOOL_KINDS:
        return (f["kind"], f.get("tool"), f.get("server"))
    return (f["kind"], tuple(f.get("file") or ()) if f["kind"] in ("dataset_error", "worker_crash") else f.get("reason"))


def run_failures(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's failures: ``n_failed`` (episodes with a failure that counts, :func:`is_run_failure`),
    ``failed_by_kind`` (episodes per kind, every kind named), ``tool_failed_episodes`` (episodes
    with a failed tool call of any kind), and ``failure_sources``: one entry per source (a tool at a
    server, a file, a reason) with ``episodes``, ``calls``, the ``first`` and ``last`` episode keys
    and one example ``reason``, most episodes first (at most :data:`MAX_SOURCES`)."""
    n_failed = tool_failed = 0
    by_kind: dict[str, int] = defaultdict(int)
    sources: dict[tuple, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r.get("index", 0), r.get("sample", 0), r.get("key", ""))):
        failures = row_failures(row)
        if any(is_run_failure(f["kind"]) for f in failures):
            n_failed += 1
        if any(f["kind"] in TOOL_KINDS for f in failures):
            tool_failed += 1
        seen_kinds = set()
        for f in failures:
            if f["kind"] not in seen_kinds:
                by_kind[f["kind"]] += 1
                seen_kinds.add(f["kind"])
            key = _source_key(f)
            src = sources.get(key)
            if src is None:
                src = sources[key] = {"kind": f["kind"], "tool": f.get("tool"), "server": f.get("server"),
                                      "file": f.get("file"), "reason": f.get("reason"), "episodes": 1, "calls": 0,
                                      "first": row.get("key"), "last": row.get("key")}
            elif src["last"] != row.get("key"):  # once per episode, however many entries it has
                src["episodes"] += 1
            src["calls"] += int(f.get("calls") or 0)
            src["last"] = row.get("key")
    ordered = sorted(sources.values(), key=lambda s: (not is_run_failure(s["kind"]), -s["episodes"], str(s["first"])))
    return {"n_failed": n_failed, "failed_by_kind": dict(sorted(by_kind.items())), "tool_failed_episodes": tool_failed,
            "failure_sources": ordered[:MAX_SOURCES], "failure_sources_omitted": max(0, len(ordered) - MAX_SOURCES)}


def describe_source(src: Mapping[str, Any]) -> str:
    """One line naming a failure source.

    >>> describe_source({"kind": "tool_unavailable", "tool": "segment", "server": "http://h:1", "file": None,
    ...                  "reason": "could not reach", "episodes": 3, "calls": 4, "first": "q1#0", "last": "q9#0"})
    'tool_unavailable: tool segment at http://h:1: could not reach (3 episodes, 4 calls; first q1#0, last q9#0)'
    >>> describe_source({"kind": "worker_crash", "tool": None, "server": None, "file": ["img/3.dcm"],
    ...                  "reason": "died", "episodes": 1, "calls": 0, "first": "q3#0", "last": "q3#0"})
    'worker_crash: file img/3.dcm: died (1 episode: q3#0)'
    """
    where = []
    if src.get("tool"):
        where.append(f"tool {src['tool']}" + (f" at {src['server']}" if src.get("server") else ""))
    if src.get("file"):
        where.append("file " + ", ".join(map(str, src["file"])))
    n = src["episodes"]
    count = f"{n} episode{'s' if n != 1 else ''}"
    if src.get("calls"):
        count += f", {src['calls']} call{'s' if src['calls'] != 1 else ''}"
    span = f": {src['first']}" if n == 1 and not src.get("calls") else (
        f"; first {src['first']}, last {src['last']}" if n > 1 else f"; {src['first']}")
    return f"{src['kind']}: " + "".join(w + ": " for w in where) + f"{src['reason']} ({count}{span})"


def failure_problem(n_failed: int, n_episodes: int, failed_by_kind: Mapping[str, int],
                    max_failure_rate: float = MAX_FAILURE_RATE) -> str | None:
    """The one line saying the run failed, or ``None``.

    >>> failure_problem(131, 200, {"tool_unavailable": 131}, 0.05)
    '131 of 200 episodes (65.5%) failed, over --max-failure-rate 0.05 (tool_unavailable 131)'
    >>> failure_problem(1, 200, {"tool_unavailable": 1}) is None
    True
    """
    if not n_episodes or n_failed / n_episodes <= max_failure_rate:
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in failed_by_kind.items() if is_run_failure(k))
    return (f"{n_failed} of {n_episodes} episodes ({n_failed / n_episodes:.1%}) failed, over --max-failure-rate "
            f"{max_failure_rate:g} ({kinds})")
