"""Stores for rollouts and spans: one interface, in memory or in a SQLite file."""

from ..ids import new_rollout_id
from .base import Store
from .memory import MemoryStore
from .sqlite import NotOurDatabase, SQLiteStore, StoreFullError

__all__ = ["MemoryStore", "NotOurDatabase", "SQLiteStore", "Store", "StoreFullError", "new_rollout_id"]
