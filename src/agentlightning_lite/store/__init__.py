"""Stores for rollouts and spans: one interface, in memory or in a SQLite file."""

from ..ids import new_rollout_id
from .base import Store
from .memory import MemoryStore
from .readonly import ReadOnlyStore, StoreNotFound
from .sqlite import NotOurDatabase, SQLiteStore, StoreFullError

__all__ = [
    "MemoryStore",
    "NotOurDatabase",
    "ReadOnlyStore",
    "SQLiteStore",
    "Store",
    "StoreFullError",
    "StoreNotFound",
    "new_rollout_id",
]
