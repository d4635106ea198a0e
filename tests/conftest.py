"""Shared fixtures: every store test runs against both store implementations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import agentlightning_lite as agl

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[agl.Store]:
    """A fresh MemoryStore or SQLiteStore (a real file in tmp_path)."""
    s: agl.Store = agl.MemoryStore() if request.param == "memory" else agl.SQLiteStore(tmp_path / "runs.db")
    yield s
    s.close()


@pytest.fixture
def tracer(store: agl.Store) -> agl.Tracer:
    return agl.Tracer(store)
