"""The env pool's local Ray (issue 40, attack 7): Ray's token auth is on unless the user opts out
(``RAY_AUTH_MODE=disabled``, as the test suite does); the code before forced it off. (A loopback
bind is not possible in Ray 2.60: see ``ensure_ray``.) Starts a real local Ray in a subprocess
with its own ``HOME`` (the token file goes there): slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json
from medvqa_env.pool_backends import ensure_ray
from ray._raylet import AuthenticationMode, get_authentication_mode
ray = ensure_ray(num_cpus=1)
print(json.dumps({"token": get_authentication_mode() == AuthenticationMode.TOKEN,
                  "task": ray.get(ray.remote(lambda: 41 + 1).remote())}))
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
    assert report == {"token": token, "task": 42}
    assert (tmp_path / ".ray" / "auth_token").exists() == token
