"""The Calc-X agent's calculator: a safe arithmetic evaluator (an AST walk, never ``eval``).

Numbers, ``+ - * / // % **``, parentheses, unary signs and ``sqrt(x)``; ``^`` is read as ``**``, the
multiplication and division signs as ``*`` and ``/``, and ``1,000`` as ``1000``. Rational arithmetic is
exact (``1/3*3`` is ``1``). Anything else, an over-long expression, a huge exponent or a huge result
raises ``ValueError``.

>>> calculator("(2/5) * (3/10)")
'0.12'
>>> calculator("1 - 1/3")
'0.6666666667'
>>> calculator("__import__('os')")
Traceback (most recent call last):
...
ValueError: not arithmetic: a function call other than sqrt(x)
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from fractions import Fraction

__all__ = ["MAX_EXPONENT", "MAX_LENGTH", "MAX_MAGNITUDE", "calculator", "evaluate", "format_number"]

#: the longest expression accepted, in characters
MAX_LENGTH = 200
#: the largest absolute exponent of ``**``
MAX_EXPONENT = 64
#: the largest absolute value of any intermediate or final result
MAX_MAGNITUDE = 1e30

Number = Fraction | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_SIGNS = str.maketrans({"\u00d7": "*", "\u00f7": "/"})
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _checked(value: Number | int) -> Number:
    if isinstance(value, int):  # floor division of two fractions gives an int
        value = Fraction(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"the result is larger than {MAX_MAGNITUDE:g}")
    return value


def _power(base: Number, exp: Number) -> Number:
    if abs(exp) > MAX_EXPONENT:
        raise ValueError(f"exponents are limited to +-{MAX_EXPONENT}")
    if base == 0:
        if exp < 0:
            raise ValueError("division by zero")
        return Fraction(0 if exp > 0 else 1)
    if float(exp) * math.log10(float(abs(base))) > math.log10(MAX_MAGNITUDE):
        raise ValueError(f"the result is larger than {MAX_MAGNITUDE:g}")
    if isinstance(exp, Fraction) and exp.denominator == 1 and isinstance(base, Fraction):
        return base ** int(exp)  # exact
    if base < 0:
        raise ValueError("a negative number to a fractional power is not a real number")
    return float(base) ** float(exp)


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ValueError(f"not a number: {node.value!r}")
        return _checked(Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        op = _BINARY.get(type(node.op))
        if op is None:
            raise ValueError(f"unsupported operator: {type(node.op).__name__}")
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ValueError("division by zero")
        return _checked(op(left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "sqrt"
        and len(node.args) == 1
        and not node.keywords
    ):
        value = _eval(node.args[0])
        if value < 0:
            raise ValueError("sqrt of a negative number")
        if isinstance(value, Fraction):
            num, den = math.isqrt(value.numerator), math.isqrt(value.denominator)
            if Fraction(num, den) ** 2 == value:
                return Fraction(num, den)  # exact for squares of rationals
        return math.sqrt(float(value))
    if isinstance(node, ast.Call):
        raise ValueError("not arithmetic: a function call other than sqrt(x)")
    raise ValueError(f"not arithmetic: {type(node).__name__}")


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression (a ``Fraction`` when exact, else a ``float``).

    >>> evaluate("2 ^ 10 + 1,000")
    Fraction(2024, 1)
    >>> evaluate("sqrt(2)")
    1.4142135623730951
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("the expression is empty")
    if len(expression) > MAX_LENGTH:
        raise ValueError(f"the expression is longer than {MAX_LENGTH} characters")
    text = _THOUSANDS.sub("", expression.strip()).replace("^", "**").translate(_SIGNS)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a valid expression: {exc.msg}") from None
    return _eval(tree.body)


def format_number(value: Number) -> str:
    """An integer as is, anything else with ten significant digits.

    >>> format_number(Fraction(84)), format_number(Fraction(2, 3)), format_number(2.5)
    ('84', '0.6666666667', '2.5')
    """
    if isinstance(value, Fraction) and value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10g}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / ** %, parentheses and sqrt(x)."""
    return format_number(evaluate(expression))
