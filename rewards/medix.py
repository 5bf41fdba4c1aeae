r"""MediX-R1's composite reward (seed 001, §A.3-A.4):

    r = 0.1 · R_format + 0.045 · R_modality + 0.5175 · R_llm + 0.3375 · R_embed      (in [0, 1])

* ``R_format`` = 1 iff the completion is ``<think>…</think><answer>…</answer>`` with nothing before
  it but (optionally) the modality tag, nothing after it, text in both spans, and no tag nested
  inside them (seed 001 §A.4: 1.0 "only when the output matches the required structure").
* ``R_modality`` = 1 iff the tag before ``<think>`` equals the record's modality (case-insensitive).
  Tags accepted: ``<modality>CT</modality>``, ``[CT]``, ``Modality: CT``; the value is a short
  name (at most four words, no commas): ``modality = CT, also some chatter`` is prose and earns no
  format credit.
* ``R_llm`` = the judge's YES (1) / NO (0) on the answer vs the reference (:mod:`rewards.judge`).
* ``R_embed`` = 1 iff the cosine similarity of answer and reference embeddings is >= 0.8
  (seed's MedEmbed; offline default all-MiniLM-L6-v2).

The answer is the ``<answer>`` span, or the env's parsed ``\boxed{}`` answer when there is none.
When a term cannot be computed -- the judge failed after its retries, or the record has no
modality -- ``on_missing='renormalize'`` (default) drops it and divides by the remaining weights;
``'zero'`` scores it 0; ``'abstain'`` makes the whole total ``None``.

>>> split_medix("<modality>CT</modality><think>dense</think><answer>liver</answer>")
(True, 'CT', 'liver')
>>> split_medix("[MRI] <think>x</think>\n<answer> left kidney </answer>")
(True, 'MRI', 'left kidney')
>>> split_medix("the answer is liver")
(False, None, None)
>>> split_medix("Sure! Here it is: <think>x</think><answer>liver</answer>")   # text before: no format
(False, None, 'liver')
>>> split_medix("<think></think><answer></answer>")                           # empty spans: no format
(False, None, '')
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

from medvqa_env.errors import ConfigError
from rewards.base import RewardFunction, RewardInput, RewardOutput
from rewards.judge import JudgeClient, JudgeConfig

WEIGHTS = {"format": 0.1, "modality": 0.045, "llm": 0.5175, "embed": 0.3375}
_NESTED = re.compile(r"</?(?:think|answer)>")
# A modality tag's value: a short name of at most four words ("CT", "X-Ray", "MRI T2-weighted",
# "Fundus Photography"), no clause: "CT, also some chatter" is prose, not a tag.
_VALUE = r"([A-Za-z0-9][A-Za-z0-9/+\-.]*(?:[ ][A-Za-z0-9/+\-.]+){0,3})"
# the whole text before <think> must be one of these (or nothing)
_TAGS = [re.compile(r"<modality>\s*" + _VALUE + r"\s*</modality>", re.I), re.compile(r"\[\s*" + _VALUE + r"\s*\]"),
         re.compile(r"modality\s*[:=]\s*" + _VALUE, re.I)]


def split_medix(completion: str) -> tuple[bool, str | None, str | None]:
    """``(format_ok, modality_tag, answer)`` of a MediX-style completion. ``answer`` is the last
    ``<answer>`` span even when the format is broken (the semantic terms still read it); the tag
    counts only in a well-formed completion."""
    from medvqa_env.parser import tag_blocks

    text = completion or ""
    spans, _ = tag_blocks(text, "<answer>", "</answer>")
    answer = text[spans[-1][0] + 8:spans[-1][1] - 9].strip() if spans else None
    parts = _medix_parts(text)
    if parts is None:
        return False, None, answer
    pre, think, body = parts
    if _NESTED.search(think) or _NESTED.search(body):
        return False, None, answer
    if not think.strip() or not body.strip():  # the structure needs both spans' content
        return False, None, answer
    pre = pre.strip()
    if not pre:
        return True, None, answer
    for pattern in _TAGS:
        t = pattern.fullmatch(pre)
        if t:
            return True, t.group(1).strip(), answer
    return False, None, answer


def _medix_parts(text: str) -> tuple[str, str, str] | None:
    """``(pre, think, answer)`` of ``pre <think>think</think> <answer>answer</answer>`` (only
    whitespace after), each span ending at its first closing tag; ``None`` if the text is not so.
    What ``^\\s*(.*?)\\s*<think>(.*?)</think>\\s*<answer>(.*?)</answer>\\s*$`` accepts with spans
    free of nested tags, without its backtracking (quadratic on ``"<think>" * n``): any other
    match of that regex puts a tag inside a span or before ``<think>``, which the format refuses.

    >>> _medix_parts(" [CT] <think>t</think>\\n<answer>a</answer> ")
    (' [CT] ', 't', 'a')
    >>> _medix_parts("<think>t</think> x <answer>a</answer>") is None
    True
    """
    i = text.find("<think>")
    j = text.find("</think>", i + 7) if i >= 0 else -1
    if j < 0:
        return None
    k = j + 8
    rest = text[k:].lstrip()
    if not rest.startswith("<answer>"):
        return None
    end = rest.find("</answer>", 8)
    if end < 0 or rest[end + 9:].strip():
        return None
    return text[:i], text[i + 7:j], rest[8:end]


class MediXReward(RewardFunction):
    """The MediX-R1 composite (see module doc). Components: ``format``, ``modality``, ``llm``,
    ``embed``, ``embed_cosine``, ``judge_ok`` and ``accuracy`` (= the judge's verdict).

    Args:
        judge: a :class:`JudgeConfig`, its fields as a dict, or a :class:`JudgeClient`; None reads
            ``MEDVQA_JUDGE_URL`` (and ``MEDVQA_JUDGE_MODEL``).
        embed_model: local sentence-transformers folder (seed: MedEmbed); None = MiniLM.
        embed_threshold: cosine at or above which ``R_embed`` = 1 (seed: 0.8).
        weights: override any of ``format``, ``modality``, ``llm``, ``embed``.
        on_missing: ``'renormalize'``, ``'zero'`` or ``'abstain'`` (see module doc).
        embed_encoder: an existing :class:`rewards.encoders.SentenceEncoder` to share.
    """

    name = "medix"

    def __init__(self, judge: JudgeConfig | Mapping[str, Any] | JudgeClient | None = None,
                 embed_model: str | None = None, embed_threshold: float = 0.8,
                 weights: Mapping[str, float] | None = None, on_missing: str = "renormalize",
                 device: str = "cpu", embed_encoder: Any = None) -> None:
        if judge is None:
            url = os.environ.get("MEDVQA_JUDGE_URL")
            if not url:
                raise ConfigError("the medix reward needs a judge: build_reward('medix', judge={'base_url': "
                                  "'http://127.0.0.1:8011', 'model': ...}) or set MEDVQA_JUDGE_URL")
            judge = {"base_url": url, "model": os.environ.get("MEDVQA_JUDGE_MODEL", "judge")}
        if isinstance(judge, Mapping):
            judge = JudgeConfig(**judge)
        self.judge = judge if isinstance(judge, JudgeClient) else JudgeClient(judge)
        unknown = set(weights or {}) - set(WEIGHTS)
        if unknown:
            raise ConfigError(f"expected weights among {sorted(WEIGHTS)}, got {sorted(unknown)!r}")
        self.weights = {**WEIGHTS, **(weights or {})}
        if on_missing not in ("renormalize", "zero", "abstain"):
            raise ConfigError(f"expected on_missing in ['abstain', 'renormalize', 'zero'], got {on_missing!r}")
        self.on_missing = on_missing
        self.embed_threshold = float(embed_threshold)
        from rewards.encoders import SentenceEncoder

        # loads on first use; ``embed_encoder`` shares an existing SentenceEncoder
        self.encoder = embed_encoder or SentenceEncoder(embed_model, device=device)

    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        if not batch:
            return []
        from rewards.encoders import cosine

        parsed = [split_medix(s.completion) for s in batch]
        answers = [a if a is not None else (s.answer or "") for (_, _, a), s in zip(parsed, batch)]
        verdicts = self.judge.judge([(str(s.metadata.get("question", "")), a, s.ground_truth)
                                     for s, a in zip(batch, answers)])
        vecs = self.encoder.encode(answers + [s.ground_truth for s in batch])
        out = []
        for i, s in enumerate(batch):
            ok, tag, _ = parsed[i]
            has_answer = bool(answers[i].strip())
            cos = cosine(vecs[i], vecs[len(batch) + i]) if has_answer else 0.0
            truth_modality = s.metadata.get("modality")
            terms: dict[str, float | None] = {
                "format": float(ok),
                "modality": (float(tag is not None and tag.strip().lower() == str(truth_modality).strip().lower())
                             if truth_modality else None),
                "llm": verdicts[i].score if has_answer else 0.0,
                "embed": float(cos >= self.embed_threshold),
            }
            out.append(self._combine(terms, cos, verdicts[i].error is None or not has_answer))
        return out

    def _combine(self, terms: Mapping[str, float | None], cos: float, judge_ok: bool) -> RewardOutput:
        comps = {k: v for k, v in terms.items() if v is not None}
        comps.update({"embed_cosine": cos, "judge_ok": float(judge_ok)})
        if terms["llm"] is not None:
            comps["accuracy"] = terms["llm"]
        missing = [k for k, v in terms.items() if v is None]
        if missing and self.on_missing == "abstain":
            return RewardOutput(None, comps)
        if self.on_missing == "zero":
            total = sum(self.weights[k] * (v or 0.0) for k, v in terms.items())
        else:
            present = {k: v for k, v in terms.items() if v is not None}
            mass = sum(self.weights[k] for k in present)
            total = sum(self.weights[k] * v for k, v in present.items()) / mass if mass > 0 else 0.0
        return RewardOutput(total, comps)
