"""Per-episode scoring: what one finished episode is worth, by the seeds' definitions.

* CLOSED / MCQ: ``correct`` = the rule match (``rewards.rule.answer_matches``: letter parsing for
  MCQ, loose yes/no for CLOSED), as in seed 000 §6.2 ("accuracy").
* OPEN: the four raw ARMed metrics (BLEU-1, ROUGE-1, BERTScore, CosSim; :class:`OpenMetrics`)
  and ``armed_avg`` = their mean (seed 000 §6.2); ``correct`` = normalised exact match, which is
  what pass@K counts for open answers. A missing prediction scores 0 on all four.
* every type: ``exact_match`` (normalised, yes/no synonyms folded) and ``format_ok``.
* several accepted answers (``metadata["answer_alternatives"]``, VQA-Med's ``#``): the best over
  them, as the official VQA-Med evaluations score (:mod:`rewards.alternatives`): correct and exact
  match if any alternative matches, each open metric its maximum over the alternatives, and
  ``armed_avg`` the mean of those maxima. ``correct`` and ``exact_match`` come from
  :mod:`rewards.matching`, the rule the env's rewards use.
* a reference the encoders' vocabulary does not cover (Chinese with the default MiniLM): no
  ``bertscore``/``cossim`` in the row (an ``[UNK]`` encoding cannot tell right from wrong) and
  ``armed_avg`` is the mean of BLEU-1 and ROUGE-1, which are computed on characters for CJK.

Tool-use statistics come from the episode trace (:func:`tool_stats`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from medvqa_env.errors import ToolError
from medvqa_env.records import AnswerType, VQARecord

OPEN_METRICS = ("bleu1", "rouge1", "bertscore", "cossim")
METRIC_DIGITS = 6  # open metrics are rounded to this many decimals (float32 encoders hold no more)

# Parser messages (medvqa_env.parser) that mean a <tool_call> block could not be read.
_MALFORMED_CALL_MARKERS = ("<tool_call>", "in the arguments of", '"arguments" of')


def is_invalid_call(call: Mapping[str, Any], tool_specs: Mapping[str, Any]) -> bool:
    """A call to an unknown tool, or with arguments that fail the tool's JSON schema."""
    from tool_backends.base import validate_arguments

    spec = tool_specs.get(call.get("name"), False)
    if spec is False:
        return True
    if spec is None:
        return False
    try:
        validate_arguments(spec, call.get("arguments"))
    except ToolError:
        return True
    return False


def tool_stats(trace: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Count an episode's tool calls from its trace (turns with ``parsed`` and ``tool_calls``).

    ``calls``: calls dispatched to the toolbox; ``by_tool``: the same per name; ``malformed``:
    ``<tool_call>`` blocks the parser could not read; ``invalid``: malformed blocks plus calls
    flagged ``invalid`` (unknown tool or arguments failing the schema, see
    :func:`is_invalid_call`); ``errors``: valid calls whose tool failed (timeout, crash, refusal).

    >>> t = [{"parsed": {"errors": ["Invalid JSON in <tool_call>: x."]}, "tool_calls": [
    ...       {"name": "zoom", "arguments": {}, "error": "Unknown tool 'zoom'.", "invalid": True},
    ...       {"name": "image_zoom_in", "arguments": {}, "error": "server timed out", "invalid": False}]}]
    >>> s = tool_stats(t)
    >>> s["calls"], s["malformed"], s["invalid"], s["errors"], s["by_tool"]["zoom"]
    (2, 1, 2, 1, 1)
    """
    stats: dict[str, Any] = {"calls": 0, "by_tool": {}, "malformed": 0, "invalid": 0, "errors": 0}
    for turn in trace:
        errors = (turn.get("parsed") or {}).get("errors") or ()
        malformed = sum(1 for e in errors if any(m in e for m in _MALFORMED_CALL_MARKERS) and "not run" not in e)
        stats["malformed"] += malformed
        stats["invalid"] += malformed
        for call in turn.get("tool_calls") or ():
            name = str(call.get("name"))
            stats["calls"] += 1
            stats["by_tool"][name] = stats["by_tool"].get(name, 0) + 1
            if call.get("invalid"):
                stats["invalid"] += 1
            elif call.get("error"):
                stats["errors"] += 1
    return stats


class OpenMetrics:
    """The four raw ARMed metrics for a batch of (prediction, reference) pairs.

    No metric code of its own: BLEU-1 and ROUGE-1 come from :func:`rewards.text_metrics.lexical_scores`,
    BERTScore and CosSim from :meth:`rewards.armed.ARMedReward.semantic_scores` -- the very functions
    the ARMed training reward uses, *without* its adaptive thresholds (seed 000 §6.2 averages the
    raw scores). ``options`` are :class:`rewards.armed.ARMedConfig` fields (``bertscore_model``,
    ``bertscore_layers``, ``cosine_model``, ``stem``, ``device``); the defaults are the offline
    MiniLM encoders. Raises :class:`ImportError` when the ``rewards`` extra is not installed.
    """

    def __init__(self, **options: Any) -> None:
        from rewards.armed import ARMedReward
        from rewards.text_metrics import lexical_scores

        self.options = dict(options)
        self._lexical = lexical_scores
        self._armed = ARMedReward(**self.options)

    def __call__(self, predictions: Sequence[str], references: Sequence[str | Sequence[str]]) -> list[dict[str, float]]:
        """One row of metrics per prediction; a reference may be a list of accepted answers, each
        metric then being its best over them (the official VQA-Med evaluations' max)."""
        if len(predictions) != len(references):
            raise ValueError(f"expected as many predictions as references, got {len(predictions)} and {len(references)}")
        if not predictions:
            return []
        owner, preds, refs = [], [], []
        for i, (p, ref) in enumerate(zip(predictions, references)):
            for r in ([ref] if isinstance(ref, str) else list(ref) or [""]):
                owner.append(i)
                preds.append(p or "")
                refs.append(r)
        bleu, rouge = self._lexical(preds, refs, stem=bool(self.options.get("stem", False)))
        bert, cos = self._armed.semantic_scores(preds, refs)
        rows: list[dict[str, float]] = [{} for _ in predictions]
        for j, i in enumerate(owner):
            for name, value in zip(OPEN_METRICS, (bleu[j], rouge[j], bert[j], cos[j])):
                if value is not None:  # None: the encoders cannot read this reference
                    rows[i][name] = max(rows[i].get(name, float("-inf")), float(value))
        for row in rows:
            present = [m for m in OPEN_METRICS if m in row]
            row["armed_avg"] = sum(row[m] for m in present) / len(present)
            # float32 encoders: 1.00000003 or 0.99999994 for identical texts; 6 digits is what they hold
            row.update({k: round(min(1.0, v), METRIC_DIGITS) for k, v in row.items()})
        return rows


def score_episode(record: VQARecord, answer: str | None, format_ok: bool) -> dict[str, Any]:
    """Correctness of one final answer (see the module docstring). For OPEN questions
    ``needs_open_metrics`` asks the caller to fill ``metrics`` (batched, with :class:`OpenMetrics`,
    which scores a missing answer 0 on all four).

    >>> from medvqa_env.records import VQARecord
    >>> rec = VQARecord("q", ("x.png",), "Is it normal?", "yes", "CLOSED", "demo")
    >>> s = score_episode(rec, "Yes.", True)
    >>> s["correct"], s["exact_match"], s["metrics"]
    (True, True, {})
    """
    from rewards.matching import exact_match_any, matches, references

    refs = references(record.answer, record.metadata)
    em = exact_match_any(answer, refs)
    out: dict[str, Any] = {"answer": answer, "exact_match": bool(em), "format_ok": bool(format_ok), "metrics": {}}
    if len(refs) > 1:
        out["references"] = refs
    if record.answer_type is AnswerType.OPEN:
        out["correct"] = bool(em)
        out["needs_open_metrics"] = True
    else:
        out["correct"] = matches(answer, record.answer, record.answer_type, record.options, refs[1:])
    return out


class EpisodeScorer:
    """The harness's per-episode scoring, run inside the env workers beside the envs
    (:class:`medvqa_env.pool.PoolSpec` ``episode_hook="eval.scoring:EpisodeScorer"``), so it runs in
    parallel with the other workers and the agent.

    Per step it flags each tool call ``invalid`` (:func:`is_invalid_call`); when an episode ends it
    adds ``out["score"]`` (:func:`score_episode`). An OPEN episode's score keeps
    ``needs_open_metrics``: the harness measures those in its own process, where the encoders are
    loaded once per run (:meth:`eval.runner.Runner._measure_open`), not once per worker.
    """

    def __init__(self, toolbox: Any) -> None:
        self.tool_specs = {s.name: s for s in toolbox.specs}

    def on_step(self, env: Any, out: dict[str, Any]) -> None:
        info = out["info"]
        for call in info.get("tool_calls", ()):
            call["invalid"] = is_invalid_call(call, self.tool_specs)
        if out["terminated"] or out["truncated"]:
            out["score"] = score_episode(env.record, info.get("answer"), bool(info.get("format_ok")))

    def on_batch(self, outs: list[dict[str, Any]]) -> None:
        """Nothing per command list: the batched work (open-answer metrics) is the harness's."""
