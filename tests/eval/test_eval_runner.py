"""The evaluation loop with a real env, real tools, real images and a scripted agent."""

from __future__ import annotations

import json

import pytest

from eval.runner import EvalConfig, Runner, check_resume, evaluate, run_info
from eval.scripted import ScriptedAgent
from medvqa_env.datasets import load_dataset
from medvqa_env.errors import ConfigError

from eval_helpers import by_key

FAST = dict(progress=False, open_metrics=False, bootstrap=50)


def run(agent, dataset, **cfg):
    return Runner(agent, dataset, EvalConfig(**{**FAST, **cfg}), out_dir=None).run()


def test_every_episode_is_recorded_with_its_trace(dataset):
    agent = ScriptedAgent()
    rows = run(agent, dataset, k=2, workers=0, batch_size=8)
    assert sorted(r["key"] for r in rows) == sorted(f"{r.id}#{s}" for r in dataset for s in (0, 1))
    r = rows[0]
    assert r["end_reason"] == "answer" and r["prediction"] is not None and r["error"] is None
    first = r["trace"][0]
    assert first["tool_calls"][0]["name"] == "image_zoom_in" and "Zoomed" in first["observation"]
    assert r["tool_stats"]["calls"] == 1 and r["turns"] == 2
    assert set(r["reward_components"]) >= {"accuracy", "format"}
    assert set(r["timing"]) == {"total_s", "agent_s", "env_s", "score_s"}
    # samples of one question get different seeds; the agent gets many conversations per call
    seeds = {r["key"]: r["seed"] for r in rows}
    assert seeds["q00#0"] != seeds["q00#1"]
    assert max(agent.batch_sizes) == 8


def test_bad_inputs_are_recorded_and_the_run_goes_on(tmp_path, manifest):
    lines = manifest.read_text().splitlines()
    broken = json.loads(lines[0])
    broken.update(id="missing", image_paths=["img/does-not-exist.png"])
    manifest.write_text("\n".join(lines + [json.dumps(broken)]) + "\n")
    ds = load_dataset(str(manifest), check_images=False)
    agent = ScriptedAgent(crash_on="q01", garbage_on="q02", bad_tool_on="q03")
    rows = {r["record_id"]: r for r in run(agent, ds, workers=0)}
    assert len(rows) == len(ds)
    assert rows["missing"]["error"]["kind"] == "dataset_error" and "does not exist" in rows["missing"]["error"]["message"]
    assert rows["q01"]["error"] == {"kind": "agent_error", "message": "RuntimeError: scripted crash on q01"}
    assert rows["q02"]["end_reason"] == "max_turns" and rows["q02"]["prediction"] is None
    assert not rows["q02"]["format_ok"] and rows["q02"]["error"] is None
    assert rows["q03"]["tool_stats"]["invalid"] == 1 and "Unknown tool 'zoom'" in rows["q03"]["trace"][0]["observation"]
    assert all(r["error"] is None for k, r in rows.items() if k not in ("missing", "q01"))


class WrongCountAgent(ScriptedAgent):
    """Returns one turn too few for batches, None for the record 'q04' (a broken model wrapper)."""

    def act_batch(self, conversations):
        if len(conversations) > 1:
            return super().act_batch(conversations)[:-1]
        if conversations[0].info["record_id"] == "q04":
            return [None]
        return super().act_batch(conversations)


def test_a_batch_with_a_wrong_answer_count_is_retried_one_by_one(dataset):
    rows = {r["record_id"]: r for r in run(WrongCountAgent(), dataset, workers=0)}
    assert all(r["error"] is None for r in rows.values())
    assert rows["q00"]["prediction"] is not None
    assert rows["q04"]["prediction"] is None and "must be text" in " ".join(rows["q04"]["trace"][0]["parsed"]["errors"])


def test_worker_processes_give_the_same_episodes_as_serial(dataset):
    serial = run(ScriptedAgent(bad_tool_on="q05"), dataset, k=2, workers=0, batch_size=5)
    parallel = run(ScriptedAgent(bad_tool_on="q05"), dataset, k=2, workers=2, batch_size=7)
    assert by_key(serial) == by_key(parallel)


def test_resume_skips_finished_episodes_and_retries_errors(tmp_path, dataset):
    out = tmp_path / "run"
    cfg = EvalConfig(k=2, workers=0, **FAST)
    first = evaluate(ScriptedAgent(crash_on="q03"), dataset, cfg, out_dir=out)
    assert first.n_episodes == 24 and first.errors_by_kind == {"agent_error": 2}
    again = evaluate(ScriptedAgent(crash_on="q03"), dataset, cfg, out_dir=out)
    assert again.timing["new_episodes"] == 0
    assert again.overall == first.overall
    fixed = evaluate(ScriptedAgent(crash_on="q03"), dataset, EvalConfig(k=2, workers=0, retry_errors=True, **FAST),
                     out_dir=out, write_report=False)
    assert fixed.timing["new_episodes"] == 2
    # more samples extend the run instead of starting over
    more = evaluate(ScriptedAgent(crash_on="q03"), dataset, EvalConfig(k=3, workers=0, **FAST), out_dir=out)
    assert more.timing["new_episodes"] == 12 and more.n_episodes == 36
    for name in ("summary.json", "report.md", "report.html", "run.json", "episodes.jsonl"):
        assert (out / name).is_file()


def test_resume_refuses_results_of_another_setup(tmp_path, dataset):
    out = tmp_path / "run"
    evaluate(ScriptedAgent(), dataset, EvalConfig(workers=0, limit=2, **FAST), out_dir=out, write_report=False)
    other = run_info(ScriptedAgent(zoom=False), dataset, EvalConfig(), "test")
    with pytest.raises(ConfigError, match=r"differs in \['agent'\]"):
        check_resume(out, other)
    check_resume(out, other, overwrite=True)


def test_bad_config_is_refused(dataset):
    with pytest.raises(ValueError, match="expected k >= 1"):
        Runner(ScriptedAgent(), dataset, EvalConfig(k=0), None)


def test_open_answers_get_the_four_armed_metrics(dataset):
    opens = dataset.filter(lambda r: r.answer_type.value == "OPEN")[:3]
    agent = ScriptedAgent(zoom=False, answer="left lung", garbage_on=opens[2].id)
    rows = {r["record_id"]: r for r in Runner(agent, opens, EvalConfig(workers=0, progress=False), None).run()}
    for rid in (opens[0].id, opens[1].id):
        m = rows[rid]["metrics"]
        assert set(m) == {"bleu1", "rouge1", "bertscore", "cossim", "armed_avg"}
        assert m["bleu1"] == m["rouge1"] == 1.0 and m["bertscore"] > 0.99 and m["cossim"] > 0.99
        assert m["armed_avg"] == pytest.approx(sum(m[k] for k in ("bleu1", "rouge1", "bertscore", "cossim")) / 4)
    assert rows[opens[2].id]["prediction"] is None
    assert rows[opens[2].id]["metrics"] == {"bleu1": 0.0, "rouge1": 0.0, "bertscore": 0.0, "cossim": 0.0, "armed_avg": 0.0}


def test_open_metrics_load_once_per_run_and_match_serial_across_workers(dataset, monkeypatch):
    """The encoders behind the open metrics are loaded once, in the harness, however many env
    workers run; rows measured through workers equal a serial run's."""
    import eval.runner as runner_module

    built = []

    class CountedOpenMetrics(runner_module.OpenMetrics):
        def __init__(self, **options):
            built.append(options)
            super().__init__(**options)

    monkeypatch.setattr(runner_module, "OpenMetrics", CountedOpenMetrics)
    agent_kw = dict(zoom=True, garbage_on=dataset[1].id)
    serial = run(ScriptedAgent(**agent_kw), dataset, k=2, workers=0, open_metrics=True, batch_size=4)
    workers = run(ScriptedAgent(**agent_kw), dataset, k=2, workers=2, open_metrics=True, batch_size=4)
    assert len(built) == 2  # one per run, none in the workers
    opens = [r for r in serial if r["answer_type"] == "OPEN"]
    assert opens and all(set(r["metrics"]) >= {"bertscore", "cossim"} for r in opens)
    got = {r["key"]: r["metrics"] for r in workers}
    for r in serial:
        assert got[r["key"]] == pytest.approx(r["metrics"], abs=1e-6)


def test_without_open_metrics_open_answers_have_none(dataset):
    opens = dataset.filter(lambda r: r.answer_type.value == "OPEN")[:2]
    rows = run(ScriptedAgent(zoom=False, garbage_on=opens[0].id), opens, workers=0)
    assert all(r["metrics"] == {} for r in rows)
