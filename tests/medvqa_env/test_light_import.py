"""Imports only what is used: making and stepping the default env loads no text-metric or model
library; they load when an open answer is first scored (issue 31; the time it saves is measured
by ``benchmarks/bench_import.py``). Each check runs in a fresh interpreter (``sys.modules`` of this
test process holds whatever other tests imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("rouge_score", "nltk", "bert_score", "sentence_transformers", "torch", "transformers", "scipy", "sklearn")

LIGHT_PATH = f"""
import json, sys
import gymnasium as gym
import medvqa_env, rewards, tool_backends
env = gym.make("MedVQA-v0")
env.reset(seed=0)
env.step('<tool_call>{{"name": "image_zoom_in", "arguments": {{"bbox": [10, 10, 60, 60]}}}}</tool_call>')
light = sorted(m for m in {HEAVY!r} if m in sys.modules)
from rewards.text_metrics import rouge1
score = rouge1("left lower lobe", "the left lower lobe")
print(json.dumps({{"light": light, "after_open_metric": "rouge_score" in sys.modules, "rouge1": round(score, 4)}}))
"""


def run_fresh(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(180)
def test_making_and_stepping_the_default_env_imports_no_metric_or_model_library():
    out = run_fresh(LIGHT_PATH)
    assert out["light"] == [], f"imported on the light path (make, reset, a zoom call): {out['light']}"
    assert out["after_open_metric"] and out["rouge1"] == 0.8571  # the first open-answer metric loads its library
