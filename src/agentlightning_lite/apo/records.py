"""The APO run's records on disk: the run directory, its candidate log and GEPA's callbacks."""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._progress import progress
from ..prompts import save_prompts

if TYPE_CHECKING:
    from .optimizer import APO, GEPAAdapter

__all__ = ["Recorder", "RunDir", "candidate_id"]

logger = logging.getLogger(__name__)


def candidate_id(candidate: Mapping[str, str]) -> str:
    """A short, stable name of a candidate (a hash of its texts).

    >>> candidate_id({"system": "Be brief."}) == candidate_id({"system": "Be brief."})
    True
    """
    body = json.dumps(dict(candidate), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()[:12]


class RunDir:
    """``output_dir/apo/<run>/``: the run's id, state, reflection answers and candidate log."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.root = root
        self.run_id = run_id
        self.path = root / run_id
        self.path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def open(cls, root: Path, resume: bool) -> RunDir:
        latest = root / "latest.json"
        if resume and latest.exists():
            run_id = json.loads(latest.read_text())["run"]
            logger.info("APO: resuming run %s", run_id)
        else:
            run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
            root.mkdir(parents=True, exist_ok=True)
            latest.write_text(json.dumps({"run": run_id}) + "\n")
        return cls(root, run_id)

    def save_state(self, update: Mapping[str, Any]) -> None:
        path = self.path / "state.json"
        state = json.loads(path.read_text()) if path.exists() else {"run": self.run_id}
        state.update(update)
        path.write_text(json.dumps(state, indent=2, ensure_ascii=False) + "\n")


class Recorder:
    """GEPA callbacks: the candidate log, ``metrics.jsonl`` rows, ``prompts.json`` and the progress bar."""

    def __init__(
        self,
        apo: APO,
        run: RunDir,
        adapter: GEPAAdapter,
        seed: Mapping[str, str],
        log: Callable[[dict[str, Any]], None] | None,
        prompts_path: Path,
        fixed: Mapping[str, str],
        n_val: int,
    ) -> None:
        self.apo, self.run, self.adapter, self.log = apo, run, adapter, log
        self.prompts_path, self.fixed, self.n_val = prompts_path, dict(fixed), n_val
        self.best = float("-inf")
        self.best_id: str | None = None
        self.seed_id = candidate_id(seed)
        self.path = run.path / "candidates.jsonl"
        self.logged: set[str] = set()
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self.logged.add(f"{row['id']}:{row['accepted']}")
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a kill
        self.proposed: dict[int, tuple[str, str]] = {}  # iteration -> (child id, parent id)
        self.bar = progress(apo.budget, "APO")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _write(self, row: dict[str, Any]) -> bool:
        """Append ``row`` to the candidate log; False when a resumed run logged it already."""
        key = f"{row['id']}:{row['accepted']}"
        if key in self.logged:
            return False
        with self.path.open("a") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.logged.add(key)
        return True

    # GEPA callback methods ------------------------------------------------------------------
    def on_budget_updated(self, event: Any) -> None:
        if self.bar is not None:
            self.bar.n = min(int(event["metric_calls_used"]), self.apo.budget)
            self.bar.refresh()

    def on_proposal_start(self, event: Any) -> None:
        self._parent = dict(event["parent_candidate"])

    def on_proposal_end(self, event: Any) -> None:
        parent = getattr(self, "_parent", None)
        if parent is None:
            return
        child = {**parent, **event["new_instructions"]}
        cid, pid = candidate_id(child), candidate_id(parent)
        self.adapter.parents.setdefault(cid, pid)
        self.proposed[int(event["iteration"])] = (cid, pid)
        self._child = child

    def on_candidate_rejected(self, event: Any) -> None:
        cid, pid = self.proposed.get(int(event["iteration"]), (None, None))
        if cid is None:
            return
        row = {
            "id": cid,
            "parent": pid,
            "accepted": False,
            "prompts": getattr(self, "_child", {}),
            "minibatch_score": event["new_score"],
            "parent_minibatch_score": event["old_score"],
            "reason": event["reason"],
        }
        if self._write(row) and self.log is not None:
            self.log(
                {
                    "apo/candidate": cid,
                    "apo/parent": pid,
                    "apo/accepted": 0.0,
                    "apo/minibatch_score": event["new_score"],
                }
            )

    def on_valset_evaluated(self, event: Any) -> None:
        cand = dict(event["candidate"])
        cid = candidate_id(cand)
        parents = [p for p in (event.get("parent_ids") or []) if p is not None]
        score = float(event["average_score"])
        per_task = {str(k): float(v) for k, v in event["scores_by_val_id"].items()}
        parent_id = self.adapter.parents.get(cid)
        row = {
            "id": cid,
            "index": int(event["candidate_idx"]),
            "parent": parent_id,
            "parent_index": parents,
            "accepted": True,
            "prompts": cand,
            "val_score": score,
            "task_scores": per_task,
        }
        new = self._write(row)
        improved = score > self.best
        if improved:
            self.best, self.best_id = score, cid
            save_prompts(
                self.prompts_path, {**self.fixed, **cand}, candidate=cid, val_score=score, run=self.run.run_id
            )
        if new and self.log is not None:
            self.log(
                {
                    "apo/candidate": cid,
                    "apo/candidate_index": float(event["candidate_idx"]),
                    "apo/parent": parent_id,
                    "apo/accepted": 1.0,
                    "apo/val_score": score,
                    "apo/best_val_score": self.best,
                    "apo/task_scores": per_task,
                    "apo/prompts": cand,
                }
            )
        if self.bar is not None:
            self.bar.set_postfix(best=f"{self.best:.3f}", candidates=int(event["candidate_idx"]) + 1)
