"""Third-party progress bars (transformers' "Loading weights") off while models load, unless asked.

Every env copy, worker and tool server loads its models; a bar per load buries the log lines
that matter. ``MEDVQA_PROGRESS_BARS=1`` shows them again.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


def progress_bars_wanted() -> bool:
    """Whether the user asked for progress bars (``MEDVQA_PROGRESS_BARS`` set and not ``0``)."""
    return os.environ.get("MEDVQA_PROGRESS_BARS", "") not in ("", "0")


@contextlib.contextmanager
def quiet_progress(uses_transformers: bool = True) -> Iterator[None]:
    """transformers' progress bars off for the block (restored after) unless wanted;
    ``uses_transformers=False`` does nothing (and imports nothing)."""
    if not uses_transformers or progress_bars_wanted():
        yield
        return
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
