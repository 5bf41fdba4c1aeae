r"""GRASP's reward (seed 002, §3.1 and Appendix A):

    r = EM + w_syn · clip(BERTScore_F1, 0, 1) + w_img · clip(cos(CLIP(image), CLIP(reasoning)), 0, 1) + penalty

* ``EM`` = 2 for a normalised exact match, else 0 -- the main training signal.
* Synonym similarity: BERTScore F1 of answer vs gold (seed: Bio_ClinicalBERT; offline default
  all-MiniLM-L6-v2 through :class:`rewards.encoders.TokenEncoder`, equal to ``bert-score``).
* Image-reasoning similarity: CLIP cosine between the first image and the reasoning text (the
  ``<think>`` span, else the completion without the final answer). The seed uses BiomedCLIP, an
  open_clip model we cannot install here; ``clip_model`` takes any transformers ``CLIPModel``
  folder. **Without one the term is off** (no component, nothing added; a warning says so): no
  trained CLIP ships offline, and an untrained one would add noise to every reward.
  ``clip_model="tiny-random-clip"`` asks for a randomly initialised 2-layer CLIP built from a config
  (seed 0) with the MiniLM tokenizer explicitly -- it exercises the code path in tests, its scores
  mean nothing.
* Format penalties: ``-1`` when there is no final answer, ``-0.5`` when the format is broken.

The paper says the similarity terms are "clipped as specified" without the numbers; the weights
(``w_syn=0.5``, ``w_img=0.25``) and the clip to [0, 1] are our choices (docs/rewards.md).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from rewards.base import RewardFunction, RewardInput, RewardOutput
from rewards.matching import exact_match_any, references

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
TINY_RANDOM_CLIP = "tiny-random-clip"
log = logging.getLogger(__name__)


def reasoning_text(completion: str) -> str:
    """The ``<think>`` span if any, else the completion without its final-answer markup
    (``\\boxed{...}`` up to its first ``}``, ``<answer>...</answer>``). Linear in the length: a
    policy's completion is hostile input (``"<think>" * n`` was quadratic with the regexes).

    >>> reasoning_text("a <think> b  c </think> d"), reasoning_text(r"x \\boxed{y} z <answer>w</answer>")
    ('b c', 'x z')
    """
    from medvqa_env.parser import cut_blocks, tag_blocks

    text = completion or ""
    spans, _ = tag_blocks(text, "<think>", "</think>")
    if spans:
        a, b = spans[0]
        text = text[a + len("<think>"):b - len("</think>")]
    else:
        text = cut_blocks(cut_blocks(text, "\\boxed{", "}"), "<answer>", "</answer>")
    return " ".join(text.split())


class ImageTextScorer:
    """CLIP image-text cosine, lazily loaded from ``model_path`` (a transformers ``CLIPModel``
    folder) or, for ``"tiny-random-clip"``, an untrained CLIP built from a config."""

    def __init__(self, model_path: str, device: str = "cpu") -> None:
        if not model_path:
            raise ValueError(f"expected a CLIP checkpoint folder or {TINY_RANDOM_CLIP!r}, got {model_path!r}")
        self.model_path = model_path
        self.device = device
        self._model = self._tokenizer = None

    @property
    def name(self) -> str:
        return self.model_path

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_model": None, "_tokenizer": None}

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from transformers import AutoTokenizer, CLIPConfig, CLIPModel

        if self.model_path != TINY_RANDOM_CLIP:
            self._model = CLIPModel.from_pretrained(self.model_path)
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        else:
            from rewards.encoders import default_model_path

            self._tokenizer = AutoTokenizer.from_pretrained(default_model_path())
            config = CLIPConfig(
                text_config={"vocab_size": self._tokenizer.vocab_size, "hidden_size": 32, "intermediate_size": 64,
                             "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 77,
                             "bos_token_id": self._tokenizer.cls_token_id, "eos_token_id": self._tokenizer.sep_token_id,
                             "pad_token_id": self._tokenizer.pad_token_id},
                vision_config={"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64,
                               "num_hidden_layers": 2, "num_attention_heads": 2},
                projection_dim=16)
            torch.manual_seed(0)
            self._model = CLIPModel(config)
        self._model.eval().to(self.device)

    def _pixels(self, path: str) -> np.ndarray:
        from PIL import Image

        size = self._model.config.vision_config.image_size
        with Image.open(path) as im:
            im = im.convert("RGB").resize((size, size), Image.BICUBIC)
        a = (np.asarray(im, dtype=np.float32) / 255.0 - CLIP_MEAN) / CLIP_STD
        return a.transpose(2, 0, 1).astype(np.float32)

    def scores(self, image_paths: Sequence[str | None], texts: Sequence[str]) -> list[float | None]:
        """Cosine per (image, text); ``None`` where the image is missing or unreadable."""
        import torch

        self._load()
        ok, pixels = [], []
        for i, p in enumerate(image_paths):
            if not p:
                continue
            try:
                pixels.append(self._pixels(p))
                ok.append(i)
            except (OSError, ValueError):  # missing or corrupt image: the term is absent
                continue
        out: list[float | None] = [None] * len(texts)
        if not ok:
            return out
        max_len = min(77, int(self._model.config.text_config.max_position_embeddings))
        with torch.inference_mode():
            enc = self._tokenizer([texts[i] or "" for i in ok], padding=True, truncation=True,
                                  max_length=max_len, return_tensors="pt")
            t = self._model.get_text_features(input_ids=enc["input_ids"].to(self.device),
                                              attention_mask=enc["attention_mask"].to(self.device))
            v = self._model.get_image_features(pixel_values=torch.from_numpy(np.stack(pixels)).to(self.device))
            t = t.pooler_output if hasattr(t, "pooler_output") else t
            v = v.pooler_output if hasattr(v, "pooler_output") else v
            sims = torch.nn.functional.cosine_similarity(t, v, dim=-1).tolist()
        for i, s in zip(ok, sims):
            out[i] = float(s)
        return out


class GRASPReward(RewardFunction):
    """GRASP's reward (see module doc). Components: ``exact_match``, ``synonym``, ``image_reasoning``
    (only with ``clip_model`` and an image), ``format_penalty``, ``accuracy``."""

    name = "grasp"

    def __init__(self, w_syn: float = 0.5, w_img: float = 0.25, em_value: float = 2.0,
                 no_answer_penalty: float = -1.0, bad_format_penalty: float = -0.5,
                 bertscore_model: str | None = None, bertscore_layers: int = 6,
                 clip_model: str | None = None, device: str = "cpu", token_encoder: Any = None) -> None:
        from rewards.encoders import TokenEncoder

        self.w_syn, self.w_img, self.em_value = float(w_syn), float(w_img), float(em_value)
        self.no_answer_penalty, self.bad_format_penalty = float(no_answer_penalty), float(bad_format_penalty)
        self.encoder = token_encoder or TokenEncoder(bertscore_model, bertscore_layers, device=device)
        self.clip = ImageTextScorer(clip_model, device=device) if clip_model and self.w_img else None
        if self.clip is None and self.w_img:
            log.warning("GRASP reward: the image-reasoning term is off (no CLIP checkpoint given; pass "
                        "clip_model='/path/to/clip' to turn it on)")

    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        if not batch:
            return []
        from rewards.encoders import bertscore_f1

        answers = [s.answer or "" for s in batch]
        enc = self.encoder.encode(answers + [s.ground_truth for s in batch])
        syn = [bertscore_f1(enc[i], enc[len(batch) + i]) if answers[i].strip() else 0.0 for i in range(len(batch))]
        images = [(list(s.metadata.get("image_paths") or []) or [None])[0] for s in batch]
        img = (self.clip.scores(images, [reasoning_text(s.completion) for s in batch]) if self.clip is not None
               else [None] * len(batch))
        out = []
        for i, s in enumerate(batch):
            em = self.em_value if exact_match_any(s.answer, references(s.ground_truth, s.metadata)) else 0.0
            penalty = self.no_answer_penalty if s.answer is None else (0.0 if s.format_ok else self.bad_format_penalty)
            syn_term = min(max(syn[i], 0.0), 1.0)
            comps = {"exact_match": em, "synonym": syn_term, "format_penalty": penalty, "accuracy": float(em > 0)}
            total = em + self.w_syn * syn_term + penalty
            if img[i] is not None:
                comps["image_reasoning"] = min(max(img[i], 0.0), 1.0)
                total += self.w_img * comps["image_reasoning"]
            out.append(RewardOutput(total, comps))
        return out
