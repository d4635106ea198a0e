"""The Tinker losses, per token and summed (never normalised): ``lp`` is the learner's logprob of each
target token, ``r = exp(lp - sampling logprob)`` the importance ratio.

=====================  ==================================  ==========================================
loss                   inputs (besides ``target_tokens``)  per-token objective (minimised)
=====================  ==================================  ==========================================
cross_entropy          weights                             ``-w * lp``
importance_sampling    logprobs, advantages                ``-r * A``
ppo                    logprobs, advantages                ``-min(r * A, clip(r, lo, hi) * A)``
cispo                  logprobs, advantages                ``-stopgrad(clip(r, lo, hi)) * A * lp``
=====================  ==================================  ==========================================

``ppo`` reads ``clip_low_threshold`` (0.8) and ``clip_high_threshold`` (1.2) from ``loss_fn_config``,
``cispo`` ``clip_low`` (0.0) and ``clip_high`` (4.0).

>>> import torch
>>> lp = torch.tensor([-1.0, -2.0])
>>> token_losses("cross_entropy", lp, {"weights": torch.tensor([1.0, 0.5])}, {}).tolist()
[1.0, 1.0]
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .futures import OpError

__all__ = ["LOSSES", "required_inputs", "token_losses"]

Inputs = dict[str, torch.Tensor]


def _cross_entropy(lp: torch.Tensor, x: Inputs, config: dict[str, float]) -> torch.Tensor:
    return -x["weights"] * lp


def _importance_sampling(lp: torch.Tensor, x: Inputs, config: dict[str, float]) -> torch.Tensor:
    ratio = torch.exp(lp - x["logprobs"])
    return -ratio * x["advantages"]


def _ppo(lp: torch.Tensor, x: Inputs, config: dict[str, float]) -> torch.Tensor:
    low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
    ratio = torch.exp(lp - x["logprobs"])
    adv = x["advantages"]
    return -torch.minimum(ratio * adv, torch.clamp(ratio, low, high) * adv)


def _cispo(lp: torch.Tensor, x: Inputs, config: dict[str, float]) -> torch.Tensor:
    low, high = config.get("clip_low", 0.0), config.get("clip_high", 4.0)
    ratio = torch.exp(lp - x["logprobs"]).detach()
    return -torch.clamp(ratio, low, high) * x["advantages"] * lp


#: loss name -> (its inputs besides target_tokens, the per-token objective)
LOSSES: dict[
    str, tuple[tuple[str, ...], Callable[[torch.Tensor, Inputs, dict[str, float]], torch.Tensor]]
] = {
    "cross_entropy": (("weights",), _cross_entropy),
    "importance_sampling": (("logprobs", "advantages"), _importance_sampling),
    "ppo": (("logprobs", "advantages"), _ppo),
    "cispo": (("logprobs", "advantages"), _cispo),
}


def required_inputs(loss_fn: str) -> tuple[str, ...]:
    """The ``loss_fn_inputs`` a loss needs (``target_tokens`` first); an :class:`~.futures.OpError`
    naming the served losses for another one.

    >>> required_inputs("importance_sampling")
    ('target_tokens', 'logprobs', 'advantages')
    """
    if loss_fn not in LOSSES:
        raise OpError(
            f"loss_fn {loss_fn!r} is not served here; this server computes {', '.join(LOSSES)} "
            "(dro, gspo, stable_reinforce and server-side custom losses are not implemented)"
        )
    return ("target_tokens", *LOSSES[loss_fn][0])


def token_losses(loss_fn: str, lp: torch.Tensor, inputs: Inputs, config: dict[str, float]) -> torch.Tensor:
    """The per-token loss of one datum (sum it for the datum's loss)."""
    required_inputs(loss_fn)
    return LOSSES[loss_fn][1](lp, inputs, config)
