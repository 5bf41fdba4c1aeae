"""Does the open-answer reward separate right from wrong answers? A ROC AUC table on VQA-RAD.

Positives: each OPEN ground truth scored against itself and against light, rule-based paraphrases
(:func:`paraphrases`: synonyms, word order, articles, singular/plural). Negatives: the same ground
truth scored against other questions' (different) answers. For every scorer -- ARMed's total, exact
match, and each single metric -- we report the ROC AUC (probability that a random positive outscores
a random negative; ties count half).

    python -m rewards.validity [--vqa-rad ../shared/data/vqa_rad] [--limit 300] [--negatives 3]

>>> sorted(paraphrases("left lung"))
['LEFT LUNG.', 'left lungs', 'left pulmonary', 'left side lung', 'lung left', 'lungs left', 'the left lung']
>>> roc_auc([0.9, 0.8], [0.1, 0.8])
0.875
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import random
import re
from pathlib import Path
from typing import Sequence

SYNONYMS = {
    "left": ["left side"], "right": ["right side"], "kidney": ["renal"], "kidneys": ["renal"],
    "liver": ["hepatic"], "lung": ["pulmonary"], "lungs": ["pulmonary"], "heart": ["cardiac"],
    "brain": ["cerebral"], "mri": ["magnetic resonance imaging", "mr"], "ct": ["computed tomography"],
    "x-ray": ["radiograph", "xray"], "xray": ["radiograph"], "large": ["big"], "small": ["tiny"],
    "mass": ["lesion"], "enlarged": ["large"], "bowel": ["intestine"], "abdomen": ["abdominal region"],
    "chest": ["thorax"], "fracture": ["broken bone"], "hemorrhage": ["bleed"], "pneumothorax": ["collapsed lung"],
}
_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.I)


def _plural(word: str) -> str:
    if word.endswith("s"):
        return word[:-1] if len(word) > 3 else word
    return word + ("es" if word.endswith(("x", "ch", "sh")) else "s")


def paraphrases(answer: str) -> set[str]:
    """Rule-based light paraphrases of ``answer`` (never the answer itself)."""
    text = " ".join(answer.strip().split())
    low = text.lower()
    words = low.split()
    out: set[str] = set()
    if not words:
        return out
    out.add(_ARTICLE.sub("", low) if _ARTICLE.match(low) else f"the {low}")   # articles
    out.add(" ".join(words[:-1] + [_plural(words[-1])]))                         # plural / singular
    if len(words) == 2:                                                          # word order
        out.add(f"{words[1]} {words[0]}")
        out.add(f"{_plural(words[1])} {words[0]}")
    elif len(words) > 2:
        out.add(" ".join(words[1:] + words[:1]))
    for i, w in enumerate(words):                                                # synonyms
        for syn in SYNONYMS.get(w, []):
            out.add(" ".join(words[:i] + [syn] + words[i + 1:]))
    out.add(text.upper() + ".")                                                  # casing, punctuation
    out.discard(low)
    out.discard(text)
    return {p for p in out if p.strip()}


FLIPS = {"left": "right", "right": "left", "upper": "lower", "lower": "upper", "anterior": "posterior",
         "posterior": "anterior", "increased": "decreased", "decreased": "increased", "axial": "coronal",
         "coronal": "axial", "ct": "mri", "mri": "ct", "t1": "t2", "t2": "t1", "benign": "malignant",
         "malignant": "benign", "with": "without", "without": "with", "medial": "lateral", "lateral": "medial"}


def hard_negatives(answer: str) -> set[str]:
    """Near misses that change the meaning: one flipped word (left->right, CT->MRI, T1->T2, ...).

    >>> sorted(hard_negatives("left lower lobe"))
    ['left upper lobe', 'right lower lobe']
    """
    words = answer.lower().split()
    return {" ".join(words[:i] + [FLIPS[w]] + words[i + 1:]) for i, w in enumerate(words) if w in FLIPS}


def roc_auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """P(pos > neg) + 0.5 P(pos == neg), by ranks (Mann-Whitney U)."""
    if not positives or not negatives:
        raise ValueError(f"expected scores on both sides, got {len(positives)} and {len(negatives)}")
    from scipy.stats import rankdata

    ranks = rankdata(list(positives) + list(negatives))
    n_pos, n_neg = len(positives), len(negatives)
    u = float(sum(ranks[:n_pos])) - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


def load_open_answers(root: Path, limit: int | None) -> list[tuple[str, str]]:
    """(question, answer) for VQA-RAD OPEN questions, distinct answers first-come."""
    rows = [json.loads(line) for line in (root / "qa.jsonl").read_text().splitlines() if line.strip()]
    seen, out = set(), []
    for r in rows:
        if r.get("answer_type") == "OPEN" and r["answer"].strip().lower() not in seen:
            seen.add(r["answer"].strip().lower())
            out.append((r["question"], r["answer"].strip()))
    return out[:limit] if limit else out


def build_pairs(answers: Sequence[tuple[str, str]], negatives: int, seed: int = 0, hard: bool = False):
    """(candidate, reference, label) triples: identity + paraphrases = 1, other answers = 0
    (``hard=True``: only references with a near miss, and the near misses as negatives)."""
    rng = random.Random(seed)
    pairs = []
    for i, (_, ref) in enumerate(answers):
        near = sorted(hard_negatives(ref))
        if hard and not near:
            continue
        pairs.append((ref, ref, 1))
        pairs.extend((p, ref, 1) for p in sorted(paraphrases(ref)))
        if hard:
            pairs.extend((n, ref, 0) for n in near)
            continue
        others = [a for j, (_, a) in enumerate(answers) if j != i and a.lower() != ref.lower()]
        pairs.extend((o, ref, 0) for o in rng.sample(others, min(negatives, len(others))))
    return pairs


def evaluate(pairs, reward=None) -> dict[str, float]:
    """ROC AUC per scorer over ``pairs``; ARMed is fed in batches of 64, each ended with
    ``end_batch`` (thresholds adapt as in training)."""
    from medvqa_env.records import AnswerType
    from rewards.armed import ARMedReward
    from rewards.base import RewardInput
    from rewards.normalize import exact_match

    reward = reward or ARMedReward()
    order = list(range(len(pairs)))
    random.Random(1).shuffle(order)  # mix positives and negatives across threshold updates
    scores: dict[str, list[float]] = {}
    for start in range(0, len(order), 64):
        chunk = [pairs[i] for i in order[start:start + 64]]
        outs = reward([RewardInput(rf"\boxed{{{c}}}", c, r, AnswerType.OPEN) for c, r, _ in chunk])
        reward.end_batch()
        for (c, r, _), o in zip(chunk, outs):
            for k in ("bleu1", "rouge1", "bertscore", "cosine", "r_c", "r_as"):
                scores.setdefault(k, []).append(o.components[k])
            scores.setdefault("armed", []).append(o.total)
            scores.setdefault("exact_match", []).append(float(exact_match(c, r)))
    labels = [pairs[i][2] for i in order]
    return {k: roc_auc([s for s, y in zip(v, labels) if y], [s for s, y in zip(v, labels) if not y])
            for k, v in scores.items()}


SCORERS = {"armed": "ARMed total", "exact_match": "exact match", "bleu1": "bleu1", "rouge1": "rouge1",
           "bertscore": "bertscore", "cosine": "cosine", "r_c": "R_c (lexical)", "r_as": "R_as (adaptive semantic)"}


def measure(root: Path, limit: int | None, negatives: int) -> dict:
    """ROC AUCs of every scorer against other questions' answers (``other``) and one-word near
    misses (``near``), with the pair counts behind them."""
    answers = load_open_answers(Path(root), limit or None)
    easy, hard = build_pairs(answers, negatives), build_pairs(answers, negatives, hard=True)
    n_pos, n_pos_hard = sum(y for *_, y in easy), sum(y for *_, y in hard)
    return {"answers": len(answers), "other": evaluate(easy), "near": evaluate(hard),
            "other_pairs": {"positive": n_pos, "negative": len(easy) - n_pos},
            "near_pairs": {"positive": n_pos_hard, "negative": len(hard) - n_pos_hard}}


def table(result: dict) -> str:
    """The AUC table (Markdown) of :func:`measure`'s result."""
    lines = ["| scorer | ROC AUC, other answers | ROC AUC, near misses |", "| --- | --- | --- |"]
    for key, name in SCORERS.items():
        lines.append(f"| {name} | {result['other'][key]:.3f} | {result['near'][key]:.3f} |")
    return "\n".join(lines)


def describe(result: dict, command: str) -> str:
    """One paragraph: the command and what was scored."""
    o, n = result["other_pairs"], result["near_pairs"]
    return (f"`{command}` -- {result['answers']} distinct OPEN answers. Positives: each answer against itself and "
            f"its light paraphrases. *Other answers*: {o['positive']} positive vs {o['negative']} negative pairs "
            f"(other questions' answers). *Near misses*: the {n['positive']} positive pairs of answers that contain "
            f"a flippable word vs {n['negative']} one-word flips (left/right, CT/MRI, T1/T2, ...).")


def main(argv: list[str] | None = None) -> str:
    p = ArgumentParser(description="ROC AUC of open-answer rewards on VQA-RAD")
    p.add_argument("--vqa-rad", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "vqa_rad"))
    p.add_argument("--limit", type=int, default=300, help="distinct OPEN answers to use (0 = all)")
    p.add_argument("--negatives", type=int, default=3, help="other answers per ground truth")
    args = p.parse_args(argv)
    result = measure(Path(args.vqa_rad), args.limit, args.negatives)
    command = f"python -m rewards.validity --limit {args.limit} --negatives {args.negatives}"
    text = "\n".join(["## Open-answer reward validity (VQA-RAD)", "", describe(result, command), "", table(result)])
    print(text)
    return text


if __name__ == "__main__":
    main()
