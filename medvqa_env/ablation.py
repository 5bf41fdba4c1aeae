"""Image ablation: does an agent use the image at all?

Published work finds that text-only RL keeps most of its VQA-RAD accuracy when the images are
blank, so a score alone cannot say whether a policy looks. An env built with ``image_ablation``
shows every episode a changed image, and everything downstream sees the same change -- the agent,
every tool (they measure the shown image), and the oracle engines (their annotations follow the
image):

* ``"blank"``: a black image of the same size; no annotations (nothing is there to find).
* ``"shuffle"``: the image (and the annotations) of another record of the same dataset, chosen
  deterministically (:func:`donor_index`), so the question no longer matches its picture.
* ``"blank_policy"``: the agent alone is blind -- every image it is shown (the question's and each
  tool's crop or overlay) is black, while the tools (and the oracle engines) work on the real image
  and their text reaches the agent as usual. Beside ``"blank"`` (which blinds the tools too) it
  separates the agent's own use of the pixels from its use of what the tools say about them.

The question, the options and the gold answer stay the record's own, so the same scorer measures
how much of the normal score was the picture's. ``eval.run --image-ablation`` reports the drop.

>>> from PIL import Image
>>> blank_images([Image.new("RGB", (4, 3), (200, 10, 10))])[0].getpixel((0, 0))
(0, 0, 0)
"""

from __future__ import annotations

from typing import Sequence

from PIL import Image

from medvqa_env.errors import ConfigError

ABLATIONS = ("blank", "shuffle", "blank_policy")


def check_ablation(mode: str | None) -> str | None:
    """``None``/``""``/``"none"`` -> ``None``; a known mode -> itself; else a :class:`ConfigError`."""
    if mode in (None, "", "none"):
        return None
    if mode not in ABLATIONS:
        from medvqa_env.errors import unknown_name_message

        raise ConfigError(unknown_name_message("image ablation", str(mode), ABLATIONS))
    return mode


def blank_images(images: Sequence[Image.Image]) -> list[Image.Image]:
    """Black RGB images of the same sizes."""
    return [Image.new("RGB", im.size) for im in images]


def donor_indices(dataset) -> list[int]:
    """For each record, the record whose image(s) replace its own under ``"shuffle"``: the
    distinct image sets of the dataset, in first-seen order, are rotated by half their number, so
    every record gets another record's picture (never its own), and the choice depends only on the
    dataset (the same in every env copy and every rerun).

    >>> from medvqa_env.records import VQADataset, VQARecord
    >>> ds = VQADataset([VQARecord(id=str(i), image_paths=(f"/{i // 2}.png",), question="q", answer="a",
    ...                            answer_type="OPEN", dataset="x") for i in range(6)])
    >>> donor_indices(ds)
    [2, 2, 4, 4, 0, 0]
    """
    first_of: dict[tuple[str, ...], int] = {}
    keys = [tuple(record.image_paths) for record in dataset]
    for i, key in enumerate(keys):
        first_of.setdefault(key, i)
    sets = list(first_of)
    if len(sets) < 2:
        raise ConfigError("image ablation 'shuffle' needs records with at least 2 different images; "
                          f"this dataset has {len(sets)}")
    position = {key: p for p, key in enumerate(sets)}
    return [first_of[sets[(position[key] + len(sets) // 2) % len(sets)]] for key in keys]
