"""The store the reading commands open: :class:`~agentlightning_lite.store.readonly.ReadOnlyStore`."""

from __future__ import annotations

import argparse

from ..store.readonly import ReadOnlyStore

__all__ = ["ReadOnlyStore"]


def _open(args: argparse.Namespace) -> ReadOnlyStore:
    return ReadOnlyStore(args.db)
