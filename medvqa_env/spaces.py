"""Gymnasium spaces for text turns and variable-size images.

Gymnasium's :class:`~gymnasium.spaces.Text` only admits characters from a fixed charset, but model
turns and medical questions are arbitrary Unicode, and medical images come in any size. These two
small spaces keep ``check_env`` and the vector envs working with real data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from medvqa_env import shared_obs


class UnicodeText(spaces.Text):
    """Any ``str`` of length ``min_length..max_length``; ``sample()`` draws from ``charset``."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


class ImageSpace(spaces.Space[np.ndarray]):
    """An ``HxWx3`` ``uint8`` RGB image with ``1 <= H, W <= max_side``."""

    def __init__(self, max_side: int = 4096, seed: int | np.random.Generator | None = None) -> None:
        self.max_side = int(max_side)
        super().__init__(shape=None, dtype=np.uint8, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        h, w = (int(v) for v in self.np_random.integers(8, min(64, self.max_side) + 1, size=2))
        return self.np_random.integers(0, 256, size=(h, w, 3), dtype=np.uint8)

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, np.ndarray)
            and x.dtype == np.uint8
            and x.ndim == 3
            and x.shape[2] == 3
            and 1 <= x.shape[0] <= self.max_side
            and 1 <= x.shape[1] <= self.max_side
        )

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ImageSpace) and other.max_side == self.max_side

    def __repr__(self) -> str:
        return f"ImageSpace(max_side={self.max_side})"


# Vector envs batch each sub-space: images of different sizes batch as tuples.
@batch_space.register(ImageSpace)
def _batch_image_space(space: ImageSpace, n: int = 1) -> spaces.Tuple:
    return spaces.Tuple([ImageSpace(space.max_side) for _ in range(n)])


@concatenate.register(ImageSpace)
def _concatenate_images(space: ImageSpace, items, out):
    return tuple(items)


@create_empty_array.register(ImageSpace)
def _empty_images(space: ImageSpace, n: int = 1, fn=np.zeros):
    return tuple(None for _ in range(n))


@iterate.register(ImageSpace)
def _iterate_images(space: ImageSpace, items):
    return iter(items)


class ImageSequence(spaces.Sequence):
    """A tuple of :class:`ImageSpace` images of any length (an observation's new images)."""

    def __init__(self, max_side: int = 4096, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(ImageSpace(max_side), seed=seed, stack=False)

    def __repr__(self) -> str:
        return f"ImageSequence(max_side={self.feature_space.max_side})"


# Gymnasium's AsyncVectorEnv (shared memory on by default) gets a slot per copy for each.
shared_obs.register(UnicodeText, ImageSequence, text_slot_bytes=8 << 20,
                    image_slot_bytes=lambda space: 4 * 3 * space.feature_space.max_side ** 2 + (1 << 20))


def observation_space(max_text_chars: int, max_image_side: int) -> spaces.Dict:
    """``{"text": UnicodeText, "images": Sequence(ImageSpace)}`` (see :class:`MedVQAEnv`)."""
    return spaces.Dict(
        {
            "text": UnicodeText(max_length=max_text_chars, min_length=0),
            "images": ImageSequence(max_image_side),
        }
    )


def action_space(max_action_chars: int) -> UnicodeText:
    return UnicodeText(max_length=max_action_chars, min_length=0)
