"""The learner's typed inputs and outputs, modelled on Tinker's: a :class:`Datum` (token ids and the
loss's named per-token inputs), :class:`AdamParams`, :class:`ForwardBackwardOutput`, and how datums
become the padded tensors the model runs on (:func:`collate_datums`).

Position ``i`` of ``model_input`` predicts ``loss_fn_inputs["target_tokens"][i]``: for a sequence
``tokens`` that is ``model_input = tokens[:-1]``, ``target_tokens = tokens[1:]``.

>>> d = Datum.from_tokens([7, 8, 9, 10], weights=[0, 0, 1])  # train on 10 only: given 7, 8, 9
>>> d.model_input, d.loss_fn_inputs["target_tokens"].tolist(), d.loss_fn_inputs["weights"].tolist()
([7, 8, 9], [8, 9, 10], [0.0, 0.0, 1.0])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .batching import Sample, TokenBatch
from .packing import pack_prefixes

__all__ = ["AdamParams", "Datum", "ForwardBackwardOutput", "collate_datums", "datum_from_sample"]


def _tensor(name: str, value: Any, n: int) -> torch.Tensor:
    """``value`` as a 1-D tensor of ``n`` entries: int64 for ``target_tokens``, float32 otherwise (as
    Tinker coerces them)."""
    dtype = torch.long if name == "target_tokens" else torch.float32
    try:
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=dtype)
        t = t.detach().to(device="cpu", dtype=dtype)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"loss_fn_inputs[{name!r}] is not a numeric array: {exc}") from exc
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(
            f"loss_fn_inputs[{name!r}] must be 1-D with one entry per model_input token ({n}), "
            f"got shape {tuple(t.shape)}"
        )
    return t


@dataclass(frozen=True)
class Datum:
    """One sequence for :meth:`~.learner.Learner.forward_backward` (Tinker's ``Datum``).

    Attributes:
        model_input: the token ids the model reads (Tinker's ``ModelInput`` of one text chunk).
        loss_fn_inputs: named per-token arrays, one entry per ``model_input`` token (lists, numpy
            arrays or tensors): ``target_tokens`` always; ``weights`` for ``cross_entropy``; the
            sampler's ``logprobs`` and the ``advantages`` for ``importance_sampling``, ``ppo`` and
            ``cispo``; anything a custom loss reads. ``target_tokens`` becomes int64, the rest float32.
        mask: which positions are scored (1) and which are not (0): the learner computes the logprob
            of each position from the first scored one on, so a prompt whose tokens are not trained
            costs no output-layer work; an unscored position has no gradient and its output logprob
            is NaN. ``None`` (Tinker's behaviour): every position.
        temperature: the logprobs are ``log_softmax(logits / temperature)``, one value or one per
            position (the temperature the sampler used, so the ratio to its logprobs is the policy's).

    >>> import torch
    >>> d = Datum([1, 2], {"target_tokens": [2, 3], "weights": torch.tensor([0.0, 1.0])})
    >>> d.loss_fn_inputs["weights"], d.loss_fn_inputs["target_tokens"].dtype
    (tensor([0., 1.]), torch.int64)
    """

    model_input: Sequence[int]
    loss_fn_inputs: Mapping[str, Any]  # tensors once built (int64 target_tokens, float32 the rest)
    mask: Sequence[float] | None = None
    temperature: float | Sequence[float] = 1.0

    def __post_init__(self) -> None:
        ids = self.model_input.tolist() if isinstance(self.model_input, torch.Tensor) else self.model_input
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not ids:
            raise ValueError(f"Datum.model_input must be a non-empty list of token ids, got {ids!r:.80}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ValueError("Datum.model_input must hold non-negative integer token ids")
        n = len(ids)
        object.__setattr__(self, "model_input", list(ids))
        if not isinstance(self.loss_fn_inputs, Mapping) or "target_tokens" not in self.loss_fn_inputs:
            raise ValueError("Datum.loss_fn_inputs must be a mapping that holds 'target_tokens'")
        inputs = {str(k): _tensor(str(k), v, n) for k, v in self.loss_fn_inputs.items()}
        if bool((inputs["target_tokens"] < 0).any()):
            raise ValueError("loss_fn_inputs['target_tokens'] must hold non-negative token ids")
        object.__setattr__(self, "loss_fn_inputs", inputs)
        if self.mask is not None:
            mask = [float(m) for m in self.mask]
            if len(mask) != n:
                raise ValueError(
                    f"Datum.mask must have one entry per model_input token ({n}), got {len(mask)}"
                )
            object.__setattr__(self, "mask", mask)
        temps = [self.temperature] if isinstance(self.temperature, (int, float)) else list(self.temperature)
        if not isinstance(self.temperature, (int, float)) and len(temps) != n:
            raise ValueError(
                f"Datum.temperature must be one number or one per position ({n}), got {len(temps)}"
            )
        if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in temps):
            raise ValueError(f"Datum.temperature must be finite and > 0, got {self.temperature!r:.80}")

    @property
    def length(self) -> int:
        """The number of positions (tokens of ``model_input``)."""
        return len(self.model_input)

    @classmethod
    def from_tokens(cls, tokens: Sequence[int], **per_token: Sequence[float]) -> Datum:
        """The datum of a whole sequence: ``model_input = tokens[:-1]``, ``target_tokens = tokens[1:]``;
        each keyword (``weights=``, ``advantages=``, ``logprobs=``) is per target token.

        >>> Datum.from_tokens([5, 6, 7], advantages=[0.0, 1.0], logprobs=[0.0, -0.3]).length
        2
        """
        if len(tokens) < 2:
            raise ValueError(f"a sequence needs at least 2 tokens to predict one, got {len(tokens)}")
        return cls(list(tokens[:-1]), {"target_tokens": list(tokens[1:]), **per_token})

    def start(self) -> int:
        """The first scored position (0 without a mask; the last one when nothing is scored)."""
        if self.mask is None:
            return 0
        return next((i for i, m in enumerate(self.mask) if m > 0), self.length - 1)


def datum_from_sample(sample: Sample) -> Datum:
    """A policy call (or a merged trajectory) as a datum: the prompt's positions unscored, each trained
    response token scored at its call's temperature; ``logprobs`` (the engine's, when recorded) and
    ``advantages`` (the call's) on its tokens, 0 elsewhere.

    >>> from agentlightning_lite.rl.batching import Sample
    >>> d = datum_from_sample(Sample([1, 2], [3, 4], [-0.5, -0.25], 1.0, "g", advantage=2.0))
    >>> d.model_input, d.mask, d.loss_fn_inputs["advantages"].tolist()
    ([1, 2, 3], [0.0, 1.0, 1.0], [0.0, 2.0, 2.0])
    """
    if not sample.prompt_ids or not sample.response_ids:
        raise ValueError(
            "a sample needs a prompt and a response to become a datum "
            "(its first response token is predicted from the prompt's last one)"
        )
    pad = [0.0] * (len(sample.prompt_ids) - 1)
    inputs: dict[str, Any] = {
        "target_tokens": sample.prompt_ids[1:] + sample.response_ids,
        "advantages": pad + sample.token_advantages(),
    }
    engine = sample.token_engine_logprobs()
    if engine is not None:
        inputs["logprobs"] = pad + list(engine)
    temps = sample.token_temperatures() if sample.parts else None
    return Datum(
        sample.prompt_ids + sample.response_ids[:-1],
        inputs,
        mask=pad + sample.token_mask(),
        temperature=[1.0] * len(pad) + temps
        if temps
        else (sample.temperature if sample.temperature > 0 else 1.0),
    )


@dataclass(frozen=True)
class AdamParams:
    """One AdamW step's settings, given with each :meth:`~.learner.Learner.optim_step` (Tinker's
    ``AdamParams``, with its defaults). Weight decay is decoupled (AdamW); ``grad_clip_norm`` clips the
    gradients' global norm first (0: no clipping).

    >>> AdamParams(learning_rate=1e-5).beta2
    0.95
    """

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def __post_init__(self) -> None:
        for name in ("learning_rate", "eps", "weight_decay", "grad_clip_norm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"AdamParams.{name} must be a number >= 0, got {value!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"AdamParams.{name} must be in [0, 1), got {value!r}")

    @classmethod
    def from_optimizer(cls, optimizer: torch.optim.Optimizer, grad_clip_norm: float = 0.0) -> AdamParams:
        """The settings ``optimizer``'s first parameter group already has (how GRPO, PPO and SFT step:
        the learning rate and weight decay their optimiser was built with, torch's betas and eps).

        >>> import torch
        >>> opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        >>> AdamParams.from_optimizer(opt, grad_clip_norm=1.0).beta2, AdamParams.from_optimizer(opt).eps
        (0.999, 1e-08)
        """
        group = optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        return cls(
            float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
            float(group["weight_decay"]), grad_clip_norm,
        )  # fmt: skip


@dataclass
class ForwardBackwardOutput:
    """What :meth:`~.learner.Learner.forward_backward` (and ``forward``) return (Tinker's type).

    Attributes:
        loss_fn_outputs: per datum, ``{"logprobs": float32 [N]}``: the logprob of each target token
            (NaN where the datum's ``mask`` left a position unscored).
        metrics: ``name:reduction`` keys (``loss:sum``, the loss summed over tokens, always; a custom
            loss adds its own).

    >>> ForwardBackwardOutput([], {"loss:sum": 1.5}).metrics["loss:sum"]
    1.5
    """

    loss_fn_outputs: list[dict[str, torch.Tensor]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def _row_temperatures(d: Datum) -> list[float]:
    if isinstance(d.temperature, (int, float)):
        return [float(d.temperature)] * d.length
    return [float(t) for t in d.temperature]


def collate_datums(
    datums: Sequence[Datum], pad_id: int, share_prefix: bool = False, names: Sequence[str] = ()
) -> tuple[TokenBatch, dict[str, torch.Tensor]]:
    """The padded batch of ``datums`` (the layout of :func:`~.batching.collate`: each row's scored
    positions, from its first, right-aligned after its left-padded context) and the loss inputs
    ``names`` at those positions, ``[B, R]`` (0 on padding). A datum built from a sample
    (:func:`datum_from_sample`) gives exactly the sample's own batch.

    >>> batch, inputs = collate_datums([Datum.from_tokens([1, 2, 3], weights=[1.0, 1.0])], 0,
    ...                                names=["weights"])
    >>> batch.input_ids.tolist(), batch.response_ids.tolist(), inputs["weights"].tolist()
    ([[1, 2, 3]], [[2, 3]], [[1.0, 1.0]])
    """
    if not datums:
        raise ValueError("an empty batch: give at least one Datum")
    starts = [d.start() for d in datums]
    prompts = [d.model_input[: k + 1] for d, k in zip(datums, starts, strict=True)]
    targets = [d.loss_fn_inputs["target_tokens"][k:] for d, k in zip(datums, starts, strict=True)]
    # the tokens read after the context: the rest of model_input, then one that no scored position sees
    feeds = [[*d.model_input[k + 1 :], int(t[-1])] for d, k, t in zip(datums, starts, targets, strict=True)]
    p_max, r_max, b = max(len(p) for p in prompts), max(len(t) for t in targets), len(datums)
    input_ids = torch.full((b, p_max + r_max), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_max + r_max), dtype=torch.long)
    resp = torch.full((b, r_max), pad_id, dtype=torch.long)
    rmask = torch.zeros((b, r_max), dtype=torch.float32)
    scalar = all(isinstance(d.temperature, (int, float)) for d in datums)
    tok_temps = None if scalar else torch.ones((b, r_max), dtype=torch.float32)
    inputs = {name: torch.zeros((b, r_max), dtype=torch.float32) for name in names}
    for i, (d, k, p, t, f) in enumerate(zip(datums, starts, prompts, targets, feeds, strict=True)):
        r = len(t)
        input_ids[i, p_max - len(p) : p_max] = torch.tensor(p, dtype=torch.long)
        input_ids[i, p_max : p_max + r] = torch.tensor(f, dtype=torch.long)
        attn[i, p_max - len(p) : p_max + r] = 1
        resp[i, :r] = t
        rmask[i, :r] = torch.tensor(d.mask[k:]) if d.mask is not None else 1.0
        if tok_temps is not None:
            tok_temps[i, :r] = torch.tensor(_row_temperatures(d)[k:])
        for name in names:
            if name not in d.loss_fn_inputs:
                raise ValueError(f"the loss needs loss_fn_inputs[{name!r}], which datum {i} lacks")
            inputs[name][i, :r] = d.loss_fn_inputs[name][k:].float()
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    temps = torch.tensor([_row_temperatures(d)[0] if scalar else 1.0 for d in datums], dtype=torch.float32)
    packed = pack_prefixes(prompts, feeds, r_max, pad_id) if share_prefix and b > 1 else None
    batch = TokenBatch(input_ids, attn, position_ids, resp, rmask, temps, r_max, tok_temps, None, packed)
    return batch, inputs
