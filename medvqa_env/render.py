"""Draw an episode: the question's image with what the tools did, the tool outputs, and the turns.

Left: image 0 with zoom/segment regions (yellow), grounding boxes (cyan, with label and score) and
masks (red tint); each label sits beside its box (above, else below or to a side), never over what
the box shows. Below it: thumbnails of the images tools returned. Right: the question and each
turn's action and observation, wrapped. Returns an ``HxWx3`` ``uint8`` array.
"""

from __future__ import annotations

import textwrap
from typing import Any, Iterable

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from medvqa_env.masks import rle_to_mask

PANEL = 512
TEXT_WIDTH = 560
THUMB = 120
BACKGROUND = (24, 24, 28)
REGION = (255, 210, 0)
GROUNDING = (0, 220, 255)
MASK = np.array([255, 40, 40], dtype=np.float32)


def _font(size: int = 13) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def _tool_overlays(trace: Iterable[dict[str, Any]]):
    """Yield (kind, payload) for every drawable thing the tools produced on image 0."""
    for turn in trace:
        for call in turn.get("tool_calls", ()):
            data = call.get("data") or {}
            if data.get("image_index", 0) != 0 or call.get("error"):
                continue
            if "mask_rle" in data:
                yield "mask", data["mask_rle"]
            if _is_box(data.get("region")):  # None when a tool looked at the whole image
                yield "region", (data["region"], call["name"])
            for box in data.get("boxes") or ():
                yield "box", box


def _is_box(value: Any) -> bool:
    """Whether ``value`` is a drawable [x0, y0, x1, y1] (tools' data may hold ``None`` or junk).

    >>> _is_box([1, 2, 3, 4]), _is_box(None), _is_box([1, 2]), _is_box(["a", 2, 3, 4])
    (True, False, False, False)
    """
    return (isinstance(value, (list, tuple)) and len(value) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in value))


def draw_overlays(image: Image.Image, trace: Iterable[dict[str, Any]], scale: float = 1.0) -> Image.Image:
    """Image 0 (resized by ``scale``) with masks, regions and grounding boxes drawn on a copy."""
    base = image.convert("RGB")
    if scale != 1.0:
        base = base.resize((max(1, round(base.size[0] * scale)), max(1, round(base.size[1] * scale))),
                           Image.Resampling.LANCZOS)
    canvas = np.asarray(base, dtype=np.float32).copy()
    boxes, regions = [], []
    for kind, payload in _tool_overlays(trace):
        if kind == "mask":
            try:
                m = rle_to_mask(payload)
            except (ValueError, KeyError, TypeError):
                continue
            if m.shape != (image.size[1], image.size[0]):
                continue
            if scale != 1.0:
                m = np.asarray(Image.fromarray(m).resize(base.size, Image.Resampling.NEAREST))
            canvas[m] = 0.55 * canvas[m] + 0.45 * MASK
        elif kind == "region":
            regions.append(payload)
        else:
            boxes.append(payload)
    out = Image.fromarray(canvas.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(out)
    width = max(2, round(max(out.size) / 200))
    font = _font(max(12, round(max(out.size) / 40)))

    def scaled(bbox) -> list[float]:
        x0, y0, x1, y1 = (float(v) * scale for v in bbox)
        return [min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)]

    labels = []  # drawn last, beside their boxes, so no box outline crosses a label
    for bbox, name in regions:
        x0, y0, x1, y1 = scaled(bbox)
        draw.rectangle([x0, y0, x1, y1], outline=REGION, width=width)
        labels.append(((x0, y0, x1, y1), name, REGION))
    for box in boxes:
        bbox = box.get("bbox") if isinstance(box, dict) else None
        if not _is_box(bbox):
            continue
        x0, y0, x1, y1 = scaled(bbox)
        draw.rectangle([x0, y0, x1, y1], outline=GROUNDING, width=width)
        label = f"{box.get('label', '')} {box.get('score', ''):.2f}" if isinstance(box.get("score"), float) else str(box.get("label", ""))
        labels.append(((x0, y0, x1, y1), label, GROUNDING))
    for rect, text, colour in labels:
        if not text.strip():
            continue
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        x, y = label_position(rect, (right - left + 4, bottom - top + 4), out.size, width)
        draw.rectangle([x, y, x + right - left + 4, y + bottom - top + 4], fill=BACKGROUND)
        draw.text((x + 2 - left, y + 2 - top), text, fill=colour, font=font)
    return out


def label_position(box: tuple[float, float, float, float], size: tuple[int, int], image_size: tuple[int, int],
                   gap: int = 2) -> tuple[int, int]:
    """Top-left corner for a ``size`` label beside ``box`` -- above it, else below, else to its
    right, else to its left -- never over what the box shows (the lesion a ground label names);
    kept inside the image. Inside the box only when no side has room.

    >>> label_position((40, 40, 60, 60), (30, 10), (100, 100))  # above
    (40, 28)
    >>> label_position((40, 0, 60, 20), (30, 10), (100, 100))   # at the top edge: below
    (40, 22)
    >>> label_position((0, 0, 80, 100), (15, 10), (100, 100))   # full height: to the right
    (82, 0)
    """
    (x0, y0, x1, y1), (w, h), (width, height) = box, size, image_size

    def fit_x(x: float) -> int:
        return int(max(0, min(x, width - w)))

    def fit_y(y: float) -> int:
        return int(max(0, min(y, height - h)))

    if y0 - gap - h >= 0:
        return fit_x(x0), int(y0 - gap - h)
    if y1 + gap + h <= height:
        return fit_x(x0), int(y1 + gap)
    if x1 + gap + w <= width:
        return int(x1 + gap), fit_y(y0)
    if x0 - gap - w >= 0:
        return int(x0 - gap - w), fit_y(y0)
    return fit_x(x0), fit_y(y0)


def _fit(image: Image.Image, side: int) -> Image.Image:
    img = image.copy()
    img.thumbnail((side, side))
    return img


def _transcript(question: str, trace: list[dict[str, Any]], answer_line: str | None) -> list[str]:
    lines = ["Q: " + question, ""]
    for turn in trace:
        action = turn["action"]
        head = f"Turn {turn['turn']}:"
        if action.get("tool_calls"):
            calls = "; ".join(f"{c['name']}({c['arguments']})" for c in action["tool_calls"])
            lines.append(f"{head} call {calls}")
        elif action.get("answers"):
            lines.append(f"{head} answer {action['answers'][-1]!r}")
        else:
            lines.append(f"{head} (no tool call, no answer)")
        if turn.get("observation"):
            body = turn["observation"].replace("<observation>", "").replace("</observation>", "").strip()
            lines.extend("  " + line for line in body.splitlines() if line.strip())
        lines.append("")
    if answer_line:
        lines.append(answer_line)
    wrapped = []
    for line in lines:
        wrapped.extend(textwrap.wrap(line, width=78, subsequent_indent="    ") or [""])
    return wrapped


def render_episode(env) -> np.ndarray:
    """Render ``env`` (a :class:`MedVQAEnv`) as it stands now."""
    if env.record is None:
        return np.zeros((PANEL, PANEL + TEXT_WIDTH, 3), dtype=np.uint8)
    main = draw_overlays(env.images[0], env.trace, scale=PANEL / max(env.images[0].size))
    extras = [_fit(im, THUMB) for im in env.images[1:]]
    rows_of_thumbs = -(-len(extras) // max(1, PANEL // (THUMB + 8))) if extras else 0
    height = PANEL + rows_of_thumbs * (THUMB + 24)
    answer_line = None
    if env.done:
        final = env.trace[-1]["action"] if env.trace else {}
        answer = (final.get("answers") or [None])[-1]
        answer_line = f"Answer: {answer!r}   Ground truth: {env.record.answer!r}"
    lines = _transcript(env.record.question, env.trace, answer_line)
    font = _font(13)
    height = max(height, 16 * len(lines) + 16)
    canvas = Image.new("RGB", (PANEL + TEXT_WIDTH, height), BACKGROUND)
    canvas.paste(main, ((PANEL - main.size[0]) // 2, (PANEL - main.size[1]) // 2))
    draw = ImageDraw.Draw(canvas)
    per_row = max(1, PANEL // (THUMB + 8))
    for i, thumb in enumerate(extras):
        x = 4 + (i % per_row) * (THUMB + 8)
        y = PANEL + 4 + (i // per_row) * (THUMB + 24)
        canvas.paste(thumb, (x, y + 16))
        draw.text((x, y), f"image {i + 1}", fill=(200, 200, 200), font=font)
    for i, line in enumerate(lines):
        draw.text((PANEL + 12, 8 + 16 * i), line, fill=(230, 230, 230), font=font)
    return np.asarray(canvas, dtype=np.uint8).copy()
