"""Harness agents: train any program launched per rollout (a coding-agent CLI or any script).

:class:`CommandAgent` launches the program once per rollout, sandboxed, with the rollout's endpoint
in its environment; :func:`opencode`, :func:`codex` and :func:`claude_code` are CommandAgents set up
for those harnesses. See ``docs/harnesses.md``.
"""

from .command import SIDE_AGENT, CommandAgent, HarnessResult, HarnessRun
from .recipes import claude_code, codex, opencode

__all__ = ["SIDE_AGENT", "CommandAgent", "HarnessResult", "HarnessRun", "claude_code", "codex", "opencode"]
