"""MuSiQue reward: format adherence plus SQuAD-style answer F1 (max over the answer's aliases).

``reward = 0.1 * format + 0.9 * F1``, where ``format`` is 1 when the final reply holds a non-empty
``<answer>...</answer>`` and F1 is computed on that span only (no tags: F1 = EM = 0). Exact match is
reported beside it but not rewarded.

>>> s = score("The county seat is <answer>Stanley</answer>.", ["Stanley"])
>>> (s.format, s.em, s.f1, round(s.reward, 3))
(1.0, 1.0, 1.0, 1.0)
>>> round(score("<answer>G. Hall</answer>", ["G. Stanley Hall", "Stanley Hall"]).f1, 3)
0.8
>>> score("Stanley", ["Stanley"]).reward
0.0
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FORMAT_WEIGHT", "F1_WEIGHT", "Score", "extract_answer", "normalize", "f1", "score"]

#: weight of format adherence in the reward
FORMAT_WEIGHT = 0.1
#: weight of the answer's token F1 in the reward
F1_WEIGHT = 0.9

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces.

    >>> normalize("The  Battle of Hastings!")
    'battle of hastings'
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1(prediction: str, gold: str) -> float:
    """Token-level F1 between two answers after :func:`normalize` (the SQuAD / MuSiQue metric).

    >>> f1("Stanley Hall", "G. Stanley Hall")
    0.8
    """
    pred, ref = normalize(prediction).split(), normalize(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def extract_answer(reply: str) -> str | None:
    """The text of the last non-empty ``<answer>...</answer>`` in ``reply``, or ``None``.

    >>> extract_answer("<answer> </answer> then <answer>Paris</answer>")
    'Paris'
    """
    spans = [m.strip() for m in _ANSWER.findall(reply or "") if m.strip()]
    return spans[-1] if spans else None


@dataclass(frozen=True)
class Score:
    """One reply's metrics: ``reward`` is what training optimises."""

    answer: str | None
    format: float
    em: float
    f1: float

    @property
    def reward(self) -> float:
        return FORMAT_WEIGHT * self.format + F1_WEIGHT * self.f1


def score(reply: str, answers: Sequence[str]) -> Score:
    """Score a final reply against the gold answer and its aliases (best alias counts)."""
    if not answers:
        raise ValueError("a MuSiQue task needs at least one gold answer")
    answer = extract_answer(reply)
    if answer is None:
        return Score(None, 0.0, 0.0, 0.0)
    em = max(float(normalize(answer) == normalize(a)) for a in answers)
    return Score(answer, 1.0, em, max(f1(answer, a) for a in answers))
