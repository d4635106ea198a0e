"""The store the reading commands open: :class:`~agentlightning_lite.store.readonly.ReadOnlyStore`."""

from __future__ import annotations

import argparse

from ..store.readonly import ReadOnlyStore

__all__ = ["ReadOnlyStore"]


def open_store(args: argparse.Namespace) -> ReadOnlyStore:
    """The store named by the command's DB argument, opened read-only."""
    return ReadOnlyStore(args.db)
