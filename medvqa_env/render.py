"""Draw an episode: the question's image with what the tools did, the tool outputs, and the turns.

Left: image 0 with what each tool did, one colour per tool and the colours of the tool's own image
(:func:`tool_colour`): ``ground``'s boxes numbered 1, 2, ... in its image's colours (box 1 red,
box 2 blue, ...), with label and score; ``segment``'s mask tinted and its region outlined in the red
of its overlay; ``image_zoom_in``'s region yellow; each label sits beside its box (above, else below
or to a side), never over what the box shows, and never over another label (labels of tools that
share a box stack). Below it: thumbnails of the images tools returned. Right: the question, its
options (MCQ), and each turn's action and observation, wrapped. Returns an ``HxWx3`` ``uint8`` array.
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
# the colours of the tools' own images (tool_backends.masks: OVERLAY_COLOR, BOX_COLORS), so a box
# reads the same in the render as in the picture the agent was shown (a test compares the two)
OVERLAY_COLOR = (255, 48, 48)
BOX_COLORS = ((255, 64, 64), (64, 200, 255), (255, 220, 0), (80, 255, 120), (255, 120, 255))
TOOL_COLORS = {"image_zoom_in": (255, 210, 0), "segment": OVERLAY_COLOR, "segment_text": OVERLAY_COLOR,
               "hires_render": (255, 150, 40)}
OTHER_TOOL = (190, 140, 255)
MASK = np.array(OVERLAY_COLOR, dtype=np.float32)


def tool_colour(name: str, box_number: int | None = None) -> tuple[int, int, int]:
    """The colour a tool's marks are drawn in: ``ground``'s box ``n`` in the colour its own image gives
    box ``n``; every other tool one colour (its overlay's, for the segmenters).

    >>> tool_colour("ground", 1), tool_colour("ground", 2), tool_colour("segment")
    ((255, 64, 64), (64, 200, 255), (255, 48, 48))
    """
    if box_number is not None:
        return BOX_COLORS[(box_number - 1) % len(BOX_COLORS)]
    return TOOL_COLORS.get(name, OTHER_TOOL)


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
                yield "region", (data["region"], call["name"], "mask_rle" in data)
            for number, box in enumerate(data.get("boxes") or (), start=1):  # numbered as in the tool's image
                yield "box", (box, call["name"], number)


def _is_box(value: Any) -> bool:
    """Whether ``value`` is a drawable [x0, y0, x1, y1] (tools' data may hold ``None`` or junk).

    >>> _is_box([1, 2, 3, 4]), _is_box(None), _is_box([1, 2]), _is_box(["a", 2, 3, 4])
    (True, False, False, False)
    """
    return (isinstance(value, (list, tuple)) and len(value) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in value))


def draw_overlays(image: Image.Image, trace: Iterable[dict[str, Any]], scale: float = 1.0,
                  placed: list | None = None) -> Image.Image:
    """Image 0 (resized by ``scale``) with masks, regions and grounding boxes drawn on a copy.
    ``placed``, when given, receives ``(text, colour, (x0, y0, x1, y1))`` for each label drawn."""
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
    drawn: dict[tuple, int] = {}  # outlines per box: a second tool's outline on the same box goes inside the first

    def outline(rect, colour) -> None:
        key = tuple(round(v) for v in rect)
        inset = drawn.get(key, 0) * width
        drawn[key] = drawn.get(key, 0) + 1
        x0, y0, x1, y1 = rect
        if x1 - x0 > 2 * inset and y1 - y0 > 2 * inset:
            draw.rectangle([x0 + inset, y0 + inset, x1 - inset, y1 - inset], outline=colour, width=width)

    for bbox, name, has_mask in regions:
        x0, y0, x1, y1 = scaled(bbox)
        colour = tool_colour(name)
        if not has_mask:  # a segmenter's region is its tinted mask, as in its own image
            outline((x0, y0, x1, y1), colour)
        labels.append(((x0, y0, x1, y1), name, colour))
    for box, name, number in boxes:
        bbox = box.get("bbox") if isinstance(box, dict) else None
        if not _is_box(bbox):
            continue
        x0, y0, x1, y1 = scaled(bbox)
        colour = tool_colour(name, number)
        outline((x0, y0, x1, y1), colour)
        score = box.get("score")
        label = f"{number} {box.get('label', '')}".strip() + (f" {score:.2f}" if isinstance(score, float) else "")
        labels.append(((x0, y0, x1, y1), label, colour))
    taken: list[tuple[int, int, int, int]] = []  # labels placed so far: the next one goes elsewhere
    for rect, text, colour in dict.fromkeys(labels):  # the same label on the same box once
        if not text.strip():
            continue
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        w, h = right - left + 4, bottom - top + 4
        x, y = label_position(rect, (w, h), out.size, width, taken)
        taken.append((x, y, x + w, y + h))
        if placed is not None:
            placed.append((text, colour, (x, y, x + w, y + h)))
        draw.rectangle([x, y, x + w, y + h], fill=BACKGROUND)
        draw.text((x + 2 - left, y + 2 - top), text, fill=colour, font=font)
    return out


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def label_position(box: tuple[float, float, float, float], size: tuple[int, int], image_size: tuple[int, int],
                   gap: int = 2, taken: Iterable[tuple[float, float, float, float]] = ()) -> tuple[int, int]:
    """Top-left corner for a ``size`` label beside ``box`` -- above it, else below, else to its
    right, else to its left -- never over what the box shows (the lesion a ground label names) nor
    over a label already ``taken`` (two tools on one box: the second goes below, the third to the
    right, then the stacks grow outwards); kept inside the image. Inside the box only when no side has room.

    >>> label_position((40, 40, 60, 60), (30, 10), (100, 100))  # above
    (40, 28)
    >>> label_position((40, 0, 60, 20), (30, 10), (100, 100))   # at the top edge: below
    (40, 22)
    >>> label_position((0, 0, 80, 100), (15, 10), (100, 100))   # full height: to the right
    (82, 0)
    >>> label_position((40, 40, 60, 60), (30, 10), (100, 100), taken=[(40, 28, 70, 38)])  # above is taken: below
    (40, 62)
    >>> label_position((40, 40, 60, 60), (30, 10), (100, 100), taken=[(40, 28, 70, 38), (40, 62, 70, 72)])
    (62, 40)
    """
    taken = list(taken)
    (x0, y0, x1, y1), (w, h), (width, height) = box, size, image_size
    if taken:
        candidates = []
        for k in range(8):  # stacks of labels above, below, right, left of the box
            candidates += [(x0, y0 - gap - h - k * (h + gap)), (x0, y1 + gap + k * (h + gap)),
                           (x1 + gap, y0 + k * (h + gap)), (x0 - gap - w, y0 + k * (h + gap))]
        for cx, cy in candidates:
            rect = (cx, cy, cx + w, cy + h)
            inside = cx >= 0 and cy >= 0 and cx + w <= width and cy + h <= height
            if inside and not _overlaps(rect, (x0, y0, x1, y1)) and not any(_overlaps(rect, t) for t in taken):
                return int(cx), int(cy)

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


def _transcript(question: str, trace: list[dict[str, Any]], answer_line: str | None,
                options: dict[str, str] | None = None) -> list[str]:
    """The text column: the question, its options (so "answer 'A'" can be read), each turn.

    >>> _transcript("Which modality?", [], None, {"A": "CT", "B": "MRI"})[:3]
    ['Q: Which modality?', 'Options: A) CT   B) MRI', '']
    """
    lines = ["Q: " + question]
    if options:
        lines.append("Options: " + "   ".join(f"{k}) {v}" for k, v in options.items()))
    lines.append("")
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
    lines = _transcript(env.record.question, env.trace, answer_line, dict(env.record.options or {}))
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
