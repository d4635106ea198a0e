"""Spider text-to-SQL, the Agent Lightning paper's multi-agent benchmark: a LangGraph SQL agent
(writer, checker, rewriter) trained with GRPO on LoRA, the writer and rewriter only.

    python -m benchmarks.spider --data-dir /work/shared/data --threads 1     # CPU defaults, ~15 min
    agl-lite train spider --data-dir /work/shared/data --agents writer rewriter

``agent`` is the training agent (``SpiderAgent()``: sampled writer/rewriter, up to 3 queries);
``load_dataset(split, data_dir=None)`` gives the ``train`` or ``test`` (``val``) tasks, split by
database. See README.md in this folder.
"""

from __future__ import annotations

from .data import load_dataset, split_of
from .exec_eval import execution_match
from .sql_agent import TRAINED_AGENTS, SpiderAgent

#: the agent ``agl-lite train spider`` trains (pass ``--agents writer rewriter`` to freeze the checker)
agent = SpiderAgent()

__all__ = ["TRAINED_AGENTS", "SpiderAgent", "agent", "execution_match", "load_dataset", "split_of"]
