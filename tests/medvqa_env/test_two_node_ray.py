"""Scale-out on a real two-node Ray cluster on loopback: ``ray start --head`` plus a second
``ray start --address`` with its own custom resource, temp dir and ports, started and torn down by
the test. The pool places one GRPO group on each node; the same answer gets the same reward on
both nodes (scored by the pool and by a copy of the reward inside a task on the second node);
``end_batch`` announced from both moves one state; each node's worker runs a group's tool call
once (tool caches are per worker, so per node). docs/environment.md describes the layout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("bert_score")

from medvqa_env.pool import EnvPool  # noqa: E402
from medvqa_env.records import AnswerType  # noqa: E402
from rewards.base import RewardInput  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
SEGMENT = '<tool_call>{"name": "segment", "arguments": {"bbox": [20, 50, 40, 70]}}</tool_call>'
OPEN = 2  # tiny_dataset's OPEN record; gold answer "left"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackCluster:
    """Two Ray nodes on 127.0.0.1, each a ``ray start --block`` in its own session (so stopping
    one kills exactly the processes it started), each with its own temp dir and ports."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="mvr", dir="/tmp")  # short: Ray's socket paths are length-bound
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Ray's token auth, set explicitly for every side (the nodes, the `ray status` CLI, the driver:
        # token_auth_driver): left to inherit, the sides disagreed. `ray start` turns token auth on when
        # ~/.ray/auth_token exists while a CLI with RAY_AUTH_MODE unset sends no token ("the head node
        # not up"), and a driver that ran a local ray.init() earlier stays in token mode for good, so
        # nodes forced to "disabled" could not answer it (a Serve replica's reply timed out).
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}
        self.nodes: list[subprocess.Popen] = []

    def _start(self, name: str, *args: str) -> None:
        temp = os.path.join(self.root, name)
        os.makedirs(temp)
        ports = [f"--{flag}={_free_port()}" for flag in ("node-manager-port", "object-manager-port",
                                                         "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                         "metrics-export-port", "runtime-env-agent-port")]
        log = open(os.path.join(self.root, f"{name}.log"), "w")
        self.nodes.append(subprocess.Popen(
            [RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", f"--temp-dir={temp}",
             f"--object-store-memory={96 << 20}", "--disable-usage-stats", *ports, *args],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    def start(self) -> None:
        # the token every side reads (~/.ray/auth_token; made once if missing, printed to no log)
        subprocess.run([RAY, "get-auth-token", "--generate"], env=self.env, capture_output=True, check=True)
        self._start("a", "--head", f"--port={self.port}", "--include-dashboard=false",
                    f"--resources={json.dumps({'node_a': 1})}")
        self._wait(lambda: subprocess.run([RAY, "status", f"--address={self.address}"], env=self.env,
                                          capture_output=True).returncode == 0, "the head node")
        self._start("b", f"--address={self.address}", f"--resources={json.dumps({'node_b': 1})}")

    def _wait(self, ready, what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if any(p.poll() is not None for p in self.nodes):
                raise RuntimeError(f"a ray node exited while waiting for {what}: {self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not up within {timeout_s:.0f} s: {self.logs()}")
            time.sleep(0.5)

    def wait_for_both(self) -> None:
        self._wait(lambda: ray.cluster_resources().get("node_b", 0) >= 1, "the second node")

    def logs(self) -> str:
        return " | ".join(Path(self.root, f"{n}.log").read_text()[-800:] for n in "ab"
                          if Path(self.root, f"{n}.log").exists())

    def stop(self) -> None:
        for p in self.nodes:  # each node's session: ray start, gcs/raylet, agents, workers
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        _until(lambda: not self.leftovers(), 5.0)
        for p in self.nodes:  # what did not stop on SIGTERM
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
        _until(lambda: not self.leftovers(), 10.0)
        shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[int]:
        return [pid for p in self.nodes for pid in _session_pids(p.pid)]


def _until(done, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.2)


def _session_pids(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    out.append(int(entry))
            except ProcessLookupError:
                pass
    return out


def token_auth_driver() -> None:
    """This process as a token-auth Ray driver, as a local ``ray.init()`` makes it (Ray's own step:
    ``RAY_AUTH_MODE=token`` in the environment and its cached config refreshed), whatever ran before."""
    from ray._private.authentication.authentication_token_setup import _enable_token_auth

    _enable_token_auth()


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():  # another module's local Ray: this test drives its own cluster
        ray.shutdown()
    c = LoopbackCluster()
    try:
        c.start()
        env_vars = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
        if "MEDVQA_CACHE" in os.environ:
            env_vars["MEDVQA_CACHE"] = os.environ["MEDVQA_CACHE"]
        token_auth_driver()
        ray.init(address=c.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                 runtime_env={"env_vars": env_vars})
        c.wait_for_both()
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()
    assert not c.leftovers(), "ray processes outlived the test cluster"


def _node_of(resource: str) -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(resource))


@ray.remote(num_cpus=0.5, resources={"node_b": 0.01})
def _score_on_node_b(reward, answers, batch_id):
    """A copy of the run's reward inside a task on the second node (as verl's workers score)."""
    batch = [RewardInput(rf"\boxed{{{a}}}", a, "left", AnswerType.OPEN) for a in answers]
    totals = [o.total for o in reward(batch)]
    reward.end_batch(batch_id)                                   # a second announcement of the boundary
    return ray.get_runtime_context().get_node_id(), totals


def test_groups_on_two_nodes_score_alike_and_move_one_state(cluster, tiny_dataset):
    pool = EnvPool({"dataset": tiny_dataset, "tools": {"segment": {"engine": "classical"}}, "max_turns": 2,
                    "reward": {"name": "default", "threshold_store": "ray"}},
                   size=8, backend="ray", workers=2, group_size=4, cpus_per_worker=0.5,
                   worker_resources=[{"node_a": 0.01}, {"node_b": 0.01}])
    try:
        node_a, node_b = _node_of("node_a"), _node_of("node_b")
        assert node_a != node_b
        # ---- placement: slots 0-3 (group 1) on node a, slots 4-7 (group 2) on node b
        stats = pool.tool_cache_stats(per_worker=True)
        assert [stats[0]["node"], stats[1]["node"]] == [node_a, node_b]
        assert pool.locate(3)[0] == 0 and pool.locate(4)[0] == 1

        # ---- tools: each node's worker runs its group's call once (a cache per worker, so per node)
        pool.reset([(0, {"index": OPEN})] * 8)
        results = pool.step({s: SEGMENT for s in range(8)})
        assert len({results[s][4]["tool_calls"][0]["text"] for s in range(8)}) == 1
        stats = pool.tool_cache_stats(per_worker=True)
        assert [(stats[w]["misses"], stats[w]["hits"]) for w in (0, 1)] == [(1, 3), (1, 3)]

        # ---- the same answer, the same reward on both nodes
        answers = ["left", "right kidney", "liver", "left"] * 2
        results = pool.step({s: rf"\boxed{{{a}}}" for s, a in enumerate(answers)})
        rewards = [results[s][1] for s in range(8)]
        assert rewards[:4] == rewards[4:] and rewards[0] == rewards[3] != rewards[1]
        where, remote = ray.get(_score_on_node_b.remote(pool.reward, ["left", "right kidney"], 0))
        assert where == node_b and remote == pytest.approx(rewards[:2], abs=1e-6)

        # ---- one state: the task on node b and the driver both end batch 0; it moved once
        moved = pool.end_batch(0)["OPEN"]["thresholds"]
        state = pool.state_dict()["reward"]["OPEN"]["thresholds"]
        assert state["updates"] == 1 and state["last_batch_id"] == 0 and state["thresholds"] == moved
        assert len(state["buffers"]["cosine"]) == 10                # 8 answers from the pool, 2 from node b
        pool.reset([(1, {"index": OPEN})] * 8)
        after = pool.step({s: r"\boxed{left}" for s in range(8)})
        assert len({after[s][1] for s in range(8)}) == 1 and after[0][1] != rewards[0]
        actor = state["actor"]
    finally:
        pool.close()
    with pytest.raises(ValueError):
        ray.get_actor(actor)                                        # the run's state ended with its pool
