"""The project's own exception types, in one place.

Errors caused by *the model's output* are never raised: they become observations the agent can
learn from (see :mod:`medvqa_env.parser` and :class:`medvqa_env.env.MedVQAEnv`). These types are
for misuse by the *caller* and for broken inputs (datasets, configs, servers).
"""

from __future__ import annotations

import difflib
from typing import Iterable


class MedVQAError(Exception):
    """Base class for every error this project raises on purpose."""


class DatasetError(MedVQAError, ValueError):
    """A manifest or record is malformed, or an image it names is missing or unreadable."""


class DecodeError(DatasetError):
    """An image file is there but its pixels cannot be decoded (corrupt, truncated, or a format no
    installed decoder reads); the message names the file and, for a DICOM, its transfer syntax."""


class ConfigError(MedVQAError, ValueError):
    """A configuration names something unknown or holds a value of the wrong kind."""


class EnvStateError(MedVQAError, RuntimeError):
    """The env was used out of order (step before reset, step after the episode ended)."""


class ToolError(MedVQAError):
    """A tool could not run on the given arguments. Its message goes back to the agent."""


class ToolBackendError(ToolError):
    """A tool backend (e.g. a remote server) failed or timed out."""


def unknown_name_message(kind: str, name: str, choices: Iterable[str]) -> str:
    """``Unknown tool 'zoom'. Available: [...]. Did you mean 'image_zoom_in'?``"""
    options = sorted(choices)
    msg = f"Unknown {kind} {name!r}. Available: {options}."
    close = difflib.get_close_matches(str(name), options, n=1, cutoff=0.5)
    if not close:
        close = [o for o in options if str(name).lower() in o.lower()][:1]
    if close:
        msg += f" Did you mean {close[0]!r}?"
    return msg
