"""Answer normalisation shared by rule rewards, exact match and the evaluation.

>>> normalize_yes_no(" Present. ")
'yes'
>>> parse_mcq_letter("I pick option (b)", {"A": "CT", "B": "MRI"})
'B'
>>> parse_mcq_letter("MRI", {"A": "CT", "B": "MRI"})
'B'
>>> parse_mcq_letter("the answer is a mass in the liver", {"A": "CT", "B": "MRI"}) is None   # an article
True
"""

from __future__ import annotations

import re
import string
from typing import Mapping

_YES = {"yes", "y", "true", "present", "positive", "correct", "yeah", "yep", "affirmative"}
_NO = {"no", "n", "false", "absent", "negative", "incorrect", "nope", "not present"}
_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_text(text: str) -> str:
    """Lowercase, drop punctuation and articles, squeeze spaces (SQuAD-style)."""
    text = str(text).lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def normalize_yes_no(text: str | None) -> str | None:
    """Map yes/no synonyms to ``'yes'``/``'no'``; anything else -> ``None``."""
    if text is None:
        return None
    t = normalize_text(text)
    if t in _YES:
        return "yes"
    if t in _NO:
        return "no"
    first = t.split(" ", 1)[0] if t else ""
    if first in {"yes", "no"}:  # "yes, there is" / "no evidence"
        return first
    return None


# After "answer", "option" or "choice", a lowercase "a" or "i" followed by a word is the article or
# the pronoun, not a letter: "the answer is a mass in the liver" and "Option: a mass in the liver"
# are not option A ("the answer is A", "option a", "option (a) mass" still are).
_NOT_ARTICLE = r"(?!(?<=[ai])\s+[A-Za-z])"
_LETTER = r"(?:\(([A-Za-z])\)|([A-Za-z])(?![A-Za-z])" + _NOT_ARTICLE + ")"
_LETTER_PATTERNS = [
    re.compile(r"^\(?([A-Za-z])\)?[.):]?$"),                                      # B, (B), B., B)
    re.compile(r"^(?i:option|choice)\s*[:\-]?\s*" + _LETTER),                             # option B
    re.compile(r"^(?i:answer)\s*[:\-]?\s*" + _LETTER),
    re.compile(r"^\(?([A-Za-z])[.):]\s"),                                         # B. MRI / (B) MRI
    re.compile(r"\b(?i:option|choice)\s*(?:(?i:is)\s*)?[:\-]?\s*" + _LETTER),
    re.compile(r"\b(?i:answer)\s*(?:(?i:is)\s*)?[:\-]?\s*" + _LETTER),                 # the answer is B
    re.compile(r"\(([A-Za-z])\)"),                                                # ... (b) ...
]


def parse_mcq_letter(text: str | None, options: Mapping[str, str]) -> str | None:
    """Find which option ``text`` chose: by letter ("(B)", "B.", "option B") or by option text."""
    if text is None:
        return None
    letters = {k.strip().upper(): v for k, v in options.items()}
    t = str(text).strip()
    for pattern in _LETTER_PATTERNS:
        m = pattern.search(t)
        letter = next((g for g in m.groups() if g), None) if m else None
        if letter and letter.upper() in letters:
            return letter.upper()
    norm = normalize_text(t)
    by_text = [k for k, v in letters.items() if normalize_text(v) == norm]
    if len(by_text) == 1:
        return by_text[0]
    contained = [k for k, v in letters.items() if normalize_text(v) and normalize_text(v) in norm]
    if len(contained) == 1:
        return contained[0]
    return None


def exact_match(prediction: str | None, truth: str) -> bool:
    """Normalised exact match (yes/no synonyms folded)."""
    if prediction is None:
        return False
    p, t = normalize_text(prediction), normalize_text(truth)
    if p == t:
        return True
    yp, yt = normalize_yes_no(prediction), normalize_yes_no(truth)
    return yp is not None and yp == yt
