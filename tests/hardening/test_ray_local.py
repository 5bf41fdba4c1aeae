"""The env pool's local Ray (issue 40, attack 7): Ray's token auth is on unless the user opts out
(``RAY_AUTH_MODE=disabled``); the code before forced it off. Every port the local node's
processes (gcs_server, raylet, workers) listen on is a loopback one (before: ``*:PORT``, every
interface). Starts a real local Ray in a subprocess with its own ``HOME`` (the token file goes
there): slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, os
import psutil
from medvqa_env.pool_backends import ensure_ray
from ray._raylet import AuthenticationMode, get_authentication_mode
ray = ensure_ray(num_cpus=1)
task = ray.get(ray.remote(lambda: 41 + 1).remote())
mine = {p.pid for p in psutil.Process().children(recursive=True)}
listening = sorted({c.laddr.ip for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.pid in mine})
print(json.dumps({"token": get_authentication_mode() == AuthenticationMode.TOKEN, "task": task,
                  "listening": listening, "env_left": "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in os.environ}))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode,token", [(None, True), ("disabled", False)])
def test_the_pools_local_ray_has_token_auth_by_default(tmp_path, mode, token):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env.update(HOME=str(tmp_path), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    if mode:
        env["RAY_AUTH_MODE"] = mode
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["token"] == token and report["task"] == 42 and not report["env_left"]
    assert report["listening"] and all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for ip in report["listening"]), report
    assert (tmp_path / ".ray" / "auth_token").exists() == token
