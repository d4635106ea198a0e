"""What the web view shows, read from a store opened read-only and from a run's ``metrics.jsonl``.

Nothing here imports a web framework or torch: the pages (:mod:`.app`) render what these functions
return. The rollout list is one indexed-or-scanned ``SELECT ... LIMIT`` with keyset pagination (the
page after a row is "rows whose sort key comes after that row's"), so page 2,000 costs what page 1
costs, and the per-row span counts are read for the rows of the page only.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .. import join
from ..air import AIRRule
from ..credit import CreditRule
from ..rl.advantages import group_advantages as _group_advantages
from ..run_settings import recorded, rules
from ..transitions import rollout_transitions, why_not_trained
from ..types import Rollout, Span, Transition
from .rollout_list import PAGE_SIZES as PAGE_SIZES
from .rollout_list import SORTS, RolloutPage, RolloutQuery, RolloutRow, sql_filters, task_preview

__all__ = ["RolloutQuery", "RunData", "group_advantages", "read_metrics"]


def run_directory(store: Any) -> Path | None:
    """The training run's directory of a store the trainer wrote (``output_dir/runs.db``): the store's
    directory when ``metrics.jsonl`` lies beside it, else ``None``.

    >>> import tempfile, types
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "metrics.jsonl").write_text("")
    >>> run_directory(types.SimpleNamespace(path=d / "runs.db")) == d
    True
    """
    path = getattr(store, "path", None)
    if path is None:
        return None
    beside = Path(path).parent
    return beside if (beside / "metrics.jsonl").is_file() else None


class RunData:
    """The store and the run directory behind the web view; safe to share between threads.

    ``store`` is a SQLite store: ``agentlightning_lite.store.ReadOnlyStore(path)`` (what ``agl-lite ui``
    opens), or an open ``SQLiteStore``. ``output_dir`` is the training run's directory (default: the
    store's own when ``metrics.jsonl`` lies beside it). ``tokenizer`` decodes token ids
    (``decode([id])``); ``credit``, ``air`` and ``agents`` are the run's, so the transitions shown are
    those it trained on.
    """

    def __init__(
        self,
        store: Any,
        output_dir: str | os.PathLike[str] | None = None,
        tokenizer: Any = None,
        credit: CreditRule | None = None,
        air: AIRRule | Iterable[AIRRule] | None = None,
        agents: Iterable[str] | None = None,
    ) -> None:
        if not all(callable(getattr(store, m, None)) for m in ("query", "rollouts_where")):
            raise TypeError(
                f"the web view reads a SQLite store (ReadOnlyStore or SQLiteStore), not {store!r}"
            )
        self.store = store
        self.output_dir = Path(output_dir) if output_dir is not None else run_directory(store)
        self.tokenizer = tokenizer
        if credit is None and air is None and (spec := recorded(store)) is not None:
            credit, air = rules(spec)  # the run's own settings, recorded with its rollouts
        self.credit = credit
        self.air = air
        self.agents = None if agents is None else list(agents)
        self._lock = threading.Lock()
        self._agents_cache: tuple[float, list[str]] | None = None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self.store.query(sql, params)

    # -- the list --------------------------------------------------------------------------
    def agent_names(self, max_age_s: float = 30.0) -> list[str]:
        """The agents that appear in the store's spans (cached for ``max_age_s``)."""
        cached = self._agents_cache
        if cached is not None and time.monotonic() - cached[0] < max_age_s:
            return cached[1]
        names = [r[0] for r in self._query("SELECT DISTINCT agent FROM spans WHERE agent IS NOT NULL")]
        names = sorted(names)[:500]
        self._agents_cache = (time.monotonic(), names)
        return names

    def rollouts(self, q: RolloutQuery) -> RolloutPage:
        """One page of the rollout list."""
        t0 = time.perf_counter()
        where, params = sql_filters(q)
        key = SORTS[q.sort]
        desc = q.order == "desc"
        page_where = list(where)
        page_params = list(params)
        going_back = q.before is not None and q.after is None
        cur = q.before if going_back else q.after
        if cur is not None:
            # rows after the cursor in the page's order (before it when going back)
            forward_op = "<" if desc else ">"
            op = forward_op if not going_back else ("<" if forward_op == ">" else ">")
            page_where.append(f"({key}, rowid) {op} (?, ?)")
            page_params += [cur[0], cur[1]]
        ascending = (not desc) != going_back
        direction = "ASC" if ascending else "DESC"
        sql = (
            f"SELECT rowid, rollout_id, mode, status, start_time, end_time, reward, error, "
            f"substr(task, 1, 400), json_extract(metadata, '$.step'), {key} FROM rollouts"
            + (" WHERE " + " AND ".join(page_where) if page_where else "")
            + f" ORDER BY {key} {direction}, rowid {direction} LIMIT ?"
        )
        raw = self._query(sql, [*page_params, q.limit + 1])
        more = len(raw) > q.limit
        raw = raw[: q.limit]
        if going_back:
            raw.reverse()
        rows = [
            RolloutRow(
                rowid=r[0],
                rollout_id=r[1],
                mode=r[2],
                status=r[3],
                start_time=r[4],
                end_time=r[5],
                reward=r[6],
                error=r[7],
                task=task_preview(r[8]),
                step=r[9],
                key=float(r[10]),
            )
            for r in raw
        ]
        self._span_counts(rows)
        count_sql = "SELECT COUNT(*) FROM rollouts" + (" WHERE " + " AND ".join(where) if where else "")
        total = int(self._query(count_sql, params)[0][0])
        if going_back:
            nxt = rows[-1].cursor if rows else None
            prev = rows[0].cursor if rows and more else None
        else:
            nxt = rows[-1].cursor if rows and more else None
            prev = rows[0].cursor if rows and cur is not None else None
        return RolloutPage(rows, total, nxt, prev, time.perf_counter() - t0)

    def _span_counts(self, rows: list[RolloutRow]) -> None:
        if not rows:
            return
        by_id = {r.rollout_id: r for r in rows}
        marks = ", ".join("?" * len(by_id))
        for rid, agent, kind, status, dup, n in self._query(
            "SELECT rollout_id, agent, kind, status, instr(attributes, ?) > 0, COUNT(*) FROM spans "
            f"WHERE rollout_id IN ({marks}) GROUP BY 1, 2, 3, 4, 5",
            [f'"{join.DUPLICATE_OF}"', *by_id],
        ):
            row = by_id[rid]
            row.spans += n
            if kind == "llm" and not dup:
                row.llm_calls += n
            if kind == "tool" and status == "error":
                row.tool_errors += n
            if agent and agent not in row.agents:
                row.agents.append(agent)

    # -- one rollout ------------------------------------------------------------------------
    def rollout(self, rollout_id: str) -> tuple[Rollout, list[Span]] | None:
        with self._lock:
            ro = self.store.get_rollout(rollout_id)
            if ro is None:
                return None
            return ro, self.store.spans(rollout_id)

    def transitions_of(self, ro: Rollout, spans: Sequence[Span]) -> tuple[list[Transition], list[str]]:
        """The rollout's transitions as training would build them, and the warnings that came with them."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = rollout_transitions(ro, spans, agents=self.agents, credit=self.credit, air=self.air)
        return out, [str(w.message) for w in caught]

    def group_of(self, ro: Rollout) -> list[Rollout]:
        """The rollouts trained with ``ro`` (GRPO's group: the same step and task), ``ro`` included."""
        step, task_index = ro.metadata.get("step"), ro.metadata.get("task_index")
        if ro.mode != "train" or step is None or task_index is None:
            return [ro]
        with self._lock:
            group: list[Rollout] = self.store.rollouts_where(
                "mode = 'train' AND json_extract(metadata, '$.step') = ? "
                "AND json_extract(metadata, '$.task_index') = ?",
                (step, task_index),
            )
        return group if any(g.rollout_id == ro.rollout_id for g in group) else [ro]

    def token_view(self, rollout_id: str) -> dict[str, Any] | None:
        """Everything the tokens page shows: each LLM call's response tokens with the value each was
        trained with (the credited reward, and GRPO's advantage within the rollout's group)."""
        found = self.rollout(rollout_id)
        if found is None:
            return None
        ro, spans = found
        ts, notes = self.transitions_of(ro, spans)
        group = self.group_of(ro)
        advantages: dict[str, float] = {}
        group_calls = 0
        if len(group) > 1:
            rewards: list[float] = []
            keys: list[str] = []
            for g in group:
                if g.reward is None:
                    continue  # the trainer drops rollouts without a reward
                if g.rollout_id == ro.rollout_id:
                    g_ts = ts
                else:
                    g_found = self.rollout(g.rollout_id)
                    g_ts = [] if g_found is None else self.transitions_of(g, g_found[1])[0]
                for t in g_ts:
                    if t.reward is None or not t.response_token_ids or t.prompt_token_ids is None:
                        continue
                    rewards.append(float(t.reward))
                    keys.append(f"{t.rollout_id}/{t.metadata.get('span_id')}")
            adv = group_advantages(rewards)
            advantages = dict(zip(keys, adv, strict=True))
            group_calls = len(rewards)
        by_span = {t.metadata.get("span_id"): t for t in ts}
        joined = {s.span_id: s for s in join.resolve(spans)}  # as the transitions saw them
        calls: list[dict[str, Any]] = []
        for s in spans:
            if s.kind != "llm":
                continue
            tr = by_span.get(s.span_id)
            reason = None if tr is not None else _why_not_trained(joined.get(s.span_id, s), self.agents)
            if tr is not None and not (tr.response_token_ids and tr.prompt_token_ids is not None):
                reason = "no token ids: the call was not made through the PolicyServer"
            a = advantages.get(f"{ro.rollout_id}/{s.span_id}") if reason is None else None
            calls.append(
                {
                    "span": s,
                    "transition": tr if reason is None else None,
                    "reason": reason,
                    "advantage": a,
                    "tokens": self._tokens(s, a, tr.reward if tr is not None and reason is None else None),
                    "adapter": s.attributes.get("adapter"),
                    "weights_version": s.attributes.get("weights_version"),
                    "prompt_text": s.attributes.get("prompt_text"),
                }
            )
        scale = max(
            [abs(tok["value"]) for c in calls for tok in c["tokens"] if tok["value"] is not None] or [1.0]
        )
        for c in calls:
            for tok in c["tokens"]:
                tok["shade"] = (
                    None if tok["value"] is None else max(-1.0, min(1.0, tok["value"] / (scale or 1.0)))
                )
        return {
            "rollout": ro,
            "calls": calls,
            "notes": notes,
            "group": group,
            "group_calls": group_calls,
            "shaded_by": "advantage" if advantages else "reward",
            "decoded": self.tokenizer is not None,
        }

    def _tokens(self, s: Span, advantage: float | None, reward: float | None) -> list[dict[str, Any]]:
        ids = s.response_token_ids or []
        lps = s.response_logprobs or []
        value = advantage if advantage is not None else reward
        texts = self.token_texts(ids)
        return [
            {
                "id": tid,
                "text": texts[i],
                "logprob": lps[i] if i < len(lps) else None,
                "value": value,
            }
            for i, tid in enumerate(ids)
        ]

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each token's text with the tokenizer given, else ``⟨id⟩``."""
        tok = self.tokenizer
        if tok is None:
            return [f"⟨{i}⟩" for i in ids]
        out = []
        for i in ids:
            try:
                out.append(tok.decode([int(i)]))
            except Exception:
                out.append(f"⟨{i}⟩")
        return out

    # -- the training run -------------------------------------------------------------------
    def prompt_candidates(self) -> list[dict[str, Any]]:
        """The prompt candidates of the run's prompt optimisations (``apo/<run>/candidates.jsonl``),
        each with its ``run``; the best accepted one of each run marked ``best``."""
        if self.output_dir is None:
            return []
        out: list[dict[str, Any]] = []
        for path in sorted(self.output_dir.glob("apo/*/candidates.jsonl")):
            rows = [r for r in read_metrics(path) if "id" in r]
            scored = [r for r in rows if r.get("accepted") and isinstance(r.get("val_score"), (int, float))]
            best = max(scored, key=lambda r: r["val_score"]) if scored else None
            for r in rows:
                out.append({**r, "run": path.parent.name, "best": r is best})
        return out

    def metrics(self, since: int = 0) -> dict[str, Any]:
        """The rows of ``output_dir/metrics.jsonl`` from row ``since`` on, and how fresh the file is."""
        if self.output_dir is None:
            return {"rows": [], "total": 0, "path": None, "age_s": None}
        path = self.output_dir / "metrics.jsonl"
        rows = read_metrics(path)
        age = None
        if path.exists():
            age = max(0.0, time.time() - path.stat().st_mtime)
        return {"rows": rows[since:], "total": len(rows), "path": str(path), "age_s": age}


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON rows of a ``metrics.jsonl``; a line the trainer is still writing (no newline yet) or a
    damaged one is skipped."""
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n") or not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GRPO's advantages over one group: the trainer's own :func:`~..rl.advantages.group_advantages`,
    ``(r - mean) / (sample std + eps)``, all 0.0 when the rewards do not differ.

    >>> [round(a, 3) for a in group_advantages([1.0, 0.0])]
    [0.707, -0.707]
    >>> group_advantages([1.0, 1.0])
    [0.0, 0.0]
    """
    return _group_advantages(rewards, [0] * len(rewards), eps=eps)[0]


def _why_not_trained(s: Span, agents: list[str] | None) -> str:
    """Why a call without a transition is not trained: the rules of ``agl.transitions`` themselves."""
    return why_not_trained(s, agents) or "not a policy call"
