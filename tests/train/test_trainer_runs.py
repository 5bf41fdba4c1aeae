"""What a user of the native trainer relies on (issue 11): every save is an HF folder eval.run loads
(LoRA: an adapter folder), the prompt comes from the env unless the demo's is asked for and travels
with the model, a resume with other settings refuses and lists them, a smaller --steps never
rewrites final/, and the run record (args.json, TensorBoard hparams) tells what ran."""

from __future__ import annotations

import json
import os

import pytest

from medvqa_env.errors import ConfigError
from train import grpo
from train.checkpoint import latest_checkpoint, list_checkpoints
from train.common import SHORT_SYSTEM_PROMPT

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TINY = dict(policy="tiny-qwen2-vl", answer_types="CLOSED", eval_size=2, max_new_tokens=4, eval_every=0,
            prompts_per_step=2, group_size=2, tools="ground=oracle", demo_prompt=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import contextlib
    import io

    out = tmp_path_factory.mktemp("grpo") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        grpo.main(grpo.Args(**TINY, steps=2, save_every=1, keep=1, out=str(out)))
    (out.parent / "stdout.txt").write_text(printed.getvalue())
    return out


def test_a_run_ends_with_its_heldout_figures_checkpoint_and_the_command_that_reproduces_them(run, tmp_path):
    """The last lines say what the run reached, where the model is and how to check it: the printed
    eval.run command, run as printed, asks the same held-out questions and gets the same answers
    (and so the same accuracy) as the trainer's final evaluation."""
    import shlex

    from eval.results import load_results
    from eval.run import main
    from train.metrics_log import read_metrics

    text = (run.parent / "stdout.txt").read_text()
    summary = text[text.index("== train.grpo done: 2 of 2 steps"):]
    final = [r for r in read_metrics(run / "metrics.jsonl") if "eval/accuracy" in r][-1]
    assert f"accuracy {final['eval/accuracy']:.3f}" in summary and "2 CLOSED questions" in summary
    assert f"checkpoint: {run / 'final'}\n" in summary
    argv = shlex.split(summary.split("reproduce the held-out figure: ")[1].splitlines()[0])
    assert argv[:3] == ["python", "-m", "eval.run"] and argv[argv.index("--out") + 1] == str(run / "eval" / "final")
    argv[argv.index("--out") + 1] = str(tmp_path / "eval")
    assert main(argv[3:] + ["--workers", "0", "--no-progress", "--no-open-metrics", "--bootstrap", "0"]) == 0
    rows = {r["record_id"]: r["prediction"] for r in load_results(tmp_path / "eval" / "episodes.jsonl")}
    trained = [json.loads(x) for x in (run / "heldout_answers.jsonl").read_text().splitlines()]
    trained = {r["record_id"]: r["answer"] for r in trained if r["step"] == final["step"] and r["tag"] is None}
    assert rows == trained and len(rows) == 2
    overall = json.loads((tmp_path / "eval" / "summary.json").read_text())["overall"]
    assert overall["closed_accuracy"]["value"] == pytest.approx(final["eval/accuracy"])


def test_saves_are_hf_folders_with_prompt_and_config_and_keep_applies(run):
    assert [p.name for p in list_checkpoints(run)] == ["step_000002"]  # --keep 1
    ckpt = latest_checkpoint(run)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json",
                 "medvqa_run.json", "trainer_state/optimizer.pt", "trainer_state/rng.json"):
        assert (ckpt / name).is_file(), name
    saved = json.loads((ckpt / "medvqa_run.json").read_text())
    assert saved["system_prompt"] == SHORT_SYSTEM_PROMPT and saved["step"] == 2
    assert saved["args"]["tools"] == "ground=oracle" and saved["resolved"]["tools"]["ground"]["engine"] == "oracle"
    record = json.loads((run / "args.json").read_text())
    assert record["provenance"]["package_version"] and "git_commit" in record["provenance"]
    assert json.loads((run / "final" / "medvqa_run.json").read_text())["step"] == 2


def test_eval_run_loads_a_checkpoint_with_its_prompt(run, tmp_path):
    from eval.run import main

    ckpt = latest_checkpoint(run)
    rc = main(["--agent", "vlm", "--agent-opt", f"model={ckpt}", "--agent-opt", "max_new_tokens=4",
               "--agent-opt", "dtype=bfloat16", "--dataset", "embedded", "--limit", "2", "--workers", "0",
               "--tools", "ground=oracle", "--no-open-metrics", "--no-progress", "--bootstrap", "0",
               "--out", str(tmp_path / "eval")])
    assert rc == 0
    agent = json.loads((tmp_path / "eval" / "run.json").read_text())["agent"]
    assert agent["model"] == str(ckpt) and agent["system_prompt"] == SHORT_SYSTEM_PROMPT
    assert agent["dtype"] == "bfloat16"


def test_resume_with_other_settings_refuses_and_lists_them(run):
    with pytest.raises(ConfigError) as err:
        grpo.main(grpo.Args(**TINY, steps=2, save_every=1, keep=1, out=str(run), lr=1e-3, algo="dapo"))
    assert "algo: 'grpo' -> 'dapo'" in str(err.value) and "lr: 2e-05 -> 0.001" in str(err.value)
    assert "--allow-changed algo,lr" in str(err.value)
    with pytest.raises(ConfigError, match="past --steps 1"):
        grpo.main(grpo.Args(**TINY, steps=1, save_every=1, keep=1, out=str(run)))
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        grpo.main(grpo.Args(**TINY, steps=2, out=str(run), resume=False))


def test_a_finished_run_is_not_rewritten(run):
    final = run / "final" / "model.safetensors"
    before = final.stat().st_mtime_ns
    assert grpo.main(grpo.Args(**TINY, steps=2, save_every=1, keep=1, out=str(run))) == {}
    assert final.stat().st_mtime_ns == before


def test_an_allowed_change_resumes_and_is_recorded(run):
    grpo.main(grpo.Args(**TINY, steps=3, save_every=1, keep=1, out=str(run), lr=1e-4, allow_changed="lr"))
    assert latest_checkpoint(run).name == "step_000003"
    resumes = [json.loads(line) for line in (run / "resumes.jsonl").read_text().splitlines()]
    assert resumes[-1]["step"] == 2 and "lr: 2e-05 -> 0.0001" in resumes[-1]["changes"]
    assert json.loads((run / "args.json").read_text())["args"]["lr"] == 1e-4


def test_tensorboard_holds_the_hyper_parameters(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    text = b"".join(t.tensor_proto.string_val[0] for t in acc.Tensors("hparams/text_summary"))
    assert b"args/lr" in text and b"resolved/tools" in text


def test_lora_saves_adapter_folders_that_load_merged(tmp_path):
    from agents.models import load_policy

    out = tmp_path / "lora"
    grpo.main(grpo.Args(**TINY, steps=1, save_every=1, lora_rank=2, out=str(out), save_final=False))
    ckpt = latest_checkpoint(out)
    adapter = json.loads((ckpt / "adapter_config.json").read_text())
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "config.json").exists()
    assert adapter["base_model_name_or_path"] == "tiny-qwen2-vl"
    model, encoder, kind = load_policy(ckpt)
    assert kind == "vlm" and encoder.system_prompt == SHORT_SYSTEM_PROMPT
    assert not hasattr(model, "peft_config")  # merged: a plain model for evaluation


def test_default_prompt_is_the_envs():
    from train.common import system_prompt_of

    assert system_prompt_of(grpo.Args()) is None  # the env's own prompt (tools' schemas, protocol)
    assert grpo.Args().tools is None and grpo.Args().policy != "smollm2"
    with pytest.raises(ConfigError, match="--demo-prompt or --system-prompt"):
        system_prompt_of(grpo.Args(demo_prompt=True, system_prompt="x"))
