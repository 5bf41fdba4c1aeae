"""Baseline agents: floors and ceilings for every benchmark table.

* :class:`RandomAgent` -- random tool calls and random answers of the right type (seeded).
* :class:`AnswerPriorAgent` -- the most common training answer for the question's answer type and
  opening words (``fit(train_dataset)`` first): what a blind model gets from dataset bias.
* :class:`ToolThenAnswerAgent` -- zooms into the centre (and segments/grounds when those tools are
  offered), then answers from the tools' text with simple rules, falling back to the prior.
* :class:`OracleAgent` -- answers the ground truth (after zooming into the annotated region when
  there is one). It reads the dataset's answers, so it is an **upper bound**, never a model.

All of them write turns in the env's own text protocol (``<tool_call>`` JSON, ``\\boxed{}`` or
``<answer>``), so they exercise exactly the parser and tools a model would.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from agents.base import Agent
from agents.classifier_labels import ClassifierPlan, classifier_plan, means_yes
from medvqa_env.chat import Conversation
from medvqa_env.records import AnswerType, VQADataset, VQARecord
from tool_backends.classify import fold_label

YES_NO = ("yes", "no")
OPEN_FALLBACK = ("normal", "left", "right", "ct", "mri", "x-ray", "brain", "chest", "abdomen", "lung")
_WORD_RE = re.compile(r"[a-z0-9]+")
_NEGATIVE_RE = re.compile(r"\b(no|not|none|nothing|absent|without|negative|empty)\b", re.IGNORECASE)


# ----------------------------------------------------------------------------------------------
# Turn formatting shared by the rule-based agents (and the SB3 wrapper).
# ----------------------------------------------------------------------------------------------
def answer_protocol_of(conversation: Conversation) -> str:
    """``"xml"`` when the system prompt asks for ``<answer>`` tags, else ``"boxed"``."""
    system = conversation.info.get("system_prompt") or ""
    return "xml" if "<answer>" in system and "\\boxed" not in system else "boxed"


def format_answer(answer: str, protocol: str = "boxed") -> str:
    r"""A final-answer turn in the env's protocol.

    >>> format_answer("yes")
    '\\boxed{yes}'
    >>> format_answer("no", "xml")
    '<think>baseline</think><answer>no</answer>'
    """
    if protocol == "xml":
        return f"<think>baseline</think><answer>{answer}</answer>"
    if protocol != "boxed":
        raise ValueError(f"expected protocol 'boxed' or 'xml', got {protocol!r}")
    return "\\boxed{" + answer + "}"


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A ``<tool_call>`` block (Hermes/Qwen form).

    >>> format_tool_call("image_zoom_in", {"bbox": [0, 0, 1, 1]})
    '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 1, 1]}}</tool_call>'
    """
    return "<tool_call>" + json.dumps({"name": name, "arguments": dict(arguments)}) + "</tool_call>"


def fill_arguments(parameters: Mapping[str, Any], box: Sequence[float], image_size: tuple[int, int],
                   text: str = "lesion", labels: Sequence[str] = ()) -> dict[str, Any]:
    """Arguments for any tool schema: ``box`` (normalised ``[x0, y0, x1, y1]``) goes into box-like
    arrays (as fractions when the tool takes ``coordinates``, else as pixels) when the box is
    required or the tool needs no text; ``text`` into string arguments, ``labels`` into string
    lists (padded to ``minItems``); other required arguments get their default, first enum value
    or minimum.

    >>> schema = {"properties": {"bbox": {"type": "array"}, "coordinates": {"type": "string",
    ...           "enum": ["pixel", "normalized"]}}, "required": ["bbox"]}
    >>> fill_arguments(schema, [0.25, 0.25, 0.75, 0.75], (100, 40))
    {'bbox': [0.25, 0.25, 0.75, 0.75], 'coordinates': 'normalized'}
    >>> fill_arguments({"properties": {"bbox": {"type": "array"}}}, [0, 0, 0.5, 0.5], (100, 40))
    {'bbox': [0, 0, 50, 20]}
    >>> fill_arguments({"properties": {"labels": {"type": "array", "items": {"type": "string"}, "minItems": 2},
    ...                 "bbox": {"type": "array"}}, "required": ["labels"]}, [0, 0, 1, 1], (9, 9), labels=["CT"])
    {'labels': ['CT', 'normal']}
    """
    props = parameters.get("properties", {}) or {}
    required = set(parameters.get("required", ()) or ())
    normalized = "normalized" in (props.get("coordinates", {}).get("enum") or ())
    w, h = image_size
    pixel_box = [round(box[0] * w), round(box[1] * h), round(box[2] * w), round(box[3] * h)]
    needs_text = any(props.get(k, {}).get("type") in ("string", "array") and not _is_box(k, props.get(k, {}))
                     for k in required)
    out: dict[str, Any] = {}
    for key, sub in props.items():
        if _is_box(key, sub):
            if key in required or not needs_text:
                out[key] = [round(v, 4) for v in box] if normalized else pixel_box
                if normalized:
                    out["coordinates"] = "normalized"
        elif key in required:
            out[key] = _placeholder(sub, text, labels)
    return out


def _is_box(key: str, schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "array" and (schema.get("minItems") == 4 or key in ("bbox", "box", "region"))


def _placeholder(schema: Mapping[str, Any], text: str, labels: Sequence[str] = ()) -> Any:
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "string":
        return text[: int(schema.get("maxLength", 200))]
    if kind == "array":
        if schema.get("items", {}).get("type") != "string":
            return []
        values = list(dict.fromkeys(labels or [text]))
        for filler in ("normal", "other", "none", "unknown"):
            if len(values) >= int(schema.get("minItems", 1)):
                break
            if filler not in values:
                values.append(filler)
        return values[: int(schema.get("maxItems", len(values)))]
    if kind in ("number", "integer"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return {}


def question_key(question: str, n_words: int) -> str:
    """The question's first ``n_words`` lower-case words: a crude, label-free question type.

    >>> question_key("Is there a PNEUMOTHORAX?", 2)
    'is there'
    """
    return " ".join(_WORD_RE.findall(question.lower())[:n_words])


def normalize_answer(answer: str) -> str:
    return " ".join(_WORD_RE.findall(answer.lower())) or answer.strip().lower()


def observations(conversation: Conversation) -> list[str]:
    """The texts of every message after the first user turn (the tools' answers)."""
    texts = []
    first_user = next(i for i, m in enumerate(conversation.messages) if m["role"] == "user")
    for m in conversation.messages[first_user + 1:]:
        if m["role"] in ("user", "tool"):
            content = m["content"]
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if p.get("type") == "text")
            texts.append(str(content))
    return texts


def _stable_rng(seed: int, *parts: Any) -> np.random.Generator:
    """An RNG that depends only on ``seed`` and ``parts`` (not on batch order or concurrency)."""
    digest = hashlib.blake2b(repr((seed,) + parts).encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def _tools_of(conversation: Conversation) -> list[dict[str, Any]]:
    return [t["function"] if "function" in t else t for t in conversation.info.get("tools") or ()]


def _takes_labels(tool: Mapping[str, Any]) -> bool:
    """A classifier: the tool takes a ``labels`` array of strings."""
    labels = (tool.get("parameters") or {}).get("properties", {}).get("labels") or {}
    return labels.get("type") == "array" and (labels.get("items") or {}).get("type") == "string"


# ----------------------------------------------------------------------------------------------
class RandomAgent(Agent):
    """Calls a random tool with random arguments with probability ``p_tool`` (at most
    ``max_tool_turns`` times), otherwise answers at random: yes/no, an option letter, or a word
    from ``open_vocabulary``. The draw depends only on ``seed``, the record and the turn."""

    name = "random"

    def __init__(self, seed: int = 0, p_tool: float = 0.5, max_tool_turns: int = 2,
                 open_vocabulary: Sequence[str] = OPEN_FALLBACK) -> None:
        if not 0.0 <= p_tool <= 1.0:
            raise ValueError(f"expected p_tool in [0, 1], got {p_tool!r}")
        if not open_vocabulary:
            raise ValueError("expected a non-empty open_vocabulary")
        self.seed, self.p_tool, self.max_tool_turns = int(seed), float(p_tool), int(max_tool_turns)
        self.open_vocabulary = tuple(open_vocabulary)

    def act(self, conversation: Conversation) -> str:
        rng = _stable_rng(self.seed, conversation.info.get("record_id"), conversation.info.get("question"),
                          conversation.turns)
        tools = _tools_of(conversation)
        if tools and conversation.turns < self.max_tool_turns and rng.random() < self.p_tool:
            tool = tools[int(rng.integers(len(tools)))]
            x0, y0 = rng.uniform(0.0, 0.7, size=2)
            side = rng.uniform(0.2, 0.6)
            box = [float(x0), float(y0), float(min(1.0, x0 + side)), float(min(1.0, y0 + side))]
            size = conversation.images[0].size if conversation.images else (1, 1)
            return format_tool_call(tool["name"], fill_arguments(tool.get("parameters", {}), box, size))
        return format_answer(self._random_answer(conversation, rng), answer_protocol_of(conversation))

    def _random_answer(self, conversation: Conversation, rng: np.random.Generator) -> str:
        kind = conversation.answer_type
        options = conversation.info.get("options") or {}
        if kind == AnswerType.MCQ.value and options:
            return str(rng.choice(sorted(options)))
        if kind == AnswerType.CLOSED.value:
            return str(rng.choice(YES_NO))
        return str(rng.choice(self.open_vocabulary))

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "p_tool": self.p_tool, "max_tool_turns": self.max_tool_turns}


# ----------------------------------------------------------------------------------------------
class AnswerPriorAgent(Agent):
    """Answers the most common training answer for the question's answer type and opening words.

    ``fit(dataset)`` counts answers under keys ``(answer_type, first k words)`` for
    ``k = max_words..1`` and ``(answer_type,)``; at answer time the most specific key seen at least
    ``min_count`` times wins. MCQ answers are counted as letters. Unfitted, it answers "yes" /
    the first option / "normal".
    """

    name = "prior"

    def __init__(self, max_words: int = 3, min_count: int = 3) -> None:
        if max_words < 0 or min_count < 1:
            raise ValueError(f"expected max_words >= 0 and min_count >= 1, got {max_words!r}, {min_count!r}")
        self.max_words, self.min_count = int(max_words), int(min_count)
        self.counts: dict[tuple[str, ...], Counter] = {}
        self.fitted_on: str | None = None

    def fit(self, dataset: VQADataset | Iterable[VQARecord]) -> "AnswerPriorAgent":
        counts: dict[tuple[str, ...], Counter] = defaultdict(Counter)
        n = 0
        for record in dataset:
            answer = record.answer.strip().upper() if record.answer_type is AnswerType.MCQ else normalize_answer(record.answer)
            for key in self._keys(record.answer_type.value, record.question):
                counts[key][answer] += 1
            n += 1
        if n == 0:
            raise ValueError("expected a non-empty dataset to fit the answer prior")
        self.counts = dict(counts)
        self.fitted_on = f"{getattr(dataset, 'name', 'records')} (n={n})"
        return self

    def _keys(self, answer_type: str, question: str) -> list[tuple[str, ...]]:
        keys = [(answer_type, question_key(question, k)) for k in range(self.max_words, 0, -1)]
        return keys + [(answer_type,)]

    def candidates(self, answer_type: str, question: str, k: int = 5) -> list[str]:
        """Up to ``k`` most common answers under the most specific key seen ``min_count`` times."""
        for key in self._keys(answer_type, question):
            counter = self.counts.get(key)
            if counter and sum(counter.values()) >= self.min_count:
                return [a for a, _ in counter.most_common(k)]
        return []

    def predict(self, answer_type: str, question: str, options: Mapping[str, str] | None = None) -> str:
        """The prior's answer for one question (no tools, no image)."""
        for key in self._keys(answer_type, question):
            counter = self.counts.get(key)
            if counter and sum(counter.values()) >= self.min_count:
                for answer, _ in counter.most_common():
                    if answer_type != AnswerType.MCQ.value or not options or answer in options:
                        return answer
        if answer_type == AnswerType.MCQ.value and options:
            return sorted(options)[0]
        return "yes" if answer_type == AnswerType.CLOSED.value else "normal"

    def act(self, conversation: Conversation) -> str:
        answer = self.predict(conversation.answer_type, conversation.question, conversation.info.get("options"))
        return format_answer(answer, answer_protocol_of(conversation))

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "max_words": self.max_words, "min_count": self.min_count,
                "fitted_on": self.fitted_on}


# ----------------------------------------------------------------------------------------------
class ToolThenAnswerAgent(Agent):
    """Turn 1: zoom into the central ``centre_fraction`` of the image and, when offered, call
    every other tool that takes a box or a text prompt (segment, ground, classify) on the same
    region. Turn 2: answer from what the tools said, positive evidence before absence of it:

    * CLOSED: "yes" when grounding found the question's subject; else the classifier's verdict when
      it is decisive (its top label at least ``decisive_margin`` above the next: the subject ->
      "yes", "normal" -> "no"; a trained classifier is asked for the labels it knows that the
      question names, against their counterparts, and not asked when none fits:
      :mod:`agents.classifier_labels`); else "no" when grounding found nothing; else "no"/"yes" from the
      other tools' text about the subject (negations, zero objects); otherwise the prior.
      Grounding that finds nothing never overrides a decisive classifier: on a dataset annotated
      with image labels only, oracle grounding has no boxes to find, while the oracle classifier
      knows the answer (so with oracle tools this agent is an upper bound there too);
    * MCQ: for "how many" questions the option equal to the number of grounded regions; else the
      option a decisive classifier picked, or whose text appears in the tools' text; otherwise the prior;
    * OPEN: a decisive classifier's top label, otherwise the prior.
    """

    name = "zoom-then-answer"

    def __init__(self, prior: AnswerPriorAgent | None = None, centre_fraction: float = 0.5,
                 zoom_tool: str = "image_zoom_in", use_other_tools: bool = True,
                 decisive_margin: float = 0.2) -> None:
        if not 0.0 < centre_fraction <= 1.0:
            raise ValueError(f"expected centre_fraction in (0, 1], got {centre_fraction!r}")
        if not 0.0 <= decisive_margin < 1.0:
            raise ValueError(f"expected decisive_margin in [0, 1), got {decisive_margin!r}")
        self.decisive_margin = float(decisive_margin)
        self.prior = prior or AnswerPriorAgent()
        self.centre_fraction = float(centre_fraction)
        self.zoom_tool = zoom_tool
        self.use_other_tools = bool(use_other_tools)

    def fit(self, dataset: VQADataset | Iterable[VQARecord]) -> "ToolThenAnswerAgent":
        self.prior.fit(dataset)
        return self

    def act(self, conversation: Conversation) -> str:
        protocol = answer_protocol_of(conversation)
        tools = _tools_of(conversation)
        if conversation.turns == 0 and tools:
            calls = self._first_calls(conversation, tools)
            if calls:
                return "\n".join(calls)
        return format_answer(self._answer(conversation), protocol)

    def _first_calls(self, conversation: Conversation, tools: list[dict[str, Any]]) -> list[str]:
        margin = (1.0 - self.centre_fraction) / 2
        box = [margin, margin, 1.0 - margin, 1.0 - margin]
        size = conversation.images[0].size if conversation.images else (1, 1)
        subject = _subject_of(conversation.question)
        calls, notes = [], []
        for tool in tools:
            if tool["name"] != self.zoom_tool and not self.use_other_tools:
                continue
            labels: list[str] = []
            if _takes_labels(tool):
                plan = self._plan(conversation, tool)
                if plan.labels is None:  # a trained classifier that knows none of this question's labels
                    notes.append(plan.note)
                    continue
                labels = plan.labels
            args = fill_arguments(tool.get("parameters", {}), box, size, text=subject, labels=labels)
            calls.append(format_tool_call(tool["name"], args))
        zoom_first = sorted(calls, key=lambda c: self.zoom_tool not in c)
        return ([f"<think>{' '.join(notes)}.</think>"] if notes and zoom_first else []) + zoom_first

    def _plan(self, conversation: Conversation, tool: Mapping[str, Any]) -> ClassifierPlan:
        """Which labels to ask classifier ``tool`` for, and which of them mean "yes"
        (:mod:`agents.classifier_labels`: a trained tool's own labels, an open one's usual ones)."""
        kind, question = conversation.answer_type, conversation.question
        candidates = self.prior.candidates(kind, question) if kind == AnswerType.OPEN.value else ()
        return classifier_plan(tool, kind, question, _subject_of(question), conversation.info.get("options"),
                               candidates)

    def _answer(self, conversation: Conversation) -> str:
        kind, question = conversation.answer_type, conversation.question
        options = conversation.info.get("options") or {}
        text = "\n".join(observations(conversation))
        tool_text = re.sub(r"Tool turns left: \d+\.|No tool turns left[^.]*\.", " ", text)
        label = _top_label(tool_text, self.decisive_margin)
        classifier = next((t for t in _tools_of(conversation) if _takes_labels(t)), None)
        plan = self._plan(conversation, classifier) if classifier is not None else ClassifierPlan(None)
        count = _ground_count(tool_text)
        if kind == AnswerType.CLOSED.value and (count or (count == 0 and label is None)):
            return "yes" if count else "no"
        if count is not None and kind == AnswerType.MCQ.value and re.search(r"\bhow many\b", question.lower()):
            hits = [k for k, v in options.items() if str(v).strip() == str(count)]
            if len(hits) == 1:
                return hits[0]
        if kind == AnswerType.MCQ.value and options:
            by_text = {fold_label(v): k for k, v in options.items()}
            if label is not None and fold_label(label) in by_text:  # "x-ray" is option "X ray"
                return by_text[fold_label(label)]
            lower = tool_text.lower()
            hits = [k for k, v in options.items() if v and str(v).lower() in lower]
            if len(hits) == 1:
                return hits[0]
        elif kind == AnswerType.CLOSED.value:
            if label is not None:  # decisive, and grounding found nothing or was not offered
                return "yes" if means_yes(label, plan) else "no"
            subject = _subject_of(question)
            findings = [s for s in re.split(r"\n|\[", tool_text) if s.strip() and "image_zoom_in" not in s
                        and not s.startswith("Zoomed")]
            relevant = [s for s in findings if subject and subject.lower() in s.lower()]
            if relevant:
                return "no" if _NEGATIVE_RE.search(" ".join(relevant)) else "yes"
        elif label:
            return label
        return self.prior.predict(kind, question, options)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "centre_fraction": self.centre_fraction, "zoom_tool": self.zoom_tool,
                "use_other_tools": self.use_other_tools, "decisive_margin": self.decisive_margin,
                "prior": self.prior.config()}


_STOP = {"is", "are", "there", "the", "a", "an", "of", "in", "this", "image", "does", "do", "what", "which",
         "where", "how", "many", "much", "seen", "present", "visible", "shown", "on", "any", "evidence",
         "patient", "be", "can", "you", "see"}


def _subject_of(question: str) -> str:
    """The question's content words (at most four): what the tools should look for.

    >>> _subject_of("Is there a pneumothorax in the left lung?")
    'pneumothorax left lung'
    >>> _subject_of("How many lesions are visible in this image?")
    'lesions'
    """
    words = [w for w in _WORD_RE.findall(question.lower()) if w not in _STOP]
    return " ".join(words[-4:]) if words else "abnormality"


_FOUND_RE = re.compile(r"\[ground\] Found (nothing|\d+)\b")


def _ground_count(tool_text: str) -> int | None:
    """How many regions the grounding tool reported (``None`` if it was not called).

    >>> _ground_count("[ground] Found 2 regions matching 'lesion' ..."), _ground_count("[ground] Found nothing matching")
    (2, 0)
    """
    m = _FOUND_RE.search(tool_text)
    if m is None:
        return None
    return 0 if m.group(1) == "nothing" else int(m.group(1))


def _top_label(text: str, margin: float = 0.0) -> str | None:
    """The best label of a classifier's line (``label 0.69, other 0.31`` or ``label: 0.69``), if
    it beats the runner-up by at least ``margin`` (a uniform answer says nothing).

    >>> _top_label("[classify] Classification of image 0: X-Ray 0.691, CT 0.182, MRI 0.127.")
    'x-ray'
    >>> _top_label("[classify] Classification of image 0: lesion 0.500, normal 0.500.", margin=0.2) is None
    True
    >>> _top_label("[classify] Classification of image 0: 1 0.6, 2 0.4. WARNING: engine 'clip' is random.")
    '1'
    """
    for line in text.splitlines():
        if not line.lstrip().startswith("[classify]") or ":" not in line:
            continue
        scores = re.split(r"\.\s", line.split(":", 1)[1] + " ")[0]  # the scores, not a note after them
        pairs = re.findall(r"([^,:]+?)\s*[:=(]?\s*(0?\.\d+|1\.0*|0|1)\)?(?=,|\.?\s*$)", scores)
        if pairs:
            ranked = sorted(pairs, key=lambda p: -float(p[1]))
            second = float(ranked[1][1]) if len(ranked) > 1 else 0.0
            if margin > 0 and float(ranked[0][1]) - second < margin:
                return None
            return ranked[0][0].strip().strip("'\"").lower()
    return None


# ----------------------------------------------------------------------------------------------
class OracleAgent(Agent):
    """Answers the ground truth of the record being asked (an **upper bound**: it cheats).

    It looks the record up in ``dataset`` by ``record_id``; with ``use_annotations`` it first
    zooms into the record's first annotated box, so it also measures the best-case tool path.
    """

    name = "oracle"

    def __init__(self, dataset: VQADataset, use_annotations: bool = True, zoom_tool: str = "image_zoom_in") -> None:
        if not isinstance(dataset, VQADataset):
            raise ValueError(f"expected a VQADataset holding the ground truth, got {type(dataset).__name__}")
        self.dataset = dataset
        self.use_annotations = bool(use_annotations)
        self.zoom_tool = zoom_tool

    def act(self, conversation: Conversation) -> str:
        record_id = conversation.info.get("record_id")
        if record_id is None:
            raise ValueError("the oracle needs conversation.info['record_id'] (from env.reset's info)")
        record = self.dataset[self.dataset.index_of(record_id)]
        tool_names = {t["name"] for t in _tools_of(conversation)}
        if (self.use_annotations and conversation.turns == 0 and record.annotations.boxes
                and self.zoom_tool in tool_names):
            box = record.annotations.boxes[0]
            return format_tool_call(self.zoom_tool, {"bbox": list(box.bbox), "image_index": box.image_index})
        return format_answer(record.answer, answer_protocol_of(conversation))

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "dataset": self.dataset.name, "use_annotations": self.use_annotations,
                "upper_bound": True}
