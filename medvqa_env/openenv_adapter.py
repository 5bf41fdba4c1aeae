"""MedVQA-v0 as an OpenEnv environment: server, typed client, manifest (``openenv.yaml``).

``pip install openenv-core`` (``scripts/setup_integrations.sh`` builds ``.venv-integrations`` with
it; it is not in the main venv). A thin layer over :class:`medvqa_env.env.MedVQAEnv`: one env
per OpenEnv session, every session's env sharing one :class:`~medvqa_env.services.EnvServices`
(one toolbox and tool cache, one reward object: what a GRPO group must agree on), so a group of
``max_concurrent_envs`` sessions plays at once::

    python -m medvqa_env.openenv_adapter --port 8000 --max-concurrent-envs 8
    uvicorn medvqa_env.openenv_adapter:app --port 8000     # what openenv.yaml names; env from MEDVQA_OPENENV_*

    async with MedVQAClient(base_url="http://127.0.0.1:8000") as client:
        result = await client.reset(seed=0, index=1)
        obs, info = gym_observation(result.observation), result.observation.info
        result = await client.step(MedVQAAction(text=r"\\boxed{no}"))

Types: :class:`MedVQAAction` (``text``: the model's whole turn), :class:`MedVQAObservation`
(``text``; ``images``: the new images as lossless PNG base64 -- OpenEnv has no image type, and
PNG gives back the env's pixels exactly; ``terminated``, ``truncated``; ``info``: the env's info
as JSON; OpenEnv's ``reward`` and ``done``), :class:`MedVQAState` (record, turn, tool turns).
``reset`` takes the env's ``seed`` and its options ``index`` / ``record_id``; a step's reward and
info are the env's own (``gym.make`` on the same seed and index gives the same).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from PIL import Image
from pydantic import Field

from medvqa_env.errors import ConfigError

ENV_VAR = "MEDVQA_OPENENV_ENV"
"""JSON of ``MedVQAEnv`` keyword arguments for the module-level :data:`app` (default: ``{}``)."""
SESSIONS_VAR = "MEDVQA_OPENENV_MAX_SESSIONS"
"""Concurrent sessions for the module-level :data:`app` (default 8: a GRPO group)."""
DEFAULT_SESSIONS = 8


class MedVQAAction(Action):
    """One turn of the policy: ``<think>``, ``<tool_call>`` blocks, or the final answer."""

    text: str = Field(..., description="the model's whole turn (tool calls, or \\boxed{answer})")


class MedVQAObservation(Observation):
    """What the env returns: its observation text and new images, and its step's info."""

    text: str = Field(default="", description="the user turn after reset; the tool observation after a step")
    images: list[str] = Field(default_factory=list, description="new images, each PNG base64 (RGB)")
    terminated: bool = Field(default=False, description="the turn answered")
    truncated: bool = Field(default=False, description="the tool turns ran out without an answer")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info dict (JSON)")


class MedVQAState(State):
    """The session's episode: which record, how far."""

    record_id: str | None = None
    index: int | None = None
    turn: int = 0
    tool_turns: int = 0
    n_images: int = 0
    finished: bool = False


class MedVQAEnvironment(Environment):
    """One OpenEnv session's MedVQA env (``env_kwargs`` as for ``gym.make("MedVQA-v0", ...)``;
    ``services``: the :class:`EnvServices` the server's sessions share)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_kwargs: Mapping[str, Any] | None = None, services: Any = None) -> None:
        from medvqa_env.env import MedVQAEnv

        super().__init__()
        kwargs = dict(env_kwargs or {})
        if services is not None:
            kwargs.pop("tools", None), kwargs.pop("reward", None)
            kwargs["services"] = services
        self.env = MedVQAEnv(**kwargs)
        self._state = MedVQAState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, index: int | None = None,
              record_id: str | None = None, **kwargs: Any) -> MedVQAObservation:
        options = {"index": index} if index is not None else {"record_id": record_id} if record_id is not None else None
        obs, info = self.env.reset(seed=seed, options=options)
        self._state = MedVQAState(episode_id=episode_id or f"{info['record_id']}#{seed}", step_count=0,
                                  record_id=info["record_id"], index=info["index"], n_images=len(obs["images"]))
        return _observation(obs, 0.0, False, False, info)

    def step(self, action: MedVQAAction, timeout_s: float | None = None, **kwargs: Any) -> MedVQAObservation:
        obs, reward, terminated, truncated, info = self.env.step(action.text)
        s = self._state
        s.step_count += 1
        s.turn, s.tool_turns, s.n_images, s.finished = self.env.turn, self.env.tool_turns, len(self.env.images), self.env.done
        return _observation(obs, reward, terminated, truncated, info)

    @property
    def state(self) -> MedVQAState:
        return self._state

    def close(self) -> None:
        self.env.close()


def _observation(obs: Mapping[str, Any], reward: float, terminated: bool, truncated: bool,
                 info: Mapping[str, Any]) -> MedVQAObservation:
    return MedVQAObservation(text=obs["text"], images=[encode_array(a) for a in obs["images"]],
                             terminated=bool(terminated), truncated=bool(truncated), info=json_info(info),
                             reward=float(reward), done=bool(terminated or truncated))


def json_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The env's info as JSON (what a client receives): tuples as lists, numpy values as numbers
    (``{"box": (1, 2), "score": np.float32(0.5)}`` -> ``{"box": [1, 2], "score": 0.5}``)."""
    return json.loads(json.dumps(dict(info), default=_plain))


def _plain(value: Any) -> Any:
    for name in ("tolist", "item"):
        fn = getattr(value, name, None)
        if callable(fn):
            return fn()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return repr(value)


def encode_array(pixels: np.ndarray) -> str:
    """An observation image (H x W x 3 uint8) as PNG base64 (lossless)."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(buf, format="PNG", compress_level=1)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode_array(data: str) -> np.ndarray:
    """The inverse of :func:`encode_array`."""
    with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as im:
        return np.array(im.convert("RGB"), dtype=np.uint8)


def gym_observation(observation: MedVQAObservation) -> dict[str, Any]:
    """A :class:`MedVQAObservation` as the env's own observation ``{"text", "images"}``."""
    return {"text": observation.text, "images": tuple(decode_array(d) for d in observation.images)}


class MedVQAClient(EnvClient[MedVQAAction, MedVQAObservation, MedVQAState]):
    """OpenEnv's WebSocket client for a MedVQA server: one session (one episode at a time) per client."""

    def _step_payload(self, action: MedVQAAction) -> dict[str, Any]:
        return {"text": action.text}

    def _parse_result(self, payload: Mapping[str, Any]) -> StepResult[MedVQAObservation]:
        observation = MedVQAObservation(**dict(payload.get("observation") or {}), reward=payload.get("reward"),
                                        done=bool(payload.get("done", False)))
        return StepResult(observation=observation, reward=payload.get("reward"), done=bool(payload.get("done", False)))

    def _parse_state(self, payload: Mapping[str, Any]) -> MedVQAState:
        return MedVQAState(**dict(payload))


def create_server_app(env_kwargs: Mapping[str, Any] | None = None, max_concurrent_envs: int = DEFAULT_SESSIONS):
    """OpenEnv's FastAPI app (``/ws`` sessions, ``/reset``, ``/step``, ``/state``, ``/schema``,
    ``/health``, ``/metadata``) over MedVQA envs sharing one set of services; at most
    ``max_concurrent_envs`` sessions at once (more get OpenEnv's ``CAPACITY_REACHED``)."""
    from openenv.core.env_server.http_server import create_app

    from medvqa_env.services import EnvServices

    if not isinstance(max_concurrent_envs, int) or isinstance(max_concurrent_envs, bool) or max_concurrent_envs < 1:
        raise ConfigError(f"expected max_concurrent_envs to be an int >= 1, got {max_concurrent_envs!r}")
    kwargs = dict(env_kwargs or {})
    if "services" in kwargs:
        raise ConfigError("expected env_kwargs without 'services': the server builds the one its sessions share")
    services = EnvServices.build(kwargs.pop("tools", None), kwargs.pop("reward", None), kwargs.get("dataset", "embedded"))
    factory = functools.partial(MedVQAEnvironment, env_kwargs=kwargs, services=services)
    return create_app(factory, MedVQAAction, MedVQAObservation, env_name="medvqa",
                      max_concurrent_envs=max_concurrent_envs)


def _app_from_environment():
    raw = os.environ.get(ENV_VAR, "") or "{}"
    try:
        kwargs = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"expected {ENV_VAR} to be a JSON object of MedVQAEnv arguments, got {raw!r}: {e}") from None
    if not isinstance(kwargs, dict):
        raise ConfigError(f"expected {ENV_VAR} to be a JSON object, got {raw!r}")
    sessions = os.environ.get(SESSIONS_VAR, "") or str(DEFAULT_SESSIONS)
    if not sessions.isdigit():
        raise ConfigError(f"expected {SESSIONS_VAR} to be a positive integer, got {sessions!r}")
    return create_server_app(kwargs, int(sessions))


def __getattr__(name: str):  # ``app``: built on first use (uvicorn medvqa_env.openenv_adapter:app)
    if name == "app":
        app = globals()["app"] = _app_from_environment()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class ServeArgs:
    """Serve MedVQA-v0 as an OpenEnv environment."""

    host: str = "127.0.0.1"
    """bind address (loopback only: OpenEnv's protocol has no authentication)"""
    port: int = 8000
    """port to listen on"""
    max_concurrent_envs: int = DEFAULT_SESSIONS
    """sessions (one env each) at once; more are refused with CAPACITY_REACHED"""
    env: str = "{}"
    """JSON of MedVQAEnv arguments (dataset, split, tools, reward, max_turns, ...)"""


def main(argv=None) -> int:
    """``python -m medvqa_env.openenv_adapter``: serve MedVQA-v0 to OpenEnv clients."""
    from medvqa_env.cli import add_dataclass, make_parser, run_cli, to_instance

    parser = make_parser("medvqa-openenv", ServeArgs.__doc__)
    add_dataclass(parser, ServeArgs, "args")
    args = to_instance(ServeArgs, parser.parse_args(argv).args)

    def run() -> int:
        import uvicorn

        try:
            kwargs = json.loads(args.env)
        except ValueError as e:
            raise ConfigError(f"expected --env to be a JSON object, got {args.env!r}: {e}") from None
        if not isinstance(kwargs, dict):
            raise ConfigError(f"expected --env to be a JSON object, got {args.env!r}")
        from tool_backends.server import is_loopback

        if not is_loopback(args.host):  # OpenEnv has no token; put an authenticating proxy in front instead
            raise ConfigError(f"refusing to serve OpenEnv sessions on {args.host!r}: OpenEnv's protocol has no "
                              "authentication; bind 127.0.0.1 (behind an authenticating proxy for remote clients)")
        app = create_server_app(kwargs, args.max_concurrent_envs)
        print(f"medvqa-openenv: MedVQA-v0 on http://{args.host}:{args.port} "
              f"({args.max_concurrent_envs} sessions)", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
        return 0

    return run_cli("medvqa-openenv", run)


if __name__ == "__main__":
    raise SystemExit(main())
