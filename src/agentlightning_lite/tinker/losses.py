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
``cispo`` ``clip_low`` (0.0) and ``clip_high`` (4.0). They are computed by the learner
(:mod:`agentlightning_lite.rl.losses`, their one home); this module names what the server accepts.

>>> required_inputs("cross_entropy")
('target_tokens', 'weights')
"""

from __future__ import annotations

from ..rl import losses as rl_losses
from .futures import OpError

__all__ = ["LOSSES", "required_inputs"]

#: the losses served: the learner's built-in ones (``agentlightning_lite.rl.losses``, their one home)
LOSSES: tuple[str, ...] = tuple(rl_losses.LOSS_INPUTS)


def required_inputs(loss_fn: str) -> tuple[str, ...]:
    """The ``loss_fn_inputs`` a loss needs (``target_tokens`` first); an :class:`~.futures.OpError`
    naming the served losses for another one.

    >>> required_inputs("importance_sampling")
    ('target_tokens', 'logprobs', 'advantages')
    """
    if loss_fn not in rl_losses.LOSS_INPUTS:
        raise OpError(
            f"loss_fn {loss_fn!r} is not served here; this server computes {', '.join(LOSSES)} "
            "(dro, gspo, stable_reinforce and server-side custom losses are not implemented)"
        )
    return ("target_tokens", *rl_losses.LOSS_INPUTS[loss_fn])
