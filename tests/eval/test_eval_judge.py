"""The lenient LLM judge through a real OpenAI-compatible HTTP server on loopback.

The server is real (HTTP, JSON, the chat-completions shape); its "model" is a rule that plays a
lenient judge, because no judge LLM exists on this machine (``agents/openai_server.py`` serves
SmolLM2 for a real-model smoke run, see docs/evaluation.md). Slow and garbled replies exercise the
failure paths: a judge that times out or does not answer in JSON.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from eval.judge import JudgeError, LenientJudge, parse_judge_reply
from eval.runner import EvalConfig, Runner
from eval.scripted import ScriptedAgent
from eval.metrics import summarize


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        truth = re.search(r"Ground truth: (.*)", prompt)
        pred = re.search(r"Prediction: (.*)", prompt)
        truth, pred = (truth.group(1).strip() if truth else ""), (pred.group(1).strip() if pred else "")
        if "slow" in pred or "slow" in prompt[-40:]:
            time.sleep(2.0)
        if "garbled" in pred:
            text = "Hmm, hard to say."
        else:
            ok = truth.lower() in pred.lower() or pred.lower() in truth.lower()
            text = "```json\n" + json.dumps({"correct": ok, "reason": "rule judge"}) + "\n```"
        reply = {"id": "x", "object": "chat.completion", "model": body.get("model"),
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client that timed out hung up: expected
        pass


@pytest.fixture(scope="module")
def judge_url():
    server = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _Answers(ScriptedAgent):
    """Answers by record: slow / garbled triggers for two of them, the truth or a wrong guess otherwise."""

    def _guess(self, conv, rng):
        rid = conv.info["record_id"]
        return {"q00": "yes", "q01": "slow", "q02": "garbled", "q03": "no", "q04": "lung"}.get(rid, "kidney")


def test_judge_scores_episodes_and_failures_are_recorded(judge_url, dataset):
    judge = LenientJudge(judge_url, model="rule-judge", api_key_env=None, timeout_s=0.5, max_retries=0)
    ds = dataset[:6]
    rows = {r["record_id"]: r for r in Runner(_Answers(zoom=False), ds, EvalConfig(workers=0, progress=False,
                                              open_metrics=False), None, judge=judge).run()}
    assert len(rows) == 6
    assert rows["q00"]["judge"] == {"correct": True, "reason": "rule judge"}
    assert rows["q03"]["judge"]["correct"] is False
    assert rows["q04"]["judge"]["correct"] is True  # lenient: "lung" for "left lung"
    assert rows["q04"]["correct"] is False  # while exact match says no
    assert rows["q01"]["judge"] is None and "Timeout" in rows["q01"]["judge_error"]
    assert rows["q02"]["judge"] is None and "no verdict" in rows["q02"]["judge_error"]
    s = summarize(list(rows.values()), resamples=0)
    assert s.errors_by_kind == {"judge_error": 2}
    assert s.overall.judge_accuracy.n == 4 and s.overall.judge_accuracy.value == pytest.approx(2 / 4)
    judge.close()


def test_unreadable_replies_raise_judge_error():
    assert parse_judge_reply('Verdict: {"reason": "x", "correct": false}')["correct"] is False
    assert parse_judge_reply("correct: true")["correct"] is True
    with pytest.raises(JudgeError, match="no verdict"):
        parse_judge_reply("I cannot decide")


class _EndpointAgent(ScriptedAgent):
    """An agent behind an HTTP endpoint that does not answer in time for one record."""

    def __init__(self, url):
        super().__init__(zoom=False)
        self.url = url

    def act_batch(self, conversations):
        if any(c.info["record_id"] == "q01" for c in conversations):
            httpx.post(self.url + "/v1/chat/completions", timeout=0.3,
                       json={"messages": [{"role": "user", "content": "Prediction: slow"}]})
        return super().act_batch(conversations)


def test_a_timing_out_agent_endpoint_costs_one_episode(judge_url, dataset):
    rows = {r["record_id"]: r for r in Runner(_EndpointAgent(judge_url), dataset[:4], EvalConfig(
        workers=0, progress=False, open_metrics=False), None).run()}
    assert rows["q01"]["error"]["kind"] == "agent_error" and "ReadTimeout" in rows["q01"]["error"]["message"]
    assert all(rows[r]["error"] is None and rows[r]["prediction"] for r in ("q00", "q02", "q03"))


def test_rows_are_written_before_the_judge_answers_and_pending_ones_are_judged_on_resume(judge_url, dataset, tmp_path):
    from eval.results import ResultsWriter, load_results
    from eval.runner import evaluate

    judge = LenientJudge(judge_url, model="rule-judge", api_key_env=None, timeout_s=5, max_retries=0)
    cfg = EvalConfig(workers=0, progress=False, open_metrics=False, limit=4, bootstrap=0)
    out = tmp_path / "run"
    evaluate(_Answers(zoom=False), dataset, cfg, out_dir=out, judge=judge, write_report=False)
    lines = [json.loads(l) for l in (out / "episodes.jsonl").read_text().splitlines()]
    q00 = [l for l in lines if l["record_id"] == "q00"]
    assert [l["judge_status"] for l in q00] == ["pending", "done"]  # written at once, verdict after
    # an interrupted run left q03 waiting for its verdict
    pending = dict(next(r for r in load_results(out) if r["record_id"] == "q03"), judge=None, judge_status="pending")
    with ResultsWriter(out / "episodes.jsonl") as w:
        w.append(pending)
    again = evaluate(_Answers(zoom=False), dataset, cfg, out_dir=out, judge=judge, write_report=False)
    assert again.timing["new_episodes"] == 1  # the re-judged row, no new episode
    assert next(r for r in load_results(out) if r["record_id"] == "q03")["judge"] == {"correct": False, "reason": "rule judge"}
    judge.close()
