"""Every agent the project ships runs through the evaluation harness on the same env and metrics.

Model agents use the tiny random VLM, the real SmolLM2-135M and a real OpenAI-compatible server on
loopback; their answers are poor (untrained), which is fine: the harness must record each episode
with its full trace, and no agent may crash the run -- also with the images blanked or swapped.
"""

from __future__ import annotations

import json

import pytest

from agents.registry import build_agent
from eval.runner import EvalConfig, evaluate
from medvqa_env.datasets import load_dataset

N = 3


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Small models on a shared 2-core machine run fastest on one thread."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def embedded_test():
    return load_dataset("embedded", split="test")


def run(agent, dataset, out_dir, n=N, ablation="blank,shuffle"):
    """Evaluate ``n`` questions, and the same questions with the images blanked and/or swapped
    (``--image-ablation``: every agent kind must run ablated too)."""
    config = EvalConfig(limit=n, workers=0, progress=False, bootstrap=0, open_metrics=False,
                        tools={"image_zoom_in": "local", "ground": {"engine": "oracle"}},
                        image_ablation=ablation)
    summary = evaluate(agent, dataset, config, out_dir=out_dir)
    rows = [json.loads(line) for line in (out_dir / "episodes.jsonl").read_text().splitlines()]
    assert summary.n_episodes == n and len(rows) == n
    assert summary.errors_by_kind == {}, summary.errors_by_kind
    assert all(row["trace"] and row["error"] is None for row in rows)
    assert set(summary.image_ablation) == set(ablation.split(","))
    for mode, drop in summary.image_ablation.items():
        ablated = [json.loads(line) for line in (out_dir / f"ablation_{mode}" / "episodes.jsonl").read_text().splitlines()]
        assert drop["episodes"] == n and len(ablated) == n and all(r["error"] is None for r in ablated)
    return summary, rows


@pytest.mark.parametrize("name", ["random", "prior", "zoom-then-answer", "oracle"])
def test_baselines(name, embedded_test, tmp_path):
    options = {"prior": {"fit_on": "embedded:train"}, "zoom-then-answer": {"fit_on": "embedded:train"},
               "oracle": {"dataset": embedded_test}}.get(name, {})
    summary, rows = run(build_agent(name, **options), embedded_test, tmp_path)
    if name == "oracle":
        assert summary.overall.accuracy.value == 1.0


def test_tiny_vlm(embedded_test, tmp_path):
    run(build_agent("vlm", model="tiny-qwen2-vl", max_new_tokens=8), embedded_test, tmp_path)


@pytest.mark.slow
def test_smollm2_text_agent(embedded_test, tmp_path):
    # one question, one ablated pass: SmolLM2's prefill of the default prompt is ~8 s a turn on one thread,
    # the slowest agent here (the cheap agents above cover blank and shuffle on three questions)
    _, rows = run(build_agent("text-llm", max_new_tokens=8, temperature=0.0), embedded_test, tmp_path, n=1,
                  ablation="blank")
    assert all(isinstance(row["trace"][0]["action"], str) and row["trace"][0]["action"] for row in rows)


@pytest.mark.slow
def test_openai_endpoint_agent(embedded_test, tmp_path):
    from agents.openai_server import ServerProcess

    with ServerProcess(torch_threads=1) as server:
        agent = build_agent("openai", base_url=server.url + "/v1", max_tokens=8, api_key_env=None)
        run(agent, embedded_test, tmp_path, n=1, ablation="blank")  # SmolLM2 behind it: ~8 s a turn
