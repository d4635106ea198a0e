"""Every loss the learner minimises, as pure functions of per-token tensors: the one home for losses.

Tinker's built-in losses (``cross_entropy``, ``importance_sampling``, ``ppo``, ``cispo``) are
**sum-reduced** over tokens and never normalised: a caller who wants a mean scales its ``weights`` or
``advantages`` (GRPO's ``token-mean`` gives each trained token ``1 / tokens``). ``logprobs`` is the
learner's logprob of each target token (with gradient); ``sampling_logprobs`` is the logprob the
sampler gave it (Tinker's ``loss_fn_inputs["logprobs"]``); ``r = exp(logprobs - sampling_logprobs)``.
A position with weight or advantage 0 (a prompt token, padding) adds nothing.

GRPO's and PPO's own per-token pieces live here too: :func:`policy_loss` (the clipped surrogate with
its statistics), :func:`kl_penalty`, :func:`value_loss`, and :func:`aggregate`, which reduces per-token
losses the way ``loss_agg`` says.

>>> import torch
>>> lp, old = torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.0])
>>> float(cross_entropy(lp, weights=torch.tensor([1.0, 0.5])))  # -(1 * -1 + 0.5 * -2)
2.0
>>> float(ppo(lp, old, advantages=torch.tensor([1.0, 2.0])))  # r = 1 on both tokens: -(1 + 2)
-3.0
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = [
    "LOSS_CONFIG",
    "LOSS_INPUTS",
    "aggregate",
    "builtin_loss",
    "builtin_token_losses",
    "cispo",
    "cross_entropy",
    "importance_sampling",
    "kl_penalty",
    "policy_loss",
    "ppo",
    "token_cispo",
    "token_cross_entropy",
    "token_importance_sampling",
    "token_ppo",
    "value_loss",
]

#: the largest |log ratio| the ratio is taken of (exp(20) is already far beyond any clip)
_MAX_LOG_RATIO = 20.0


def _ratio(logprobs: torch.Tensor, sampling_logprobs: torch.Tensor) -> torch.Tensor:
    return torch.exp((logprobs - sampling_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def token_cross_entropy(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """:func:`cross_entropy` per token (its sum is the loss; Tinker's ``elementwise_loss``)."""
    return -weights * logprobs


def token_importance_sampling(
    logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor
) -> torch.Tensor:
    """:func:`importance_sampling` per token."""
    return -_ratio(logprobs, sampling_logprobs) * advantages


def token_ppo(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low_threshold: float = 0.8,
    clip_high_threshold: float = 1.2,
) -> torch.Tensor:
    """:func:`ppo` per token."""
    r = _ratio(logprobs, sampling_logprobs)
    return -torch.minimum(
        r * advantages, torch.clamp(r, clip_low_threshold, clip_high_threshold) * advantages
    )


def token_cispo(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.0,
    clip_high: float = 4.0,
) -> torch.Tensor:
    """:func:`cispo` per token."""
    weight = torch.clamp(_ratio(logprobs, sampling_logprobs), clip_low, clip_high)
    return -(weight.detach() * advantages * logprobs)


def cross_entropy(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Tinker's ``cross_entropy``: ``L = sum(-weights * logprobs)``. Weights are any reals (0 on
    tokens that are not trained; a custom loss sends negative and fractional ones).

    >>> import torch
    >>> float(cross_entropy(torch.tensor([-0.5, -3.0]), torch.tensor([2.0, 0.0])))
    1.0
    """
    return token_cross_entropy(logprobs, weights).sum()


def importance_sampling(
    logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor
) -> torch.Tensor:
    """Tinker's ``importance_sampling``: ``L = sum(-r * advantages)``, ``r = exp(lp - lp_sampling)``
    (the REINFORCE gradient, corrected for the sampler being another policy).

    >>> import torch
    >>> lp = torch.tensor([-1.0, -1.0], requires_grad=True)
    >>> importance_sampling(lp, torch.tensor([-1.0, -1.0]), torch.tensor([2.0, 0.0])).backward()
    >>> lp.grad.tolist()  # d(-r A)/d lp = -r A
    [-2.0, -0.0]
    """
    return token_importance_sampling(logprobs, sampling_logprobs, advantages).sum()


def ppo(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low_threshold: float = 0.8,
    clip_high_threshold: float = 1.2,
) -> torch.Tensor:
    """Tinker's ``ppo``: ``L = sum(-min(r * A, clip(r, low, high) * A))``; the thresholds bound the
    ratio itself (Tinker's defaults 0.8 and 1.2: a clip range of 0.2 on both sides).

    >>> import torch
    >>> lp, old = torch.tensor([0.0, 0.0]), torch.log(torch.tensor([0.5, 0.5]))  # r = 2 on both
    >>> float(ppo(lp, old, torch.tensor([1.0, -1.0])))  # -(min(2, 1.2) + min(-2, -1.2))
    0.7999999523162842
    """
    return token_ppo(logprobs, sampling_logprobs, advantages, clip_low_threshold, clip_high_threshold).sum()


def cispo(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.0,
    clip_high: float = 4.0,
) -> torch.Tensor:
    """Tinker's ``cispo`` (MiniMax-M1): ``L = sum(-sg(clip(r, low, high)) * A * lp)``: the clipped
    ratio weighs the REINFORCE term without a gradient of its own, so no token's gradient is cut.

    >>> import torch
    >>> lp = torch.tensor([0.0], requires_grad=True)
    >>> cispo(lp, torch.tensor([-2.0]), torch.tensor([1.0])).backward()  # r = e^2 > 4: clipped
    >>> lp.grad.tolist()
    [-4.0]
    """
    return token_cispo(logprobs, sampling_logprobs, advantages, clip_low, clip_high).sum()


#: each built-in loss's ``loss_fn_inputs`` (beside ``target_tokens``), as Tinker names them
LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
}
#: each built-in loss's ``loss_fn_config`` keys and their defaults
LOSS_CONFIG: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low": 0.0, "clip_high": 4.0},
}
_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
}


_TOKEN_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "cross_entropy": token_cross_entropy,
    "importance_sampling": token_importance_sampling,
    "ppo": token_ppo,
    "cispo": token_cispo,
}


def builtin_loss(
    name: str,
    logprobs: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """The built-in loss ``name`` of ``logprobs`` with Tinker's ``loss_fn_inputs`` (``inputs``:
    ``weights``, or the sampler's ``logprobs`` and ``advantages``) and ``loss_fn_config``. An unknown
    name, a missing input or an unknown config key is a ``ValueError`` that names it.

    >>> import torch
    >>> lp = torch.tensor([-1.0, -1.0])
    >>> float(builtin_loss("ppo", lp, {"logprobs": lp, "advantages": torch.tensor([1.0, 1.0])},
    ...                    {"clip_high_threshold": 1.28}))
    -2.0
    """
    return builtin_token_losses(name, logprobs, inputs, config).sum()


def builtin_token_losses(
    name: str,
    logprobs: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    config: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """:func:`builtin_loss` per token (Tinker's ``elementwise_loss``), with the same checks.

    >>> import torch
    >>> lp, w = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 0.5])
    >>> builtin_token_losses("cross_entropy", lp, {"weights": w})
    tensor([1., 1.])
    """
    settings = _checked(name, inputs, config)
    if name == "cross_entropy":
        return token_cross_entropy(logprobs, inputs["weights"])
    return _TOKEN_FUNCTIONS[name](logprobs, inputs["logprobs"], inputs["advantages"], **settings)


def _checked(
    name: str, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any] | None
) -> dict[str, float]:
    """The loss settings ``config`` gives, over its defaults; a ``ValueError`` naming what is wrong."""
    if name not in _FUNCTIONS:
        raise ValueError(f"unknown loss {name!r}; one of {', '.join(_FUNCTIONS)} or a callable")
    missing = [k for k in LOSS_INPUTS[name] if k not in inputs]
    if missing:
        raise ValueError(
            f"loss {name!r} needs loss_fn_inputs {', '.join(LOSS_INPUTS[name])}; missing {missing}"
        )
    settings = dict(LOSS_CONFIG[name])
    for key, value in (config or {}).items():
        if key not in settings:
            allowed = ", ".join(settings) or "none"
            raise ValueError(f"loss_fn_config key {key!r} is not valid for {name!r} (valid: {allowed})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"loss_fn_config[{key!r}] must be a number, got {value!r}")
        settings[key] = float(value)
    return settings


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO-clip surrogate of GRPO and PPO (to be aggregated with :func:`aggregate`).

    ``ratio = exp(logp - old_logp)``;
    ``loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``.
    ``advantages`` is one value per sequence (broadcast over its tokens) or per token. Summed with
    per-token weights ``w >= 0`` folded into ``A``, it is :func:`ppo` with thresholds
    ``1 - clip_low`` and ``1 + clip_high``.

    >>> import torch
    >>> loss, stats = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([1.0]),
    ...                           torch.ones(1, 2), 0.2, 0.2)
    >>> loss.tolist(), float(stats["clip_frac"])
    ([[-1.0, -1.0]], 0.0)
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    ratio = _ratio(logp, old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        m = mask.bool()
        stats = {
            # tokens where the clipped term is the smaller one: their gradient is cut
            "clip_frac": ((clipped < unclipped) & m).float().sum() / m.sum().clamp(min=1),
            "ratio_mean": ratio[m].mean() if m.any() else torch.tensor(1.0),
        }
    return loss, stats


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled tokens.

    ``k1 = logp - ref_logp``; ``k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1`` (>= 0).

    >>> import torch
    >>> kl_penalty(torch.tensor([-1.0]), torch.tensor([-1.5]), "k1").tolist()
    [0.5]
    """
    if estimator == "k1":
        return logp - ref_logp
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> torch.Tensor:
    """Per-token ``0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2)`` (unclipped if ``clip`` is None).

    >>> import torch
    >>> value_loss(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.0]), clip=0.2).tolist()
    [0.5]
    """
    err = (values - returns) ** 2
    if clip is None:
        return 0.5 * err
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum(err, (clipped - returns) ** 2)


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    max_tokens: int = 512,
    segments: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token losses ``[batch, tokens]`` to a scalar; see :class:`~.grpo.GRPO` ``loss_agg``.

    ``segments`` (``[batch, tokens]``, 1, 2, ... per call, 0 elsewhere) marks rows that hold several
    calls (trajectory mode): the ``seq-mean-*`` modes then treat each call as its own sequence, so a
    merged episode aggregates exactly as its calls would one by one. ``"rollout-mean-token-mean"``
    needs ``weights`` (``[batch, tokens]``, from :func:`~.policy_gradient.micro_batch_weights`: they
    know which rollout each row belongs to) and returns ``sum(loss * mask * weights)``.

    >>> import torch
    >>> loss, mask = torch.tensor([[1.0, 1.0], [4.0, 0.0]]), torch.tensor([[1, 1], [1, 0]])
    >>> [float(aggregate(loss, mask, m, max_tokens=2)) for m in
    ...  ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")]
    [2.0, 2.5, 1.5]
    >>> merged = torch.tensor([[1.0, 1.0, 9.0, 4.0]]), torch.tensor([[1, 1, 0, 1]])
    >>> float(aggregate(*merged, "seq-mean-token-mean", segments=torch.tensor([[1, 1, 0, 2]])))
    2.5
    """
    mask = mask.to(loss.dtype)
    if mode == "rollout-mean-token-mean":
        if weights is None:
            raise ValueError("loss aggregation 'rollout-mean-token-mean' needs the per-token weights")
        return (loss * mask * weights.to(loss.dtype)).sum()
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum().clamp(min=1.0)
    if mode not in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        raise ValueError(f"unknown loss aggregation {mode!r}")
    if segments is None:
        per_seq_sum = (loss * mask).sum(dim=-1)
        per_seq_len = mask.sum(dim=-1)
    else:  # one "sequence" per (row, call)
        n_seg = int(segments.max()) + 1
        rows = torch.arange(loss.shape[0], device=loss.device)[:, None]
        keep = mask.bool() & (segments > 0)
        ids = (rows * n_seg + segments)[keep]
        per_seq_sum = torch.zeros(loss.shape[0] * n_seg, dtype=loss.dtype, device=loss.device)
        per_seq_sum = per_seq_sum.index_add(0, ids, (loss * mask)[keep])
        per_seq_len = torch.zeros_like(per_seq_sum).index_add(0, ids, mask[keep])
        present = per_seq_len > 0
        per_seq_sum, per_seq_len = per_seq_sum[present], per_seq_len[present]
    if mode == "seq-mean-token-mean":
        return (per_seq_sum / per_seq_len.clamp(min=1.0)).mean()
    return (per_seq_sum / float(max_tokens)).mean()
