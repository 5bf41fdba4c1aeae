"""Where training metrics go: a warning when a step has no learning signal, W&B when asked for
(a clear error when it is not installed), the hyper-parameters beside the scalars."""

from __future__ import annotations

import json
import logging
import sys
import time

import pytest

from medvqa_env.errors import ConfigError
from train.metrics_log import MetricsLogger, read_metrics


def test_a_step_whose_groups_all_tie_is_warned_about(tmp_path, caplog):
    log = MetricsLogger(tmp_path, tensorboard=False)
    with caplog.at_level(logging.WARNING, logger="train"):
        log.log(1, {"groups/zero_variance_share": 0.5})
        assert not caplog.records
        log.log(2, {"groups/zero_variance_share": 1.0})
    assert "step 2: every group had zero reward variance" in caplog.text
    log.close()


def test_report_to_wandb_without_wandb_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"needs the wandb package: pip install 'medvqa-gym\[wandb\]'"):
        MetricsLogger(tmp_path, tensorboard=False, report_to="wandb")
    with pytest.raises(ConfigError, match="expected --report-to wandb, tensorboard or none"):
        MetricsLogger(tmp_path, tensorboard=False, report_to="mlflow")


def test_report_to_wandb_logs_config_and_scalars_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLogger(tmp_path, tensorboard=False, report_to="wandb", hparams={"args": {"lr": 0.5}})
    log.log(1, {"rollout/reward_mean": 0.25})
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and (tmp_path / "wandb_id.txt").read_text() in runs[0].name
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["rollout/reward_mean"] == 0.25
    records = list(runs[0].glob("run-*.wandb"))  # the run's event log, synced later by `wandb sync`
    deadline = time.monotonic() + 15  # wandb's service process may still be flushing it after finish()
    while records and b"rollout/reward_mean" not in records[0].read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert records and b"rollout/reward_mean" in records[0].read_bytes() and b"lr" in records[0].read_bytes()


def test_a_resume_purges_the_steps_it_logs_again(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(4):
        log.log(step, {"losses/sft": float(step)})
    log.close()
    log = MetricsLogger(tmp_path, tensorboard=False, purge_step=2)  # resumed from the step-1 checkpoint
    log.log(2, {"losses/sft": 20.0})
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert log.final_metrics() == {"final/losses/sft": 20.0}
    log.close()
