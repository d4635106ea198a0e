"""Calc-X reward: does the agent's final answer equal the gold ``result``, numerically?

The answer is what follows ``### ANSWER:`` (the format the agent is asked for, as in the paper's
Calc-X agent), else the last number of the reply. Numbers may carry thousands separators (``1,000``
or Calc-X's ``1_000``), be fractions (``2/3``), mixed numbers (``1 1/2``), percentages (``25%`` counts
as 25 or 0.25) or carry currency signs. Equal means within a relative 1e-4 or an absolute 1e-6.
Multiple-choice rows (AQuA-RAT, MathQA: the gold ``result`` is a letter) accept the letter or the
value of that option.

>>> score("12 * 7 is 84.\\n### ANSWER: 84 ###", "84")
1.0
>>> score("### ANSWER: 0.6667 ###", "2/3"), score("### ANSWER: 0.67 ###", "2/3")
(1.0, 0.0)
>>> score("### ANSWER: C ###", "C", question="Pick one: A) 24 B) 77 C) 6 D) 29 E) 21")
1.0
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = [
    "ABS_TOL",
    "REL_TOL",
    "extract_answer",
    "has_marker",
    "is_close",
    "numbers",
    "options",
    "parse_gold",
    "score",
]

REL_TOL = 1e-4
ABS_TOL = 1e-6

_MARKER = re.compile(r"#+\s*ANSWER\s*:?\s*(.+?)\s*(?:#+|$)", re.I | re.M)
_NUM = r"-?(?:(?:\d{1,3}(?:[,_]\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
_TOKEN = re.compile(rf"(?<![\w.])({_NUM})(?:\s+(\d+)\s*/\s*(\d+)|\s*/\s*({_NUM}))?\s*(%)?")
_OPTION = re.compile(r"(?<![A-Za-z])([A-E])\s*\)\s*(.*?)(?=\s*(?<![A-Za-z])[A-E]\s*\)|\Z)", re.S)
_LETTER = re.compile(r"^\(?([A-E])\)?(?:[\s.:)]|$)")


def _value(text: str) -> Fraction:
    return Fraction(text.replace(",", "").replace("_", ""))


def numbers(text: str) -> list[list[Fraction]]:
    """Every number in ``text``, in order, each as its candidate values (a percentage has two).

    >>> numbers("1,500 apples, 2/3 of them, 1 1/2 hours, 25%")
    [[Fraction(1500, 1)], [Fraction(2, 3)], [Fraction(3, 2)], [Fraction(25, 1), Fraction(1, 4)]]
    """
    out = []
    for m in _TOKEN.finditer(text.replace("\u2212", "-")):
        whole, num, den, over, pct = m.groups()
        try:
            value = _value(whole)
            if num is not None:  # a mixed number: 1 1/2
                value = value + Fraction(int(num), int(den)) * (1 if value >= 0 else -1)
            elif over is not None:
                value = value / _value(over)
        except ZeroDivisionError:
            continue
        out.append([value, value / 100] if pct else [value])
    return out


def extract_answer(text: str | None) -> str | None:
    """The final answer in a reply: the last ``### ANSWER: ... ###``, else the last number.

    >>> extract_answer("3 + 4 = 7, so ### ANSWER: 7 ###"), extract_answer("I think it is 12 or 13.")
    ('7', '13')
    """
    if not text:
        return None
    marked = _MARKER.findall(text)
    if marked:
        return marked[-1].strip()
    found = list(_TOKEN.finditer(text.replace("\u2212", "-")))
    return found[-1].group(0).strip() if found else None


def has_marker(text: str | None) -> bool:
    """Whether the reply gives its answer in the asked-for ``### ANSWER: ... ###`` form."""
    return bool(text) and _MARKER.search(text) is not None


def parse_gold(result: str) -> Fraction | str:
    """A Calc-X ``result``: a number (``1_000``, ``2/3``, ``4_547.2``, ``-16``) or an option letter.

    >>> parse_gold("1_129/765"), parse_gold("B")
    (Fraction(1129, 765), 'B')
    """
    text = result.split("=", 1)[0].strip()
    if re.fullmatch(r"[A-E]", text):
        return text
    found = numbers(text)
    if not found:
        raise ValueError(f"not a Calc-X result: {result!r}")
    return found[0][0]


def options(question: str) -> dict[str, str]:
    """The lettered options of a multiple-choice question.

    >>> options("Pick one:\\nA) 120\\nB) 600 C) 1000 %")
    {'A': '120', 'B': '600', 'C': '1000 %'}
    """
    return {m.group(1): m.group(2).strip() for m in _OPTION.finditer(question)}


def is_close(a: Fraction | float, b: Fraction | float) -> bool:
    """Equal within a relative ``REL_TOL`` or an absolute ``ABS_TOL``."""
    return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=ABS_TOL)


def score(reply: str | None, result: str, question: str = "") -> float:
    """1.0 when the reply's final answer equals the gold ``result`` (see the module docstring), else 0.0."""
    answer = extract_answer(reply)
    if answer is None:
        return 0.0
    gold = parse_gold(result)
    if isinstance(gold, str):  # multiple choice
        letter = _LETTER.match(answer.strip())
        if letter is not None:
            return float(letter.group(1) == gold)
        option = numbers(options(question).get(gold, ""))
        return float(bool(option) and any(is_close(c, v) for v in option[0] for c in _first(answer)))
    return float(any(is_close(c, gold) for c in _first(answer)))


def _first(answer: str) -> list[Fraction]:
    found = numbers(answer)
    return found[0] if found else []
