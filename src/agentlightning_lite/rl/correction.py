"""Off-policy correction of the policy-gradient loss for the gap between the inference engine and the
trainer (``UpdateConfig(correction=...)``), and the metrics of that gap.

The engine samples each token from its own numerics (another kernel, another precision, a stale
adapter): ``pi_engine``. The trainer recomputes the same tokens with the weights the update starts
from: ``pi_old``. The PPO ratio is taken against ``pi_old``; the correction weighs each token's loss by
how far ``pi_old`` is from the policy that actually sampled it, per token ``rho = pi_old / pi_engine``:

- :class:`TIS` (truncated importance sampling): ``w = min(rho, cap)``;
- :class:`MaskedIS` (masked importance sampling, "rejection"): ``w = 1`` where ``rho`` is in
  ``[low, high]``, else 0 (the token, or with ``level="sequence"`` the whole call, leaves the loss);
  at sequence level ``rho`` is the geometric mean of the call's token ratios.

Both weights are constants (no gradient flows through them). Several corrections given as a tuple
multiply (``(TIS(cap=2.0), MaskedIS(level="sequence"))``: truncate per token, reject calls that drift).

>>> import torch
>>> old, eng = torch.tensor([[-1.0, -2.0, -0.5]]), torch.tensor([[-1.5, -1.0, -0.5]])
>>> w, stats = correction_weights(TIS(cap=1.5), old, eng, torch.ones(1, 3))
>>> [round(float(x), 4) for x in w[0]]  # exp(0.5) capped at 1.5, exp(-1), exp(0)
[1.5, 0.3679, 1.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

__all__ = ["Correction", "MaskedIS", "TIS", "correction_weights", "mismatch_metrics", "parse_correction"]


@dataclass(frozen=True)
class TIS:
    """Truncated importance sampling: each token's policy-gradient loss is weighted by
    ``min(pi_old / pi_engine, cap)``, with ``pi_old`` the trainer's recomputed probability of the
    sampled token and ``pi_engine`` the engine's. Unbiased where the ratio stays under ``cap``; the cap
    bounds the variance a token the engine found unlikely can add.

    >>> import agentlightning_lite as agl
    >>> from agentlightning_lite.rl.config import UpdateConfig
    >>> UpdateConfig(correction=agl.TIS(cap=2.0)).correction
    (TIS(cap=2.0),)
    """

    cap: float = 2.0

    def __post_init__(self) -> None:
        if not self.cap >= 1.0:
            raise ValueError(f"TIS: cap must be >= 1, got {self.cap}")


@dataclass(frozen=True)
class MaskedIS:
    """Masked importance sampling: tokens whose ratio ``pi_old / pi_engine`` falls outside
    ``[low, high]`` leave the loss (weight 0; the others keep weight 1). ``level="sequence"`` decides
    per call on the geometric mean of its token ratios, ``exp(mean(log(pi_old / pi_engine)))``, and
    drops or keeps the whole call. Masked tokens still count in the loss's denominator.

    >>> import agentlightning_lite as agl
    >>> agl.MaskedIS(low=0.5, high=2.0, level="sequence").level
    'sequence'
    """

    low: float = 0.5
    high: float = 2.0
    level: Literal["token", "sequence"] = "token"

    def __post_init__(self) -> None:
        if not 0 <= self.low < 1 < self.high:
            raise ValueError(f"MaskedIS: need 0 <= low < 1 < high, got [{self.low}, {self.high}]")
        if self.level not in ("token", "sequence"):
            raise ValueError(f"MaskedIS: level must be 'token' or 'sequence', got {self.level!r}")


Correction = TIS | MaskedIS


def parse_correction(value: Any) -> tuple[Correction, ...]:
    """``None``, one correction or a sequence of them, as a tuple (checked).

    >>> parse_correction(None), parse_correction(TIS())
    ((), (TIS(cap=2.0),))
    """
    if value is None:
        return ()
    items = (value,) if isinstance(value, (TIS, MaskedIS)) else value
    if (
        not isinstance(items, Sequence)
        or isinstance(items, str)
        or not all(isinstance(c, (TIS, MaskedIS)) for c in items)
    ):
        raise TypeError(
            f"correction must be None, agl.TIS(...), agl.MaskedIS(...) or a tuple of them, got {value!r}"
        )
    return tuple(items)


def correction_weights(
    corrections: Sequence[Correction] | Correction,
    old_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token loss weights ``[B, R]`` (0 off ``mask``) and, over the masked tokens, the share
    that was masked (``masked``) or capped (``clipped``), summed counts ``masked_n``/``clipped_n``.

    ``old_logp``: the trainer's logprobs of the sampled tokens; ``engine_logp``: the engine's."""
    import torch

    m = mask > 0
    log_rho = torch.where(m, old_logp - engine_logp, torch.zeros_like(old_logp)).clamp(-20.0, 20.0)
    weight = m.to(old_logp.dtype)
    masked = torch.zeros_like(m)
    clipped = torch.zeros_like(m)
    for c in parse_correction(corrections):
        if isinstance(c, TIS):
            rho = torch.exp(log_rho)
            clipped |= m & (rho > c.cap)
            weight = weight * torch.clamp(rho, max=c.cap)  # w = min(pi_old / pi_engine, cap)
        elif c.level == "token":
            rho = torch.exp(log_rho)
            out = m & ((rho < c.low) | (rho > c.high))  # rejected: pi_old / pi_engine outside [low, high]
            masked |= out
            weight = weight * (~out).to(weight.dtype)
        else:
            n = m.sum(dim=1).clamp(min=1)
            # geometric mean over the call's tokens: exp(sum_t log(pi_old_t / pi_engine_t) / T)
            seq_rho = torch.exp((log_rho * m).sum(dim=1) / n)
            out = m & ((seq_rho < c.low) | (seq_rho > c.high))[:, None]
            masked |= out
            weight = weight * (~out).to(weight.dtype)
    total = max(int(m.sum()), 1)
    stats = {
        "masked_n": float(masked.sum()),
        "clipped_n": float(clipped.sum()),
        "masked": float(masked.sum()) / total,
        "clipped": float(clipped.sum()) / total,
    }
    return weight.detach(), stats


def mismatch_metrics(log_rhos: Sequence[torch.Tensor]) -> dict[str, float]:
    """The train/inference gap over the tokens whose ``log(pi_old / pi_engine)`` are ``log_rhos`` (1-D
    tensors): the k3 estimate of ``KL(pi_engine || pi_old)`` (the tokens were sampled by the engine),
    ``mean(rho - 1 - log rho)``; the ratio's mean and its 5th, 50th and 95th percentiles.

    >>> import torch
    >>> m = mismatch_metrics([torch.tensor([0.0, 0.0, 0.1])])
    >>> round(m["mismatch/ratio_p50"], 4), round(m["mismatch/kl_k3"], 6)
    (1.0, 0.001724)
    """
    import torch

    if not log_rhos or sum(int(x.numel()) for x in log_rhos) == 0:
        return {}
    d = torch.cat([x.detach().double().cpu().flatten() for x in log_rhos]).clamp(-20.0, 20.0)
    rho = torch.exp(d)
    q = torch.quantile(rho, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64))
    return {
        "mismatch/kl_k3": float(
            (rho - 1.0 - d).mean()
        ),  # k3: E_engine[rho - 1 - log rho], rho = pi_old/pi_engine
        "mismatch/ratio_mean": float(rho.mean()),
        "mismatch/ratio_p5": float(q[0]),
        "mismatch/ratio_p50": float(q[1]),
        "mismatch/ratio_p95": float(q[2]),
        "mismatch/tokens": float(d.numel()),
    }
