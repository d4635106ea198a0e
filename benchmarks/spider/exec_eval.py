"""Execution accuracy, as Spider's evaluation computes it: do the predicted and gold queries return the same?

Follows ``exec_eval.py`` of the official test-suite evaluation (taoyds/test-suite-sql-eval) with its
defaults (``keep_distinct=False``, no value plugging), on the one database of each question:

- both queries are normalised: ``> =`` / ``< =`` / ``! =`` are joined, and every ``DISTINCT`` keyword
  (outside string literals) is removed from both;
- rows are compared as a multiset (order ignored) unless the gold query has ``ORDER BY``, then as a list;
- columns may come in any order: a column permutation of the prediction that makes the results
  equal counts as a match. Where Spider prunes the permutations with 20 randomly sampled rows, this
  prunes them with every row (deterministic) and tries at most ``MAX_PERMUTATIONS`` of them;
- two empty results match; a prediction that fails, times out or returns too many rows does not.

>>> results_match([(1, "a"), (2, "b")], [("b", 2), ("a", 1)], order_matters=False)
True
>>> results_match([(1,), (2,)], [(2,), (1,)], order_matters=True)
False
>>> normalize_sql("SELECT DISTINCT name FROM t WHERE x > = 'distinct'")
"SELECT name FROM t WHERE x >= 'distinct'"
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from .readonly import DEFAULT_TIMEOUT_S, SQLError, run_query

Row = tuple[object, ...]

#: most column permutations tried for one comparison (only wide results with look-alike columns get near it)
MAX_PERMUTATIONS = 5000

_SPACED_OPERATORS = (("> =", ">="), ("< =", "<="), ("! =", "!="))
#: a string literal or quoted identifier (kept), or the DISTINCT keyword (removed with its trailing space)
_DISTINCT = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`)|\bdistinct\b\s*", re.IGNORECASE)


def normalize_sql(sql: str, keep_distinct: bool = False) -> str:
    """Spider's post-processing of a query before it is executed for comparison."""
    for spaced, joined in _SPACED_OPERATORS:
        sql = sql.replace(spaced, joined)
    if not keep_distinct:
        sql = _DISTINCT.sub(lambda m: m.group(1) or "", sql)
    return sql.strip()


def order_matters(gold_sql: str) -> bool:
    """Spider compares rows in order exactly when the gold query sorts them."""
    return "order by" in gold_sql.lower()


def _unordered(row: Row) -> Row:
    return tuple(sorted(row, key=lambda v: str(v) + str(type(v))))


def _permutations(gold: Sequence[Row], pred: Sequence[Row]) -> Iterator[tuple[int, ...]]:
    """Column orders of ``pred`` whose every value appears in the matching ``gold`` column."""
    n = len(gold[0])
    gold_cols = [{row[i] for row in gold} for i in range(n)]
    pred_cols = [{row[j] for row in pred} for j in range(n)]
    candidates = [[j for j in range(n) if pred_cols[j] <= gold_cols[i]] for i in range(n)]

    def extend(prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if len(prefix) == n:
            yield prefix
            return
        for j in candidates[len(prefix)]:
            if j not in prefix:
                yield from extend((*prefix, j))

    return extend(())


def results_match(gold: Sequence[Row], pred: Sequence[Row], order_matters: bool) -> bool:
    """Spider's ``result_eq``: equal up to a column permutation, as lists or as multisets of rows."""
    if not gold and not pred:
        return True
    if len(gold) != len(pred) or len(gold[0]) != len(pred[0]):
        return False
    # quick rejection: the rows' values must agree before any column order is considered
    gold_u, pred_u = [_unordered(r) for r in gold], [_unordered(r) for r in pred]
    if (gold_u != pred_u) if order_matters else (set(gold_u) != set(pred_u)):
        return False
    gold_rows = list(gold) if order_matters else Counter(gold)
    for tried, perm in enumerate(_permutations(gold, pred)):
        if tried >= MAX_PERMUTATIONS:
            break
        permuted = [tuple(row[j] for j in perm) for row in pred]
        if (permuted if order_matters else Counter(permuted)) == gold_rows:
            return True
    return False


def execution_match(
    db_path: Path | str, pred_sql: str, gold_sql: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """Execute both queries read-only on ``db_path`` and compare their results as Spider does.

    A prediction that fails, times out or exceeds the row cap does not match; a gold query that fails
    raises :class:`SQLError` (the data is broken, not the prediction).
    """
    gold_sql = normalize_sql(gold_sql)
    gold = run_query(db_path, gold_sql, timeout_s=max(timeout_s, 10.0))
    try:
        pred = run_query(db_path, normalize_sql(pred_sql), timeout_s=timeout_s)
    except SQLError:
        return False
    return results_match(gold, pred, order_matters(gold_sql))
