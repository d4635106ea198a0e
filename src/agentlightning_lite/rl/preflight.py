"""Before the first step: how long a rollout takes on this engine, and a rollout timeout that fits it.

An agent may say how many tokens one rollout generates at most, as an attribute
``max_rollout_tokens`` (``agl.envs.ReasoningGym``'s agent has it: its ``max_tokens``; a function
agent can carry one: ``agent.max_rollout_tokens = 256``). Then, before the first step of ``fit`` or
``evaluate``, the trainer times a few greedy decoding steps on its engine with as many requests
decoding together as the step will run (:func:`time_decode_step`, a couple of seconds on a CPU),
and estimates how long a rollout that generates all its tokens takes (:class:`RolloutEstimate`):

* ``RolloutConfig(timeout="auto")`` (the default) becomes :data:`~.config.AUTO_MARGIN` times that,
  at least :data:`~.config.AUTO_FLOOR_S` (logged with the figures);
* a number below the estimate is kept, and a warning says so before the first rollout, with the
  figures and what to change: a smaller ``max_tokens``, a stop string, a larger
  ``RolloutConfig(timeout=...)`` (or ``"auto"``), fewer rollouts at once.

An agent that says nothing gets :data:`~.config.AUTO_FLOOR_S` under ``"auto"`` and no timing.

>>> from agentlightning_lite.rl.config import RolloutConfig
>>> estimate = RolloutEstimate(tokens=512, at_once=32, width=16, step_s=0.25)
>>> round(estimate.seconds)
256
>>> config = RolloutConfig()
>>> fit_timeout(config, estimate)
768.0
>>> config.timeout_s
768.0
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from ..serving.engines.base import GenRequest
from ..serving.engines.contract import BatchLimitedEngine, ServingEngine
from .config import AUTO_FLOOR_S, AUTO_MARGIN, RolloutConfig

__all__ = [
    "PROBE_TOKENS",
    "RolloutEstimate",
    "declared_tokens",
    "estimate",
    "fit_timeout",
    "time_decode_step",
]

logger = logging.getLogger(__name__)

#: decoding steps timed (after one short warm-up request)
PROBE_TOKENS = 16
PROBE_TEXT = "Count from one to one hundred in words: one, two, three, four,"


def declared_tokens(agent: Any) -> int | None:
    """The most tokens one rollout of ``agent`` generates, when it says (``agent.max_rollout_tokens``).

    >>> def agent(task, llm): ...
    >>> agent.max_rollout_tokens = 256
    >>> declared_tokens(agent), declared_tokens(print)
    (256, None)
    """
    n = getattr(agent, "max_rollout_tokens", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


@dataclass(frozen=True)
class RolloutEstimate:
    """How long a rollout that generates all its ``tokens`` takes: ``at_once`` rollouts run together,
    ``width`` of them decoded in one batch (the engine's ``max_batch_size``), each decoding step of
    that batch taking ``step_s`` seconds (timed on the engine)."""

    tokens: int
    at_once: int
    width: int
    step_s: float

    @property
    def seconds(self) -> float:
        """``tokens * step_s``, times the batches the rollouts at once take turns in."""
        return self.tokens * self.step_s * math.ceil(self.at_once / self.width)

    def figures(self) -> str:
        """The estimate in words, with its figures.

        >>> figures = RolloutEstimate(tokens=1024, at_once=32, width=16, step_s=0.15).figures()
        >>> print(figures)  # doctest: +NORMALIZE_WHITESPACE
        a rollout that generates its 1024 tokens takes about 307 s here (32 rollouts at once,
        2 batches taking turns, 0.150 s per decoding step of 16 rows, timed on the engine)
        """
        batches = math.ceil(self.at_once / self.width)
        turns = f", {batches} batches taking turns" if batches > 1 else ""
        return (
            f"a rollout that generates its {self.tokens} tokens takes about {self.seconds:.0f} s here "
            f"({self.at_once} rollouts at once{turns}, {self.step_s:.3f} s per decoding step of "
            f"{self.width} rows, timed on the engine)"
        )


def time_decode_step(engine: ServingEngine, width: int, tokens: int = PROBE_TOKENS) -> float:
    """Seconds per decoding step of ``width`` requests together on ``engine`` (greedy, a short prompt;
    a one-token request first warms it up). A reply that ends early counts its prefill in fewer
    steps: the figure errs long."""
    prompt = engine.encode(PROBE_TEXT)
    engine.generate([GenRequest(list(prompt), max_tokens=1, temperature=0.0)])
    requests = [GenRequest(list(prompt), max_tokens=tokens, temperature=0.0) for _ in range(width)]
    start = time.perf_counter()
    results = engine.generate(requests)
    elapsed = time.perf_counter() - start
    return elapsed / max(1, max((r.num_tokens for r in results), default=0))


def estimate(
    engine: ServingEngine, agent: Any, at_once: int, timed: MutableMapping[int, float] | None = None
) -> RolloutEstimate | None:
    """The :class:`RolloutEstimate` of ``agent``'s rollouts, ``at_once`` of them together on ``engine``
    (``None`` when the agent does not declare its tokens, or the engine cannot be timed: logged).
    ``timed`` keeps the step time per width, so a trainer times its engine once."""
    tokens = declared_tokens(agent)
    if tokens is None:
        return None
    at_once = max(1, at_once)
    width = min(at_once, engine.max_batch_size) if isinstance(engine, BatchLimitedEngine) else at_once
    timed = {} if timed is None else timed
    if width not in timed:
        try:
            timed[width] = time_decode_step(engine, width)
        except Exception as exc:  # the first step will say what is wrong with the engine
            logger.warning(
                "could not time the engine before the first step (%s): %r", type(engine).__name__, exc
            )
            return None
    return RolloutEstimate(tokens, at_once, width, timed[width])


def fit_timeout(config: RolloutConfig, estimate: RolloutEstimate | None) -> float | None:
    """Size ``config.timeout="auto"`` to ``estimate`` (or warn that a set timeout is below it);
    returns the timeout in effect (:attr:`RolloutConfig.timeout_s`)."""
    if config.timeout == "auto":
        config.auto_timeout = None if estimate is None else max(AUTO_FLOOR_S, AUTO_MARGIN * estimate.seconds)
        if estimate is not None:
            logger.info(
                "RolloutConfig(timeout='auto') -> %.0f s: %s; x%g, at least %.0f s",
                config.timeout_s, estimate.figures(), AUTO_MARGIN, AUTO_FLOOR_S,
            )  # fmt: skip
        return config.timeout_s
    limit = config.timeout_s
    if estimate is not None and limit is not None and estimate.seconds > limit:
        logger.warning(
            "%s, over RolloutConfig(timeout=%g): a rollout whose replies run to max_tokens will time "
            "out and be dropped. Lower the agent's max_tokens (agl.envs.ReasoningGym(max_tokens=...)), "
            "end its replies with a stop string, raise RolloutConfig(timeout=...) (or leave it 'auto': "
            "%.0f s here), or run fewer rollouts at once (batch_size, group_size, "
            "RolloutConfig(concurrency=...))",
            estimate.figures(), limit, max(AUTO_FLOOR_S, AUTO_MARGIN * estimate.seconds),
        )  # fmt: skip
    return limit
