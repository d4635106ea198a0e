"""Fixtures of the web view's tests: a small store of a training step, its run folder, a served view."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlightning_lite.air import ToolStatus
from agentlightning_lite.credit import FinalReward
from agentlightning_lite.store import ReadOnlyStore

from . import _stores


@pytest.fixture
def small(tmp_path: Path) -> dict[str, Any]:
    """``db``: the small store's path, ``run``: a run folder with metrics.jsonl, ``ids``: its rollouts."""
    db = tmp_path / "runs.db"
    ids = _stores.small_store(db)
    _stores.write_metrics(tmp_path / "run")
    return {"db": db, "run": tmp_path / "run", "ids": ids}


@pytest.fixture
def view(small: dict[str, Any]) -> Iterator[Any]:
    """The small store served read-only at 127.0.0.1, with the byte tokenizer, AIR on tool outcomes
    added to the final reward."""
    from agentlightning_lite.ui import RunData, UIServer

    store = ReadOnlyStore(small["db"])
    data = RunData(
        store,
        small["run"],
        tokenizer=_stores.TOK,
        credit=FinalReward(add_intermediate=True),
        air=ToolStatus(success=0.25, error=-0.5),
    )
    with UIServer(data) as server:
        server.ids = small["ids"]  # type: ignore[attr-defined]
        yield server
    store.close()
