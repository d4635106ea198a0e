"""The optimisation primitives on a model, Tinker's: ``forward_backward`` (a loss summed over tokens,
its gradients added to those already there), ``forward`` (the same without gradients) and
``optim_step`` (one AdamW step with the settings given, then the gradients zeroed).

:class:`~.learner.Learner` exposes them on its policies; GRPO, PPO and SFT run every micro-batch of
their updates through :func:`run_loss` and every optimiser step through :func:`optim_step`, so the
trainer's updates and a Tinker-style loop share one path.

>>> import torch
>>> from agentlightning_lite.rl.datum import Datum
>>> batch = [Datum.from_tokens([1, 2, 3], weights=[1, 1])]
>>> out = forward_backward(model, batch, "cross_entropy")  # doctest: +SKIP
>>> out.metrics["loss:sum"], out.loss_fn_outputs[0]["logprobs"].shape  # doctest: +SKIP
(11.1, torch.Size([2]))
>>> optim_step(optimizer, AdamParams(learning_rate=1e-4))  # doctest: +SKIP
{'grad_norm': 3.2, 'learning_rate': 0.0001}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .batching import TokenBatch, forward_logprobs
from .datum import AdamParams, Datum, ForwardBackwardOutput, collate_datums
from .losses import LOSS_INPUTS, builtin_loss

__all__ = [
    "LossBatch",
    "LossFn",
    "combine_metrics",
    "forward_backward",
    "optim_step",
    "run_loss",
    "split_datums",
]


@dataclass
class LossBatch:
    """What a custom loss receives for one micro-batch, as padded ``[B, R]`` tensors (the scored
    positions of each datum, left-aligned; 0 on padding).

    Attributes:
        logprobs: the learner's logprob of each target token (with gradient; 0 where unscored).
        mask: 1 on scored positions, 0 elsewhere.
        target_tokens: the target token ids.
        inputs: the datums' other ``loss_fn_inputs`` by name.
        values: the value head's estimate at each position (PPO), or ``None``.
    """

    logprobs: torch.Tensor
    mask: torch.Tensor
    target_tokens: torch.Tensor
    inputs: dict[str, torch.Tensor]
    values: torch.Tensor | None = None


#: a custom loss: the micro-batch's loss, summed over its tokens (micro-batches add up), and optionally
#: ``name:reduction`` metrics
LossFn = Callable[[LossBatch], torch.Tensor | tuple[torch.Tensor, Mapping[str, float]]]

#: how :func:`combine_metrics` reduces a metric across micro-batches, by the suffix of its key
_REDUCTIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": math.fsum,
    "mean": lambda v: math.fsum(v) / len(v),
    "max": max,
    "min": min,
}


def combine_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Metrics of several micro-batches as one, each by the reduction its key names (``loss:sum``
    adds up, ``x:mean`` averages, ``x:max``/``x:min``). A key without exactly one ``:`` or with another
    reduction is a ``ValueError`` (Tinker's clients split every key once on ``:``).

    >>> combine_metrics([{"loss:sum": 1.0, "clip:mean": 0.5}, {"loss:sum": 2.0, "clip:mean": 0.0}])
    {'loss:sum': 3.0, 'clip:mean': 0.25}
    """
    values: dict[str, list[float]] = {}
    for part in parts:
        for key, value in part.items():
            if key.count(":") != 1 or key.split(":")[1] not in _REDUCTIONS:
                raise ValueError(
                    f"metric key {key!r} must be 'name:reduction', the reduction one of "
                    f"{', '.join(_REDUCTIONS)}"
                )
            values.setdefault(key, []).append(float(value))
    return {k: _REDUCTIONS[k.split(":")[1]](v) for k, v in values.items()}


def run_loss(
    model: Any,
    batch: TokenBatch,
    loss: str | LossFn | None,
    inputs: Mapping[str, torch.Tensor] | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    value_head: Any = None,
    autocast: torch.dtype | None = None,
    backward: bool = True,
    label: str = "loss",
) -> tuple[float, torch.Tensor, dict[str, float]]:
    """One micro-batch: the logprobs of its scored positions, the loss of them (a built-in by name with
    ``inputs`` and ``config``, a :data:`LossFn`, or ``None``: no loss), and, with ``backward``, its
    gradients added to the model's. Returns the loss, the logprobs ``[B, R]`` (detached) and the
    loss's own metrics. A non-finite loss raises ``FloatingPointError`` (naming ``label``) before any
    gradient is added.
    """
    lp, values = forward_logprobs(model, batch, value_head, autocast)
    mask = batch.response_mask
    given = dict(inputs or {})
    metrics: dict[str, float] = {}
    if loss is None:  # logprobs only (a forward pass)
        return 0.0, lp.detach(), metrics
    if isinstance(loss, str):
        masked = {k: (v * mask if k in ("weights", "advantages") else v) for k, v in given.items()}
        value = builtin_loss(loss, lp, masked, config)
    else:
        if config:
            raise ValueError("loss_fn_config sets a built-in loss's options; a callable loss takes its own")
        out = loss(LossBatch(lp, mask, batch.response_ids, given, values))
        value, extra = out if isinstance(out, tuple) else (out, {})
        metrics = {str(k): float(v) for k, v in extra.items()}
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        raise TypeError(
            f"a loss must return a scalar tensor (summed over tokens), got {type(value).__name__}"
        )
    if not torch.isfinite(value):
        raise FloatingPointError(f"non-finite {label}: {float(value.detach())}")
    if backward:
        value.backward()
    return float(value.detach()), lp.detach(), metrics


def split_datums(datums: Sequence[Datum], most: int, max_tokens: int) -> list[list[Datum]]:
    """Micro-batches of ``datums`` in order: at most ``most`` each, and ``max_tokens`` padded tokens
    (rows x longest row) unless a single datum is longer.

    >>> ds = [Datum.from_tokens([1] * 10, weights=[1] * 9) for _ in range(5)]
    >>> [len(c) for c in split_datums(ds, 8, 20)]
    [2, 2, 1]
    """
    chunks: list[list[Datum]] = []
    cur: list[Datum] = []
    longest = 0
    for d in datums:
        wider = max(longest, d.length + 1)
        if cur and (len(cur) >= most or (len(cur) + 1) * wider > max_tokens):
            chunks.append(cur)
            cur, wider = [], d.length + 1
        cur.append(d)
        longest = wider
    if cur:
        chunks.append(cur)
    return chunks


def _loss_names(loss: str | LossFn | None, datums: Sequence[Datum]) -> list[str]:
    """The loss inputs to collate: a built-in loss's, or every input of the datums for a callable."""
    if loss is None:
        return []
    if isinstance(loss, str):
        if loss not in LOSS_INPUTS:
            raise ValueError(f"unknown loss {loss!r}; one of {', '.join(LOSS_INPUTS)} or a callable")
        return list(LOSS_INPUTS[loss])
    if not callable(loss):
        raise TypeError(f"loss must be a built-in loss's name or a callable, got {type(loss).__name__}")
    return sorted({k for d in datums for k in d.loss_fn_inputs} - {"target_tokens"})


def forward_backward(
    model: Any,
    datums: Sequence[Datum],
    loss: str | LossFn | None,
    config: Mapping[str, Any] | None = None,
    *,
    value_head: Any = None,
    autocast: torch.dtype | None = None,
    pad_id: int = 0,
    share_prefix: bool = False,
    micro_batch_size: int = 8,
    micro_batch_tokens: int = 2048,
    backward: bool = True,
) -> ForwardBackwardOutput:
    """The loss of ``datums`` (summed over tokens and datums) and, with ``backward``, its gradients
    added to ``model``'s: micro-batch by micro-batch (:func:`split_datums`), which gives the gradient of
    the whole batch since the loss is a sum. Returns each datum's logprobs and ``loss:sum`` (plus a
    custom loss's metrics). ``backward=False`` under ``torch.no_grad()`` is Tinker's ``forward``, where
    ``loss=None`` gives the logprobs alone (no ``loss:sum``).
    """
    if isinstance(datums, Datum) or not datums or not all(isinstance(d, Datum) for d in datums):
        raise TypeError("the batch must be a non-empty list of Datum")
    if loss is None and (backward or config):
        raise ValueError(
            "forward_backward needs a loss (and loss_fn_config one): a built-in loss's name or a callable"
        )
    names = _loss_names(loss, datums)
    device = next(model.parameters()).device
    outputs: list[dict[str, torch.Tensor]] = []
    parts: list[dict[str, float]] = []
    for chunk in split_datums(datums, micro_batch_size, micro_batch_tokens):
        batch, inputs = collate_datums(chunk, pad_id, share_prefix, names)
        batch = batch.to(device)
        value, lp, metrics = run_loss(
            model, batch, loss, {k: v.to(device) for k, v in inputs.items()}, config,
            value_head=value_head, autocast=autocast, backward=backward,
        )  # fmt: skip
        parts.append({"loss:sum": value, **metrics} if loss is not None else {})
        lp, scored = lp.cpu(), batch.response_mask.cpu() > 0
        for i, d in enumerate(chunk):
            start = d.start()
            row = torch.full((d.length,), float("nan"), dtype=torch.float32)
            n = d.length - start
            row[start:] = torch.where(scored[i, :n], lp[i, :n], torch.tensor(float("nan")))
            outputs.append({"logprobs": row})
    return ForwardBackwardOutput(outputs, combine_metrics(parts))


def optim_step(
    optimizer: torch.optim.Optimizer, adam: AdamParams, *, value_head: Any = None, data_parallel: Any = None
) -> dict[str, float]:
    """One AdamW step on the gradients accumulated since the last one, with ``adam``'s settings, then
    the gradients zeroed. Under data parallelism (``data_parallel``) the ranks' gradients are summed
    first. The parameter group of ``value_head`` (PPO's) keeps its own learning rate.

    Returns ``grad_norm`` (before clipping) and ``learning_rate``.
    """
    if not isinstance(adam, AdamParams):
        raise TypeError(f"optim_step takes AdamParams(...), got {type(adam).__name__}")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    head = {id(p) for p in value_head.parameters()} if value_head is not None else set()
    for group in optimizer.param_groups:
        if "betas" not in group:
            raise TypeError(f"optim_step needs an Adam optimiser, got {type(optimizer).__name__}")
        if not (head and all(id(p) in head for p in group["params"])):
            group["lr"] = adam.learning_rate
        group["betas"] = (adam.beta1, adam.beta2)
        group["eps"] = adam.eps
        group["weight_decay"] = adam.weight_decay
    if data_parallel is not None:
        data_parallel.all_reduce_grads(params)  # the sum is the whole batch's gradient
    limit = adam.grad_clip_norm if adam.grad_clip_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, limit)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"grad_norm": float(grad_norm), "learning_rate": adam.learning_rate}
