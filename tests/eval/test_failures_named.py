"""Issue 41, item 1: failures are counted where the score is. A real ``medvqa-tools serve`` on
loopback is killed halfway through ``python -m eval.run``: the run names the tool and the server
in one line on stderr as it happens and again at the end, says in one line that it failed and exits
1; run.json, summary.json and the report's first lines count and name the failures, and every
episode whose tools failed is marked in episodes.jsonl."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import socket
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _server_process():
    name = "bench_load"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "bench_load.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].ServerProcess


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


@pytest.mark.slow
def test_a_tool_server_killed_halfway_is_named_counted_and_fails_the_run(tmp_path):
    server = _server_process()("serve", ["--tools", "image_zoom_in"],
                               log_path=tmp_path / "server.log").start()
    tools = json.dumps({"image_zoom_in": {"url": server.url, "timeout_s": 2.0, "retries": 0}})
    out = tmp_path / "run"
    n = 16
    cmd = [sys.executable, "-m", "eval.run", "--agent", "scripted", "--agent-opt", "delay_s=0.1",
           "--dataset", "embedded", "--limit", str(n), "--workers", "2", "--batch-size", "2", "--tools", tools,
           "--out", str(out), "--no-open-metrics", "--bootstrap", "0", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 90
        while len(_rows(out / "episodes.jsonl")) < 4 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()
        stdout, stderr = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.close()
    rows = sorted(_rows(out / "episodes.jsonl"), key=lambda r: r["index"])
    assert len(rows) == n
    failed = [r for r in rows if r["tools_failed"]]
    assert failed and len(failed) < n, [r["tools_failed"] for r in rows]
    assert rows[0]["tools_failed"] is False and rows[0]["failures"] == []
    named = failed[0]["failures"][0]
    assert (named["kind"], named["tool"], named["server"]) == ("tool_unavailable", "image_zoom_in", server.url)
    assert "could not reach" in named["reason"] and named["calls"] >= 1

    # exit 1, and one line says why; the tool and its server are named on stderr
    assert proc.returncode == 1, stderr[-3000:]
    lines = stderr.splitlines()
    verdict = [line for line in lines if "over --max-failure-rate 0.05" in line]
    assert verdict == [f"medvqa-eval: {len(failed)} of {n} episodes ({len(failed) / n:.1%}) failed, over "
                       f"--max-failure-rate 0.05 (tool_unavailable {len(failed)}); see the failures in "
                       f"{out / 'report.md'}"], lines
    live = [line for line in lines if line.startswith("medvqa-eval: failure: tool_unavailable: tool image_zoom_in "
                                                       f"at {server.url}: ")]
    assert len(live) == 1, lines  # once, when it first happened
    end = [line for line in lines if line.startswith(f"medvqa-eval: tool_unavailable: tool image_zoom_in at {server.url}")]
    assert len(end) == 1 and f"({len(failed)} episodes" in end[0], lines

    # run.json and summary.json count and name them; the report says so first
    run = json.loads((out / "run.json").read_text())
    assert run["failures"]["n_failed"] == len(failed)
    assert run["failures"]["failed_by_kind"] == {"tool_unavailable": len(failed)}
    src = run["failures"]["failure_sources"][0]
    assert (src["tool"], src["server"], src["episodes"]) == ("image_zoom_in", server.url, len(failed))
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["n_failed"], summary["n_errors"], summary["n_scored"]) == (len(failed), 0, n)
    report = (out / "report.md").read_text().splitlines()
    assert report[2].startswith(f"**Failures: {len(failed)} of {n} episodes (tool_unavailable {len(failed)}). "), report[:6]
    assert report[4] == "What failed:" and f"tool image_zoom_in at {server.url}" in report[6]
    assert "Failures:" in stdout  # the printed summary head leads with them too

    # the same run read again with a threshold it passes: exit 0, the failures still named
    proc2 = subprocess.run([*cmd, "--max-failure-rate", "1"], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc2.returncode == 0, proc2.stderr[-2000:]
    assert f"tool_unavailable: tool image_zoom_in at {server.url}" in proc2.stderr


class _InThreadToolServer:
    """The real tool server app (``image_zoom_in``) under uvicorn in a thread of this process."""

    def __init__(self) -> None:
        import threading

        import uvicorn

        from tool_backends.server import create_app
        from tool_backends.toolbox import LocalBackend
        from tool_backends.registry import build_tool

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        app = create_app({"image_zoom_in": LocalBackend([build_tool("image_zoom_in")])})
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    access_log=False, log_config=None))  # pytest's logging untouched
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = self.server.force_exit = True  # no graceful wait on the client's keep-alive
        self.thread.join(10)


def test_a_tool_server_that_dies_mid_run_fails_the_episodes_after_it_by_name(tmp_path, capsys):
    """In process, fast: the server stops after the agent's second call; every episode that called
    it afterwards is a named failure, the run exits 1 in one line (before: "Errors: none", exit 0)."""
    from eval.run import main
    from eval.scripted import ScriptedAgent

    server = _InThreadToolServer()
    calls = []

    class KillsTheServer(ScriptedAgent):
        def act_batch(self, conversations):
            calls.append(len(conversations))
            if len(calls) == 3:
                server.stop()
            return super().act_batch(conversations)

    sys.modules[__name__].KillsTheServer = KillsTheServer  # eval.run loads the agent as module:Class
    out = tmp_path / "run"
    # a dead server refuses at once; the long timeout only keeps a loaded machine's healthy calls healthy
    tools = json.dumps({"image_zoom_in": {"url": server.url, "timeout_s": 30.0, "retries": 0}})
    args = ["--agent", f"{__name__}:KillsTheServer", "--dataset", "embedded", "--limit", "6", "--workers", "0",
            "--batch-size", "1", "--tools", tools, "--out", str(out), "--no-open-metrics", "--bootstrap", "0",
            "--no-progress"]
    try:
        assert main(args) == 1
    finally:
        server.stop()
    err = capsys.readouterr().err.splitlines()
    rows = sorted((json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()),
                  key=lambda r: r["index"])
    failed = [r["tools_failed"] for r in rows]
    assert failed == [False] + [True] * 5, failed  # episode 1 zoomed (call 1) and answered (call 2)
    assert all(r["error"] is None for r in rows) and rows[0]["failures"] == []
    assert {(f["kind"], f["tool"], f["server"]) for r in rows for f in r["failures"]} == \
        {("tool_unavailable", "image_zoom_in", server.url)}
    assert f"medvqa-eval: 5 of 6 episodes (83.3%) failed, over --max-failure-rate 0.05 (tool_unavailable 5); " \
           f"see the failures in {out / 'report.md'}" in err, err
    assert sum(line.startswith(f"medvqa-eval: failure: tool_unavailable: tool image_zoom_in at {server.url}: ")
               for line in err) == 1, err  # said once as it happened
    assert any(line.startswith(f"medvqa-eval: tool_unavailable: tool image_zoom_in at {server.url}: ") and
               "(5 episodes, 5 calls; first " in line for line in err), err
    report = (out / "report.md").read_text().splitlines()
    assert report[2] == ("**Failures: 5 of 6 episodes (tool_unavailable 5). Errors: none; 6 of 6 episodes scored. "
                         "Dataset rows skipped by the loader: 0.**")
    assert report[4] == "What failed:" and report[6].startswith(f"- tool_unavailable: tool image_zoom_in at {server.url}")
    run = json.loads((out / "run.json").read_text())
    assert (run["failures"]["n_failed"], run["failures"]["failed_by_kind"]) == (5, {"tool_unavailable": 5})
    # the same folder read again with a threshold it passes: exit 0, the failures still named
    assert main([*args, "--max-failure-rate", "1"]) == 0
    assert f"tool_unavailable: tool image_zoom_in at {server.url}" in capsys.readouterr().err


def test_a_tool_that_refuses_the_agents_arguments_is_named_but_does_not_fail_the_run():
    """A refusal is the agent's mistake (the model reads why): counted as ``tool_error``, not a failure."""
    from eval.failures import run_failures

    rows = [{"key": f"q{i}#0", "error": None, "trace": [{"turn": 1, "tool_calls": [
        {"name": "image_zoom_in", "error": "bbox must lie inside the image", "invalid": False}]}]} for i in range(3)]
    out = run_failures(rows)
    assert (out["n_failed"], out["failed_by_kind"], out["tool_failed_episodes"]) == (0, {"tool_error": 3}, 3)
    assert out["failure_sources"][0]["episodes"] == 3 and out["failure_sources"][0]["server"] == "local"
