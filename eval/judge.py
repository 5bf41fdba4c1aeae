"""The optional LLM judge of seed 000 §6.3: a *lenient* rubric answered as JSON
``{"correct": bool, "reason": str}``, through any OpenAI-compatible endpoint.

Transport (timeouts, retries with backoff, API key from an environment variable, caching) is
:class:`rewards.judge.JudgeClient`; this module only supplies the rubric and reads the JSON reply.
A reply that cannot be read, or a request that fails or times out, raises :class:`JudgeError`,
which the runner records per episode as ``judge_error`` (the episode itself is kept).

>>> parse_judge_reply('```json\\n{"correct": true, "reason": "same organ"}\\n```')
{'correct': True, 'reason': 'same organ'}
>>> parse_judge_reply('{"correct": "false", "reason": "different side"}')["correct"]
False
"""

from __future__ import annotations

import json
import re
from typing import Any

from medvqa_env.errors import MedVQAError

LENIENT_RUBRIC = (
    "You are a lenient grader for medical visual question answering. Decide whether the predicted "
    "answer is correct for the question, given the ground-truth answer.\n"
    "Count it as correct when it means the same as the ground truth, including:\n"
    "- the same answer in another language (e.g. Chinese and English);\n"
    "- a more specific term that is a kind of the ground truth (IS-A specialisation, e.g. "
    "'left lower lobe' for 'lung');\n"
    "- for a ground truth listing several items, a prediction that names at least one of them;\n"
    "- synonyms, abbreviations, spelling variants and extra harmless words.\n"
    "Yes/no answers must agree in polarity. A different finding, organ, side or modality is wrong.\n\n"
    "Question: {question}\nGround truth: {reference}\nPrediction: {prediction}\n\n"
    'Reply with only a JSON object: {{"correct": true or false, "reason": "<one short sentence>"}}'
)

_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)
_CORRECT = re.compile(r'"?correct"?\s*[:=]\s*"?(true|false)"?', re.I)


class JudgeError(MedVQAError):
    """The judge endpoint failed, timed out, or replied with something that is not a verdict."""


def parse_judge_reply(text: str) -> dict[str, Any]:
    """``{"correct": bool, "reason": str}`` from a judge's reply (JSON, possibly fenced or
    sloppy); raises :class:`JudgeError` when no verdict can be read."""
    for m in _OBJECT.finditer(text or ""):
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "correct" in obj:
            value = obj["correct"]
            if isinstance(value, str):
                value = value.strip().lower() in ("true", "yes", "1")
            return {"correct": bool(value), "reason": str(obj.get("reason", ""))}
    m = _CORRECT.search(text or "")
    if m:
        return {"correct": m.group(1).lower() == "true", "reason": ""}
    raise JudgeError(f"the judge's reply holds no verdict: {(text or '')[:120]!r}")


class LenientJudge:
    """``judge(question, ground_truth, prediction) -> {"correct", "reason"}`` (see the module doc).

    Args mirror :class:`rewards.judge.JudgeConfig`: ``base_url`` of the server, ``model`` name,
    ``api_key_env`` (the variable holding the key; never the key itself), ``timeout_s``,
    ``max_retries``; ``max_connections`` bounds the HTTP pool the runner's judge threads share.
    """

    def __init__(self, base_url: str, model: str = "gpt-5", api_key_env: str | None = "OPENAI_API_KEY",
                 timeout_s: float = 60.0, max_retries: int = 2, max_tokens: int = 200,
                 max_connections: int = 16) -> None:
        from rewards.judge import JudgeClient, JudgeConfig

        self.config = JudgeConfig(base_url=base_url, model=model, api_key_env=api_key_env, timeout_s=timeout_s,
                                  max_retries=max_retries, max_tokens=max_tokens, prompt=LENIENT_RUBRIC,
                                  max_concurrency=max_connections)  # the runner's threads share it
        self.client = JudgeClient(self.config)

    def __call__(self, question: str, ground_truth: str, prediction: str) -> dict[str, Any]:
        verdict = self.client.judge([(question, prediction, ground_truth)])[0]
        if verdict.error is not None:
            raise JudgeError(verdict.error)
        return parse_judge_reply(verdict.raw)

    def describe(self) -> dict[str, Any]:
        return {"endpoint": self.config.endpoint, "model": self.config.model, "rubric": "lenient-json"}

    def close(self) -> None:
        self.client.close()


def build_judge(base_url: str, model: str = "gpt-5", timeout_s: float = 60.0,
                api_key_env: str | None = "OPENAI_API_KEY", max_retries: int = 2, max_tokens: int = 200) -> LenientJudge:
    return LenientJudge(base_url, model=model, api_key_env=api_key_env, timeout_s=timeout_s, max_retries=max_retries,
                        max_tokens=max_tokens)
