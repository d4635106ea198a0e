"""MuSiQue multi-hop question answering with a retrieval agent (the Agent Lightning paper's RAG task).

An OpenAI Agents SDK agent searches Wikipedia paragraphs (dense retrieval: MiniLM offline, BGE when
given; BM25 without any embedding model) and answers in ``<answer>...</answer>``; the reward is
``0.1 * format + 0.9 * answer F1``. Train on 100 MuSiQue train questions, evaluate on 200 dev ones:

    python -m benchmarks.musique --data-dir /work/shared/data

The CLI's ``agl-lite train musique --data-dir DIR`` uses :data:`agent` and :func:`load_dataset`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import _harness
from .data import download, load_split
from .rag import AgentConfig, make_agent, rag_agent
from .retriever import get_retriever

__all__ = ["AgentConfig", "agent", "load_dataset", "make_agent", "prepare", "rag_agent"]

#: the training agent with the CPU defaults (sampling at temperature 1)
agent = make_agent()


def load_dataset(split: str, data_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """The tasks of ``split`` (``train`` or ``dev``/``test``), from ``data_dir`` or downloaded once."""
    root = _harness.data_dir(Path(data_dir) if data_dir is not None else None, "musique", download)
    return load_split(split, root)


def prepare(tasks: list[dict[str, Any]], retriever: str = AgentConfig().retriever) -> None:
    """Build (or load from its cache) the search index of every corpus the tasks use, before any
    rollout starts: ``agl-lite train musique`` calls this, so no rollout spends its time limit on it."""
    for corpus in dict.fromkeys(t["corpus"] for t in tasks):
        get_retriever(corpus, retriever)
