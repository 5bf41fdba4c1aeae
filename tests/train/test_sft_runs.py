"""``train.sft`` at ``train.grpo``'s standard (issue 21): HF checkpoints every ``--save-every`` steps
with the settings they were trained with, a resume that continues where a killed run stopped (and
ends with the weights an uninterrupted run gets), a rerun with other settings refused and listed,
no step logged twice after a resume, TensorBoard on by default with the final metrics beside the
hyper-parameters."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from medvqa_env.errors import ConfigError
from train import sft
from train.checkpoint import list_checkpoints
from train.common import parse_args
from train.metrics_log import read_metrics

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TINY = ["--policy", "tiny-qwen2-vl", "--answer-types", "CLOSED", "--eval-size", "2", "--max-new-tokens", "4",
        "--batch-size", "2", "--tools", "ground=oracle"]


def _sft(out, *extra):
    return sft.main(parse_args(sft.Args, TINY + ["--out", str(out), *extra]))


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    _sft(root / "whole", "--steps", "3", "--save-every", "1", "--keep", "0")
    _sft(root / "split", "--steps", "2", "--save-every", "1")    # "killed" after step 2 ...
    (root / "split" / "metrics.jsonl").open("a").write(json.dumps({"step": 3, "losses/sft": 99.0}) + "\n")
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(root / "split" / "tb")) as stale:  # what the killed run logged past its checkpoint
        stale.add_scalar("losses/sft", 99.0, 3)
    _sft(root / "split", "--steps", "3", "--save-every", "1")    # ... resumed: step 3 redone
    return root


def test_every_save_is_an_hf_folder_with_the_settings_it_was_trained_with(runs):
    whole = runs / "whole"
    assert [p.name for p in list_checkpoints(whole)] == ["step_000001", "step_000002", "step_000003"]  # --keep 0
    for ckpt in list_checkpoints(whole):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "medvqa_run.json"):
            assert (ckpt / name).is_file(), name
    saved = json.loads((list_checkpoints(whole)[0] / "medvqa_run.json").read_text())
    assert saved["step"] == 1 and saved["kind"] == "vlm"
    # the env's prompt was used: its text is recorded, not null
    assert saved["system_prompt_source"] == "env" and '"name": "ground"' in saved["system_prompt"]
    assert saved["env"]["max_turns"] == 3 and saved["env"]["tools"]["ground"]["engine"] == "oracle"
    assert saved["env"]["answer_protocol"] == "boxed"
    assert saved["encoder"] == {"chat_format": "chatml", "max_image_side": 224, "image_token": "<image>"}
    record = json.loads((whole / "args.json").read_text())["resolved"]  # the run record says the same
    assert record["system_prompt"] == saved["system_prompt"] and record["env"] == saved["env"]


def test_a_resumed_run_ends_where_the_uninterrupted_one_does_and_logs_each_step_once(runs):
    whole, split = _weights(runs / "whole" / "final"), _weights(runs / "split" / "final")
    assert whole.keys() == split.keys()
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], rtol=0, atol=1e-6)
    lines = [json.loads(x) for x in (runs / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2, 3]  # the stale step 3 was purged, not duplicated
    assert lines[-1]["losses/sft"] != 99.0
    resumes = [json.loads(x) for x in (runs / "split" / "resumes.jsonl").read_text().splitlines()]
    assert resumes[-1]["step"] == 2 and "steps: 2 -> 3" in resumes[-1]["changes"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(runs / "split" / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("losses/sft")
    assert [e.step for e in events] == [1, 2, 3] and events[-1].value != 99.0  # purge_step dropped the stale one


def test_tensorboard_is_on_by_default_and_holds_final_metrics_with_the_hparams(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(runs / "whole" / "tb"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "losses/sft" in tags["scalars"] and "final/eval/accuracy" in tags["scalars"]
    final = acc.Scalars("final/eval/accuracy")[-1]
    last = read_metrics(runs / "whole" / "metrics.jsonl")[-1]
    assert final.step == 3 and final.value == pytest.approx(last["eval/accuracy"])
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        acc.SummaryMetadata("_hparams_/experiment").plugin_data.content).experiment
    assert "final/eval/accuracy" in {m.name.tag for m in experiment.metric_infos}
    assert "args/lr" in {h.name for h in experiment.hparam_infos}


def test_a_rerun_with_other_settings_refuses_and_names_them(runs):
    final = runs / "whole" / "final" / "model.safetensors"
    before = final.stat().st_mtime_ns
    with pytest.raises(ConfigError) as err:
        _sft(runs / "whole", "--steps", "3", "--save-every", "1", "--keep", "0", "--lr", "1e-3")
    assert "lr: 5e-05 -> 0.001" in str(err.value) and "--allow-changed lr" in str(err.value)
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        _sft(runs / "whole", "--steps", "3", "--no-resume")
    assert _sft(runs / "whole", "--steps", "3", "--save-every", "1", "--keep", "0") == {}  # finished: no-op
    assert final.stat().st_mtime_ns == before


def test_an_allowed_change_continues_and_is_recorded(runs, tmp_path):
    out = tmp_path / "more"
    _sft(out, "--steps", "1", "--save-every", "0", "--no-tensorboard")
    _sft(out, "--steps", "2", "--lr", "1e-4", "--allow-changed", "lr", "--no-tensorboard")
    assert [p.name for p in list_checkpoints(out)] == ["step_000001", "step_000002"]
    assert json.loads((out / "args.json").read_text())["args"]["lr"] == 1e-4
    resumes = [json.loads(x) for x in (out / "resumes.jsonl").read_text().splitlines()]
    assert "lr: 5e-05 -> 0.0001" in resumes[-1]["changes"]


def test_bad_values_are_prog_errors(capsys):
    assert sft.cli(TINY + ["--save-every", "-1", "--out", "x"]) == 2
    assert "python -m train.sft: error: expected --steps >= 1 and --save-every >= 0" in capsys.readouterr().err


def test_a_run_ends_with_its_heldout_figures_checkpoint_and_eval_command(runs, capsys):
    """Met again once finished, the run still says what it reached, where the model is and the
    eval.run command for the same held-out questions (its first run printed the same lines)."""
    _sft(runs / "whole", "--steps", "3", "--save-every", "1", "--keep", "0")
    out = capsys.readouterr().out
    final = [r for r in read_metrics(runs / "whole" / "metrics.jsonl") if "eval/accuracy" in r][-1]
    assert "already finished" in out and "== train.sft done: 3 of 3 steps" in out
    assert f"held-out (test split, 2 CLOSED questions, greedy) at step 3: accuracy {final['eval/accuracy']:.3f}" in out
    assert f"checkpoint: {runs / 'whole' / 'final'}" in out
    assert (f"python -m eval.run --agent vlm --agent-opt model={runs / 'whole' / 'final'} --agent-opt max_new_tokens=4 "
            "--agent-opt temperature=0 --dataset embedded --split test --answer-types CLOSED --limit 2") in out


def test_a_saved_policy_evaluated_by_train_evaluate_records_its_tools_and_commit(runs, tmp_path):
    """``train.evaluate`` (the protocol's warm-start test figure) names what the figure depends on:
    each tool by its engine (a trained one by content hash) and the code by commit and versions."""
    from train import evaluate

    out = tmp_path / "eval.json"
    evaluate.main(["--policy", str(runs / "whole" / "final"), "--out", str(out), "--answer-types", "CLOSED",
                   "--eval-size", "2", "--max-new-tokens", "4", "--tools", "ground=oracle"])
    record = json.loads(out.read_text())
    assert record["questions"] == 2 and "eval/accuracy" in record["metrics"]
    assert record["tool_identity"]["ground"]["engine"] == "oracle"
    assert record["provenance"]["torch"] == torch.__version__ and "git_commit" in record["provenance"]


def test_a_rerun_gives_the_same_policy_hash_where_the_folder_hash_moves_with_wall_time(runs, tmp_path):
    """The warm start a protocol record names must be checkable by a rerun on a clean clone:
    ``policy_sha256`` leaves out the trainer state (wall time, optimizer) and who wrote the folder."""
    from medvqa_env.provenance import content_sha256
    from train.checkpoint import policy_sha256

    _sft(tmp_path / "again", "--steps", "3", "--save-every", "3")
    first, again = runs / "whole" / "checkpoints" / "step_000003", tmp_path / "again" / "checkpoints" / "step_000003"
    assert policy_sha256(again) == policy_sha256(first)
    assert content_sha256(again) != content_sha256(first)  # trainer_state/state.json: another wall time
    info = json.loads((again / "medvqa_run.json").read_text())
    info["generation"]["max_new_tokens"] += 1  # a setting evaluation uses is part of the policy
    (again / "medvqa_run.json").write_text(json.dumps(info))
    assert policy_sha256(again) != policy_sha256(first)
    first_weights = _weights(first)
    first_weights[next(iter(first_weights))] += 1e-3
    from safetensors.torch import save_file

    save_file(first_weights, str(tmp_path / "model.safetensors"))
    moved = tmp_path / "moved"
    import shutil

    shutil.copytree(first, moved)
    shutil.copy(tmp_path / "model.safetensors", moved / "model.safetensors")
    assert policy_sha256(moved) != policy_sha256(first)
