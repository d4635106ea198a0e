"""Credit assignment (LightningRL): spread an episode's rewards over its policy-model calls.

A credit rule is any callable ``(steps, final_reward) -> list[float | None]`` returning one reward
per step (policy call), in call order. Each :class:`Step` carries the intermediate rewards that
were attributed to that call (from ``emit_reward`` during the episode and from ``air`` rules).

Rules provided, with ``r_t`` the summed intermediate reward of call ``t`` (of ``T`` calls) and
``R`` the episode's final reward:

* ``FinalReward()``: ``reward_t = R`` for every call (the Agent Lightning paper's default).
* ``Discounted(gamma)``: ``reward_t = sum_{k>=t} gamma^(k-t) * r_k + gamma^(T-1-t) * R``, i.e. the
  final reward is received after the last call and every reward is discounted back to the calls
  that came before it (``R`` counts as 0 when the episode has none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .types import Span

__all__ = ["CreditRule", "Discounted", "FinalReward", "Step"]


@dataclass
class Step:
    """One policy call of an episode, as seen by a credit rule."""

    index: int
    span: Span
    rewards: list[tuple[str, float]] = field(default_factory=list)

    @property
    def agent(self) -> str | None:
        """The agent that made the call."""
        return self.span.agent

    @property
    def intermediate(self) -> float:
        """The sum of the intermediate rewards attributed to this call."""
        return float(sum(v for _, v in self.rewards))


CreditRule = Callable[[Sequence[Step], "float | None"], "list[float | None]"]


@dataclass(frozen=True)
class FinalReward:
    """Every call gets the episode's final reward (``None`` if the episode has none).

    With ``add_intermediate=True`` each call also gets its own intermediate rewards.

    >>> from agentlightning_lite import credit
    >>> from agentlightning_lite.types import Span
    >>> steps = [credit.Step(i, Span(span_id=str(i), rollout_id="r", start_time=i)) for i in range(3)]
    >>> credit.FinalReward()(steps, 1.0)
    [1.0, 1.0, 1.0]
    """

    add_intermediate: bool = False

    def __call__(self, steps: Sequence[Step], final_reward: float | None) -> list[float | None]:
        if final_reward is None:
            if not self.add_intermediate:
                return [None] * len(steps)
            return [s.intermediate for s in steps]
        if self.add_intermediate:
            return [final_reward + s.intermediate for s in steps]
        return [final_reward] * len(steps)


@dataclass(frozen=True)
class Discounted:
    """Discounted return over the calls: intermediate rewards plus the final reward.

    ``reward_t = r_t + gamma * reward_{t+1}``, with the final reward added to the last call's
    ``r``. ``gamma=1`` sums every reward that comes at or after a call.

    >>> from agentlightning_lite import credit
    >>> from agentlightning_lite.types import Span
    >>> steps = [credit.Step(i, Span(span_id=str(i), rollout_id="r", start_time=i)) for i in range(3)]
    >>> steps[0].rewards.append(("tool", 0.5))
    >>> credit.Discounted(0.5)(steps, 1.0)
    [0.75, 0.5, 1.0]
    """

    gamma: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")

    def __call__(self, steps: Sequence[Step], final_reward: float | None) -> list[float | None]:
        out: list[float | None] = [0.0] * len(steps)
        running = 0.0 if final_reward is None else float(final_reward)
        for t in range(len(steps) - 1, -1, -1):
            if t < len(steps) - 1:
                running *= self.gamma
            running += steps[t].intermediate
            out[t] = running
        return out
