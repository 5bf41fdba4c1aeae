"""In-cluster callers reach a tool's Ray Serve deployment by handle, without HTTP.

:class:`RayServeToolBackend` is the plain HTTP client (:class:`~tool_backends.http_client.HTTPToolBackend`:
request bodies, image refs and the 409 re-send, derived result images, the deadline and retries,
result decoding) with its socket pool swapped for a :class:`HandleTransport`, which hands each
request to the deployment's ``asgi`` method: the replica answers it with the plain server's app,
so a call by handle meets the same validation, limits, token check, single-flight and cache as one
over HTTP. A replica that dies mid-call (``ray.kill``, a lost node) surfaces as a connection error,
which the client retries within its deadline: Serve's router sends the retry to a live replica.

Config: ``{"segment": {"backend": "ray_serve"}}`` (options: ``app``, ``deployment``, ``timeout_s``,
``retries``, ``backoff_s``, ``token_env``, ``transport``, ``result_format``, ``derived_images``,
``optimistic_refs``). The caller must be connected to the Ray cluster (``ray.init(address=...)``;
a Ray worker is).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from medvqa_env.errors import ConfigError
from tool_backends.http_client import HTTPToolBackend, Response

DEFAULT_APP = "medvqa-tools"


class HandleTransport:
    """:class:`~tool_backends.http_client.ConnectionPool`'s ``request``/``close`` over a Serve
    deployment handle: ``request(method, path, body, headers, timeout) -> Response``. Raises
    ``TimeoutError`` past ``timeout`` and ``ConnectionError`` when the replica or Serve is gone
    (what the client retries)."""

    def __init__(self, app: str, deployment: str, handle: Any = None) -> None:
        self.app, self.deployment, self.handle = app, deployment, handle

    def _handle(self):
        if self.handle is None:
            from ray import serve

            try:
                self.handle = serve.get_deployment_handle(self.deployment, app_name=self.app)
            except Exception as e:  # Serve not running, no such app or deployment
                raise ConnectionError(f"no Ray Serve deployment {self.deployment!r} in app {self.app!r}: "
                                      f"{type(e).__name__}: {e}") from None
        return self.handle

    def request(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str],
                timeout: float) -> Response:
        import concurrent.futures

        from ray.exceptions import GetTimeoutError, RayError

        response = self._handle().asgi.remote(method, path, dict(headers), body or b"")
        try:
            status, out_headers, content = response.result(timeout_s=timeout)
        except (TimeoutError, GetTimeoutError, concurrent.futures.TimeoutError):
            response.cancel()
            raise TimeoutError(f"no answer from {self.deployment!r} within {timeout:g} s") from None
        except RayError as e:  # the replica died, its node went away, Serve is shutting down
            raise ConnectionError(f"{type(e).__name__} from deployment {self.deployment!r}") from None
        return Response(int(status), {str(k).lower(): str(v) for k, v in out_headers.items()}, bytes(content))

    def close(self) -> None:
        self.handle = None


class RayServeToolBackend(HTTPToolBackend):
    """Calls ``tools`` (one deployment: by default the tool's name) of the Serve app ``app`` by
    handle. Every other option is :class:`HTTPToolBackend`'s (the deadline, retries, token, image
    transport), with more retries and a longer backoff by default: a killed replica is replaced in
    about a second."""

    def __init__(self, tools: Sequence[str] | None = None, app: str = DEFAULT_APP, deployment: str | None = None,
                 timeout_s: float = 60.0, retries: int = 6, backoff_s: float = 0.1, token_env: str | None = None,
                 transport: str = "raw", result_format: str = "raw", derived_images: bool = True,
                 optimistic_refs: bool = True, handle: Any = None) -> None:
        if transport == "path" or result_format == "path":
            raise ConfigError("the ray_serve backend sends images in the request (transport/result_format "
                              "'raw' or 'png'); 'path' needs a shared directory, use the http backend for it")
        if deployment is None:
            if not tools or len(tools) != 1:
                raise ConfigError(f"a ray_serve backend serves one tool's deployment: give one tool or "
                                  f"'deployment', got tools={tools!r}")
            deployment = tools[0]
        super().__init__(tools=tools, url="http://ray-serve", timeout_s=timeout_s, retries=retries,
                         backoff_s=backoff_s, token_env=token_env, transport=transport, result_format=result_format,
                         derived_images=derived_images, optimistic_refs=optimistic_refs)
        self.app, self.deployment = str(app), str(deployment)
        self.url = f"ray-serve://{self.app}/{self.deployment}"  # what messages name
        self._handle = handle

    @property
    def pool(self) -> HandleTransport:  # type: ignore[override]
        if self._pool is None:
            if self.token_env:  # read at first use, never pickled
                import os

                self._auth = {"authorization": f"Bearer {os.environ.get(self.token_env, '')}"}
            self._pool = HandleTransport(self.app, self.deployment, self._handle)
        return self._pool

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_handle"] = None  # a copy on another worker looks the deployment up itself
        return state

    def __repr__(self) -> str:
        return f"RayServeToolBackend(app={self.app!r}, deployment={self.deployment!r}, tools={self.tools!r})"


__all__ = ["HandleTransport", "RayServeToolBackend", "DEFAULT_APP"]
