"""Answer normalisation shared by rule rewards, exact match and the evaluation.

>>> normalize_yes_no(" Present. ")
'yes'
>>> parse_mcq_letter("I pick option (b)", {"A": "CT", "B": "MRI"})
'B'
>>> parse_mcq_letter("MRI", {"A": "CT", "B": "MRI"})
'B'
>>> parse_mcq_letter("the answer is a mass in the liver", {"A": "CT", "B": "MRI"}) is None   # an article
True

Every script the supported datasets use is normalised the same way: NFKC (full-width letters and
digits become ASCII), lowercase, every Unicode punctuation character dropped (``。，？！：（）`` as
well as ASCII's), spaces between CJK characters dropped (``左 肺`` is ``左肺``), accents kept
(``pulmón`` stays one word):

>>> normalize_text("肺。"), normalize_text("（左 肺）"), normalize_text("¿Pulmón?"), normalize_text("ＭＲＩ！")
('肺', '左肺', 'pulmón', 'mri')
>>> normalize_yes_no("是的。"), normalize_yes_no("否"), normalize_yes_no("Sí")
('yes', 'no', 'yes')

A text that normalises to nothing ("." or "") matches nothing; an answer that is only an article
keeps it ("A" the blood group, the option letter):

>>> exact_match("", "."), exact_match("the", "."), normalize_text("A")
(False, False, 'a')
"""

from __future__ import annotations

import re
import string
import unicodedata
from functools import lru_cache
from typing import Mapping

# yes/no in the languages of the supported datasets (SLAKE's Chinese: 是/否, 有/没有; Spanish: sí/no)
_YES = {"yes", "y", "true", "present", "positive", "correct", "yeah", "yep", "affirmative",
        "是", "是的", "对", "有", "sí", "si"}
_NO = {"no", "n", "false", "absent", "negative", "incorrect", "nope", "not present",
       "否", "不是", "不", "不对", "没有", "无"}
_ASCII_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
CJK_CHARS = ("\u2e80-\u2fdf\u3005\u3007\u3021-\u3029\u3040-\u30ff\u3100-\u312f\u31a0-\u31bf\u31f0-\u31ff"
             "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f")
"""Han ideographs, kana and bopomofo: scripts written without spaces, scored per character."""
_CJK_GAP = re.compile(f"(?<=[{CJK_CHARS}])\\s+(?=[{CJK_CHARS}])")


def is_punctuation(char: str) -> bool:
    """A Unicode punctuation character (categories Pc, Pd, Ps, Pe, Pi, Pf, Po) or ASCII punctuation."""
    return char in string.punctuation or unicodedata.category(char).startswith("P")


@lru_cache(maxsize=65536)
def normalize_text(text: str) -> str:
    """NFKC, lowercase, drop every punctuation character and the English articles, squeeze spaces
    (SQuAD-style; spaces between CJK characters go). ASCII text is normalised exactly as before
    (``string.punctuation`` dropped); an answer that is nothing but articles keeps them."""
    text = str(text)
    if text.isascii():
        text = text.lower().translate(_ASCII_PUNCT)
    else:
        text = unicodedata.normalize("NFKC", text).lower()
        text = "".join(c for c in text if not is_punctuation(c))
    words = " ".join(text.split())
    stripped = " ".join(_ARTICLES.sub(" ", words).split())
    if not stripped.isascii():
        stripped = _CJK_GAP.sub("", stripped)
    return stripped or words


# CLOSED questions only (rewards.matching): Chinese answers a yes/no question by echoing its
# predicate ("包含吗？" -> 包含 / 不包含), and SLAKE-zh's CLOSED golds are such echoes. A predicate whose
# opposite would echo too (正常 / 异常, 健康 / 病变) keeps only one side, so no two opposites fold alike.
_ECHO_PREDICATES = ("是", "有", "包含", "含有", "可以", "能", "能够", "会", "存在", "在", "正常", "健康", "可见",
                    "看得见", "属于", "需要", "一样", "相同", "对称", "对", "正确", "显示", "出现", "位于")
CLOSED_YES = frozenset(_ECHO_PREDICATES) | {"是的", "对的", "没错", "正确的", "确实", "当然", "可以的", "有的"}
"""CLOSED answers that mean yes besides :func:`normalize_yes_no`'s (after :func:`normalize_text`)."""
CLOSED_NO = (frozenset(f"{neg}{p}" for p in _ECHO_PREDICATES for neg in ("不", "没", "没有", "并不", "并没有"))
             | {"错", "错的", "错误", "不对的", "不是的", "没有的", "无", "否定"})
"""CLOSED answers that mean no besides :func:`normalize_yes_no`'s (``不包含``, ``不可以``, ``不存在``, ...)."""
_CLAUSE_BREAK = re.compile(r"[\s\W_]+")


def _first_clause(text: str) -> str:
    """The text up to its first punctuation mark or space, normalised: ``"是的，在左肺"`` -> ``"是的"``."""
    head = _CLAUSE_BREAK.split(unicodedata.normalize("NFKC", str(text)).strip(), maxsplit=1)[0]
    return normalize_text(head)


def semantic_text(text: str | None) -> str:
    """What ARMed's encoders read (BERTScore and cosine, :mod:`rewards.armed`): NFKC (full-width
    ``ＣＴ`` is ``CT``), lowercase, spaces squeezed, punctuation at either end dropped (``肺。``,
    ``left lung.``); punctuation inside stays (``left-lower lobe``: the encoder reads it as words).

    >>> semantic_text("ＣＴ"), semantic_text(" Left  lung. "), semantic_text("（左肺）。"), semantic_text("left-lower lobe")
    ('ct', 'left lung', '左肺', 'left-lower lobe')
    """
    text = unicodedata.normalize("NFKC", str(text or "")).lower()
    text = " ".join(text.split())
    start, end = 0, len(text)
    while start < end and (is_punctuation(text[start]) or text[start].isspace()):
        start += 1
    while end > start and (is_punctuation(text[end - 1]) or text[end - 1].isspace()):
        end -= 1
    return text[start:end]


def normalize_yes_no(text: str | None, closed: bool = False) -> str | None:
    """Map yes/no synonyms to ``'yes'``/``'no'``; anything else -> ``None``.

    A sentence answer is read by its first clause in every language: ``"Yes, there is"``,
    ``"No evidence"``, ``"是的，在左肺"``, ``"不，没有"``. ``closed=True`` (a CLOSED question: the
    one answer rule, :func:`rewards.matching.matches_one`) also folds the echoed predicates of
    Chinese yes/no answers, :data:`CLOSED_YES` / :data:`CLOSED_NO` (``包含`` is yes, ``不可以`` no);
    open answers keep ``正常`` a word, not a yes.

    >>> normalize_yes_no("包含"), normalize_yes_no("包含", closed=True), normalize_yes_no("不存在。", closed=True)
    (None, 'yes', 'no')
    >>> normalize_yes_no("是的，肝脏有病变"), normalize_yes_no("No, there is none"), normalize_yes_no("是左肺")
    ('yes', 'no', None)
    """
    if text is None:
        return None
    yes, no = (_YES | CLOSED_YES, _NO | CLOSED_NO) if closed else (_YES, _NO)
    t = normalize_text(text)
    if t in yes:
        return "yes"
    if t in no:
        return "no"
    first = t.split(" ", 1)[0] if t else ""
    if first in {"yes", "no"}:  # "yes there is" / "no evidence"
        return first
    clause = _first_clause(text)
    if clause and not clause.isascii():  # "是的，在左肺", "Sí, ..." (an English first word: yes/no only)
        return "yes" if clause in yes else "no" if clause in no else None
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
    """Normalised exact match (yes/no synonyms folded); a side that normalises to nothing never matches."""
    if prediction is None:
        return False
    p, t = normalize_text(prediction), normalize_text(truth)
    if not p or not t:
        return False
    if p == t:
        return True
    yp, yt = normalize_yes_no(prediction), normalize_yes_no(truth)
    return yp is not None and yp == yt
