"""The rollout list of the web view: its filters, sort and page position read from the query string,
its rows and pages, and the SQL terms of its filters (the query itself is :meth:`.data.RunData.rollouts`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._json import loads
from ..types import ROLLOUT_MODES, ROLLOUT_STATUSES

__all__ = ["PAGE_SIZES", "SORTS", "RolloutPage", "RolloutQuery", "RolloutRow", "sql_filters", "task_preview"]

#: how the list can be sorted: name -> SQL expression (never NULL, so keyset comparisons hold)
SORTS: dict[str, str] = {
    "start": "start_time",
    "reward": "COALESCE(reward, -1e308)",
    "duration": "COALESCE(end_time - start_time, -1.0)",
}
PAGE_SIZES = (25, 50, 100, 200)


@dataclass
class RolloutQuery:
    """The rollout list's filters, sort and page position, as the page's query string gives them."""

    mode: str | None = None
    status: str | None = None
    agent: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    sort: str = "start"
    order: str = "desc"
    limit: int = 50
    after: tuple[float, int] | None = None  #: the sort key and rowid of the last row of the previous page
    before: tuple[float, int] | None = None  #: ... of the first row of the next page (going back)

    @classmethod
    def from_params(cls, params: Any) -> RolloutQuery:
        """Parse a query string mapping; raises ``ValueError`` naming the bad parameter."""

        def choice(name: str, allowed: Sequence[str], default: str | None) -> str | None:
            value = params.get(name) or default
            if value is not None and value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
            return value

        def number(name: str) -> float | None:
            text = (params.get(name) or "").strip()
            if not text:
                return None
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{name} must be a number, got {text!r}") from None
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {text!r}")
            return value

        def cursor(name: str) -> tuple[float, int] | None:
            text = params.get(name)
            if not text:
                return None
            key, _, rowid = text.rpartition(":")
            try:
                return float(key), int(rowid)
            except ValueError:
                raise ValueError(
                    f"{name} must be KEY:ROWID as the page's links write it, got {text!r}"
                ) from None

        try:
            limit = int(params.get("limit") or 50)
        except ValueError:
            raise ValueError(f"limit must be one of {PAGE_SIZES}, got {params.get('limit')!r}") from None
        if limit not in PAGE_SIZES:
            raise ValueError(f"limit must be one of {PAGE_SIZES}, got {limit}")
        return cls(
            mode=choice("mode", ROLLOUT_MODES, None),
            status=choice("status", ROLLOUT_STATUSES, None),
            agent=params.get("agent") or None,
            min_reward=number("min_reward"),
            max_reward=number("max_reward"),
            sort=choice("sort", tuple(SORTS), "start") or "start",
            order=choice("order", ("asc", "desc"), "desc") or "desc",
            limit=limit,
            after=cursor("after"),
            before=cursor("before"),
        )

    def params(self, **change: Any) -> dict[str, str]:
        """The query string of this query with some fields changed (for the page's links)."""
        values = {
            "mode": self.mode,
            "status": self.status,
            "agent": self.agent,
            "min_reward": self.min_reward,
            "max_reward": self.max_reward,
            "sort": self.sort,
            "order": self.order,
            "limit": self.limit,
        }
        values.update(change)
        return {k: _fmt_param(v) for k, v in values.items() if v is not None and v != ""}


def _fmt_param(v: Any) -> str:
    if isinstance(v, tuple):
        return f"{v[0]!r}:{v[1]}"
    if isinstance(v, float):
        return repr(v)
    return str(v)


@dataclass
class RolloutRow:
    """One line of the rollout list."""

    rowid: int
    rollout_id: str
    mode: str
    status: str
    start_time: float
    end_time: float | None
    reward: float | None
    error: str | None
    task: Any
    step: Any
    key: float
    spans: int = 0
    llm_calls: int = 0
    tool_errors: int = 0
    agents: list[str] = field(default_factory=list)

    @property
    def duration(self) -> float | None:
        return None if self.end_time is None else self.end_time - self.start_time

    @property
    def cursor(self) -> tuple[float, int]:
        return (self.key, self.rowid)


@dataclass
class RolloutPage:
    rows: list[RolloutRow]
    total: int  #: rollouts matching the filters
    next: tuple[float, int] | None  #: cursor of the next page (None on the last)
    prev: tuple[float, int] | None  #: cursor of the previous page (None on the first)
    seconds: float  #: time the queries took


def sql_filters(q: RolloutQuery) -> tuple[list[str], list[Any]]:
    """The ``WHERE`` terms of ``q``'s filters, and their parameters."""
    where: list[str] = []
    params: list[Any] = []
    if q.mode:
        where.append("mode = ?")
        params.append(q.mode)
    if q.status:
        where.append("status = ?")
        params.append(q.status)
    if q.min_reward is not None:
        where.append("reward >= ?")
        params.append(q.min_reward)
    if q.max_reward is not None:
        where.append("reward <= ?")
        params.append(q.max_reward)
    if q.agent:
        where.append("rollout_id IN (SELECT rollout_id FROM spans WHERE agent = ?)")
        params.append(q.agent)
    return where, params


def task_preview(text: str | None) -> Any:
    """A rollout's task as the list shows it, from the start of its stored JSON."""
    if text is None:
        return None
    try:
        return loads(text)
    except ValueError:
        return text  # cut in the middle by substr: show the start as text
