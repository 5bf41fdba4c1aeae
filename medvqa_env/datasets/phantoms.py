"""Synthetic medical-looking phantoms with known anatomy and lesions (numpy only).

Three kinds of picture, each drawn from a handful of jittered ellipses and then blurred and
noised like a real acquisition:

* ``ct_abdomen`` -- an axial abdominal CT slice: body outline with a fat rim, liver, spleen, both
  kidneys, aorta and a vertebral body; lesions are hypodense (darker) spots in liver, spleen or a
  kidney.
* ``mri_brain`` -- an axial T1-like brain MRI: bright skull, cortex, white matter, two ventricles,
  the falx; lesions are hyperintense spots in the left or right hemisphere.
* ``xray_chest`` -- a frontal chest X-ray: dark lungs crossed by ribs, heart, spine, clavicles;
  lesions are faint nodules in a lung.

Left and right follow the radiological convention: the patient's left is on the image's right.

Every lesion lies wholly inside its host organ, clear of the other lesions and of the image's
midlines (so its quadrant is unambiguous); the largest lesion is at least 2 pixels wider in radius
than any other. Some lesions are small (radius 3-5 px) and low contrast (a little above the noise),
so that they are hard to see without zooming. The scene is a pure function of the random
generator, so the same seed gives the same pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SIZE = 256
KINDS = ("ct_abdomen", "mri_brain", "xray_chest")
MODALITY = {"ct_abdomen": "CT", "mri_brain": "MRI", "xray_chest": "X-Ray"}
ORGAN = {"ct_abdomen": "ABD", "mri_brain": "HEAD", "xray_chest": "CHEST"}
HOSTS = {
    "ct_abdomen": ("liver", "spleen", "left kidney", "right kidney"),
    "mri_brain": ("left hemisphere", "right hemisphere"),
    "xray_chest": ("left lung", "right lung"),
}
QUADRANTS = ("upper left", "upper right", "lower left", "lower right")
MAX_LESIONS = 3
_MIDLINE_MARGIN = 3


@dataclass(frozen=True)
class Lesion:
    """One lesion: centre and radius in pixels, the organ it lies in, its contrast."""

    host: str
    cx: float
    cy: float
    radius: float
    contrast: float  # absolute intensity difference to the host (0-255 scale)
    mask: np.ndarray = field(repr=False, compare=False)

    @property
    def label(self) -> str:
        return f"{self.host} lesion"

    @property
    def quadrant(self) -> str:
        """Image quadrant of the centre (image coordinates, not the patient's)."""
        top = "upper" if self.cy < SIZE / 2 else "lower"
        side = "left" if self.cx < SIZE / 2 else "right"
        return f"{top} {side}"

    @property
    def subtle(self) -> bool:
        """Small and low contrast: the kind you need to zoom in to see."""
        return self.radius <= 5 and self.contrast < 30


@dataclass
class Scene:
    """A rendered phantom: the grey image (uint8, SIZE x SIZE), organ masks, lesions."""

    kind: str
    image: np.ndarray
    organs: dict[str, np.ndarray]
    lesions: list[Lesion]

    @property
    def modality(self) -> str:
        return MODALITY[self.kind]

    @property
    def largest(self) -> Lesion | None:
        return max(self.lesions, key=lambda l: l.radius) if self.lesions else None


def mask_bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    """Tight pixel box ``(x0, y0, x1, y1)`` of a mask, ``x1``/``y1`` exclusive.

    >>> m = np.zeros((5, 6), bool); m[1:3, 2:5] = True
    >>> mask_bbox(m)
    (2, 1, 5, 3)
    """
    cols, rows = np.flatnonzero(mask.any(axis=0)), np.flatnonzero(mask.any(axis=1))
    if len(cols) == 0:
        raise ValueError("expected a non-empty mask, got an empty one")
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


# -- drawing primitives ------------------------------------------------------------------------
_YY, _XX = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)


def ellipse(cx: float, cy: float, rx: float, ry: float, angle: float = 0.0) -> np.ndarray:
    """Normalised elliptic radius: < 1 inside, 1 on the border (angle in radians).

    Only a window around the ellipse is computed (outside it the value is 9), which keeps a
    scene at a few milliseconds.
    """
    c, s = np.cos(angle), np.sin(angle)
    hx = 1.3 * np.hypot(rx * c, ry * s) + 2  # half extents of the rotated ellipse, with room
    hy = 1.3 * np.hypot(rx * s, ry * c) + 2  # for the soft edge
    x0, x1 = max(0, int(cx - hx)), min(SIZE, int(cx + hx) + 1)
    y0, y1 = max(0, int(cy - hy)), min(SIZE, int(cy + hy) + 1)
    out = np.full((SIZE, SIZE), 9.0, np.float32)
    if x1 <= x0 or y1 <= y0:
        return out
    dx, dy = _XX[y0:y1, x0:x1] - cx, _YY[y0:y1, x0:x1] - cy
    u = (c * dx + s * dy) / rx
    v = (-s * dx + c * dy) / ry
    out[y0:y1, x0:x1] = np.sqrt(u * u + v * v)
    return out


def disk(cx: float, cy: float, r: float) -> np.ndarray:
    """Boolean disk mask, computed only in its bounding window (placement tries many)."""
    out = np.zeros((SIZE, SIZE), bool)
    x0, x1 = max(0, int(cx - r) - 1), min(SIZE, int(cx + r) + 2)
    y0, y1 = max(0, int(cy - r) - 1), min(SIZE, int(cy + r) + 2)
    yy, xx = _YY[y0:y1, x0:x1], _XX[y0:y1, x0:x1]
    out[y0:y1, x0:x1] = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
    return out


def soft(d: np.ndarray, width: float = 0.06) -> np.ndarray:
    """A smooth 0..1 fill from a normalised radius (1 inside, 0 outside, soft edge)."""
    return np.clip((1.0 - d) / width + 0.5, 0.0, 1.0)


def blur(img: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur with edge padding (no scipy needed)."""
    if sigma <= 0:
        return img
    r = max(1, int(round(3 * sigma)))
    x = np.arange(-r, r + 1, dtype=np.float32)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    k /= k.sum()
    out = img
    for axis in (0, 1):
        pad = [(0, 0), (0, 0)]
        pad[axis] = (r, r)
        p = np.pad(out, pad, mode="edge")
        acc = np.zeros_like(out)
        for i, w in enumerate(k):
            acc += w * (p[i:i + SIZE, :] if axis == 0 else p[:, i:i + SIZE])
        out = acc
    return out


def _j(rng: np.random.Generator, value: float, frac: float = 0.08) -> float:
    """Jitter ``value`` by up to ``frac`` of itself."""
    return float(value * (1.0 + rng.uniform(-frac, frac)))


# -- anatomy -----------------------------------------------------------------------------------
def _ct_abdomen(rng):
    img = np.zeros((SIZE, SIZE), np.float32)
    cx, cy = 128 + rng.uniform(-4, 4), 132 + rng.uniform(-4, 4)
    body_d = ellipse(cx, cy, _j(rng, 112, 0.05), _j(rng, 86, 0.05))
    body = body_d < 1
    img += 70 * soft(body_d)                                  # subcutaneous fat
    inner_d = ellipse(cx, cy + 2, _j(rng, 100, 0.05), _j(rng, 74, 0.05))
    img += 45 * soft(inner_d)                                 # muscle / bowel
    liver_d = ellipse(cx - _j(rng, 42), cy - _j(rng, 14), _j(rng, 46), _j(rng, 38), rng.uniform(-0.4, 0.1))
    spleen_d = ellipse(cx + _j(rng, 66), cy - _j(rng, 12), _j(rng, 18), _j(rng, 26), rng.uniform(-0.5, 0.0))
    rk_d = ellipse(cx - _j(rng, 40), cy + _j(rng, 30), _j(rng, 13), _j(rng, 20), rng.uniform(0.1, 0.4))
    lk_d = ellipse(cx + _j(rng, 40), cy + _j(rng, 30), _j(rng, 13), _j(rng, 20), rng.uniform(-0.4, -0.1))
    aorta_d = ellipse(cx + 8, cy + _j(rng, 30), 8, 8)
    spine_d = ellipse(cx, cy + _j(rng, 56, 0.04), _j(rng, 17), _j(rng, 14))
    canal_d = ellipse(cx, cy + 74, 6, 5)
    organs = {"body": body, "liver": liver_d < 1, "spleen": spleen_d < 1, "right kidney": rk_d < 1,
              "left kidney": lk_d < 1, "aorta": aorta_d < 1, "spine": spine_d < 1}
    for d, level in ((liver_d, 140), (spleen_d, 132), (rk_d, 150), (lk_d, 150), (aorta_d, 175), (spine_d, 225)):
        img = img * (1 - soft(d)) + level * soft(d)
    for d in (rk_d, lk_d):                                    # brighter cortex rim
        rim = soft(d) * (1 - soft(d * 1.45))
        img += 18 * rim
    img = img * (1 - soft(canal_d)) + 60 * soft(canal_d)
    return img, organs, "dark", {"noise": 7.0, "blur": 0.9}


def _mri_brain(rng):
    img = np.zeros((SIZE, SIZE), np.float32)
    cx, cy = 128 + rng.uniform(-3, 3), 128 + rng.uniform(-3, 3)
    rx, ry = _j(rng, 92, 0.05), _j(rng, 112, 0.04)
    head_d = ellipse(cx, cy, rx, ry)
    skull_in_d = ellipse(cx, cy, rx - 9, ry - 9)
    brain_d = ellipse(cx, cy, rx - 12, ry - 12)
    wm_d = ellipse(cx, cy, rx - 24, ry - 26)
    img += 150 * soft(head_d)                                 # scalp
    img = img * (1 - soft(skull_in_d)) + 35 * soft(skull_in_d)  # CSF / inner table
    img = img * (1 - soft(brain_d)) + 100 * soft(brain_d)       # grey matter
    img = img * (1 - soft(wm_d)) + 135 * soft(wm_d)             # white matter
    vent = np.zeros((SIZE, SIZE), bool)
    vent_img = np.zeros((SIZE, SIZE), np.float32)
    for side in (-1, 1):
        vd = ellipse(cx + side * _j(rng, 11), cy - 6, _j(rng, 7), _j(rng, 24), side * rng.uniform(0.1, 0.35))
        vent |= vd < 1
        vent_img = np.maximum(vent_img, soft(vd))
    img = img * (1 - vent_img) + 40 * vent_img
    falx = (np.abs(_XX - cx) < 1.2) & (brain_d < 1) & ~vent
    img[falx] = 60
    brain = brain_d < 1
    organs = {"skull": (head_d < 1) & ~(skull_in_d < 1), "brain": brain, "ventricles": vent,
              # radiological convention: the patient's right hemisphere is on the image's left
              "right hemisphere": brain & (_XX < cx - 2) & ~vent,
              "left hemisphere": brain & (_XX > cx + 2) & ~vent}
    # lesions go in the white matter, where a bright spot cannot pass for cortex
    wm = wm_d < 1
    acq = {"noise": 6.0, "blur": 0.8, "rician": True,
           "regions": {h: organs[h] & wm for h in ("right hemisphere", "left hemisphere")}}
    return img, organs, "bright", acq


def _xray_chest(rng):
    img = np.full((SIZE, SIZE), 25, np.float32)
    cx = 128 + rng.uniform(-3, 3)
    body_d = ellipse(cx, 150, 126, 150)
    img += 95 * soft(body_d)
    rl_d = ellipse(cx - _j(rng, 52), _j(rng, 118, 0.04), _j(rng, 36), _j(rng, 80, 0.05), 0.06)
    ll_d = ellipse(cx + _j(rng, 52), _j(rng, 118, 0.04), _j(rng, 34), _j(rng, 78, 0.05), -0.06)
    lungs = np.maximum(soft(rl_d), soft(ll_d))
    img = img * (1 - lungs) + 45 * lungs
    ribs = np.zeros((SIZE, SIZE), np.float32)
    for k in range(8):                                        # rib arcs over both lungs
        y0 = 52 + 22 * k + rng.uniform(-3, 3)
        curve = y0 + 0.0022 * (_XX - cx) ** 2
        ribs += np.exp(-0.5 * ((_YY - curve) / 2.2) ** 2)
    img += 26 * np.clip(ribs, 0, 1) * soft(body_d)
    heart_d = ellipse(cx + _j(rng, 20), _j(rng, 168, 0.04), _j(rng, 40), _j(rng, 32), rng.uniform(-0.5, -0.2))
    img = img * (1 - soft(heart_d)) + 165 * soft(heart_d)
    spine = (np.abs(_XX - cx) < 11) & (body_d < 1)
    img[spine] = np.maximum(img[spine], 150)
    clav = np.abs(_YY - (44 + 0.18 * np.abs(_XX - cx))) < 3.5   # both clavicles (mirrored)
    clav &= (np.abs(_XX - cx) > 10) & (np.abs(_XX - cx) < 90)
    img[clav] = np.maximum(img[clav], 150)
    heart = heart_d < 1
    organs = {"right lung": (rl_d < 1) & ~heart, "left lung": (ll_d < 1) & ~heart,
              "heart": heart, "spine": spine}
    return img, organs, "bright", {"noise": 5.0, "blur": 1.3}


_DRAW = {"ct_abdomen": _ct_abdomen, "mri_brain": _mri_brain, "xray_chest": _xray_chest}


# -- lesions -----------------------------------------------------------------------------------
def _radii(rng, n: int) -> list[float]:
    """Lesion radii, the largest strictly (>= 2 px) bigger than the others."""
    radii = []
    for _ in range(n):
        band = rng.choice(3, p=[0.4, 0.35, 0.25])
        lo, hi = ((3, 5), (6, 9), (10, 13))[band]
        radii.append(float(rng.integers(lo, hi + 1)))
    if n > 1:
        radii.sort(reverse=True)
        if radii[0] - radii[1] < 2:
            radii[0] = radii[1] + 2
    return radii


def _place(rng, n: int, kind: str, regions: dict[str, np.ndarray]) -> list[Lesion] | None:
    """Place ``n`` lesions wholly inside ``regions[host]``; ``None`` if a placement failed (the
    caller redraws)."""
    lesions: list[Lesion] = []
    hosts = HOSTS[kind]
    for radius in _radii(rng, n):
        contrast = float(rng.uniform(14, 24) if rng.random() < 0.4 else rng.uniform(38, 70))
        host_order = list(rng.permutation(len(hosts)))
        placed = False
        for h in host_order:
            host = hosts[h]
            ys, xs = np.nonzero(regions[host])
            for _ in range(30):
                i = int(rng.integers(len(xs)))
                cx, cy = float(xs[i]) + rng.uniform(-0.5, 0.5), float(ys[i]) + rng.uniform(-0.5, 0.5)
                if min(abs(cx - SIZE / 2), abs(cy - SIZE / 2)) < radius + _MIDLINE_MARGIN:
                    continue
                if any(np.hypot(cx - l.cx, cy - l.cy) < radius + l.radius + 5 for l in lesions):
                    continue
                margin = disk(cx, cy, radius + 2)
                if (margin & ~regions[host]).any():
                    continue
                mask = disk(cx, cy, radius)
                lesions.append(Lesion(host, cx, cy, radius, contrast, mask))
                placed = True
                break
            if placed:
                break
        if not placed:
            return None
    return lesions


def _noise(rng, img: np.ndarray, sigma: float, rician: bool) -> np.ndarray:
    if rician:  # magnitude MRI: |signal + complex noise|
        re = img + rng.normal(0, sigma, img.shape).astype(np.float32)
        im = rng.normal(0, sigma, img.shape).astype(np.float32)
        return np.sqrt(re * re + im * im)
    return img + rng.normal(0, sigma, img.shape).astype(np.float32)


def draw_scene(rng: np.random.Generator, kind: str, n_lesions: int) -> Scene:
    """Draw one phantom of ``kind`` with exactly ``n_lesions`` lesions (0..3)."""
    if kind not in _DRAW:
        raise ValueError(f"expected a phantom kind in {list(KINDS)}, got {kind!r}")
    if not 0 <= n_lesions <= MAX_LESIONS:
        raise ValueError(f"expected 0..{MAX_LESIONS} lesions, got {n_lesions!r}")
    for _ in range(20):
        base, organs, polarity, acq = _DRAW[kind](rng)
        lesions = _place(rng, n_lesions, kind, acq.get("regions", organs))
        if lesions is not None:
            break
    else:  # pragma: no cover - the anatomy leaves ample room; kept as a clear failure
        raise RuntimeError(f"could not place {n_lesions} lesions in a {kind} phantom")
    sign = -1.0 if polarity == "dark" else 1.0
    img = base.copy()
    for l in lesions:  # a soft-edged spot, drawn in its window only
        x0, x1 = max(0, int(l.cx - 2 * l.radius)), min(SIZE, int(l.cx + 2 * l.radius) + 2)
        y0, y1 = max(0, int(l.cy - 2 * l.radius)), min(SIZE, int(l.cy + 2 * l.radius) + 2)
        d = np.hypot(_XX[y0:y1, x0:x1] - l.cx, _YY[y0:y1, x0:x1] - l.cy) / l.radius
        img[y0:y1, x0:x1] += sign * l.contrast * soft(d, width=0.25)
    # a little texture inside organs, then the acquisition: blur and noise
    texture = blur(rng.normal(0, 1, img.shape).astype(np.float32), 2.0) * 14
    img = img + texture * (img > 30)
    img = blur(img, acq["blur"])
    img = _noise(rng, img, acq["noise"], acq.get("rician", False))
    image = np.clip(img, 0, 255).round().astype(np.uint8)
    return Scene(kind=kind, image=image, organs=organs, lesions=lesions)
