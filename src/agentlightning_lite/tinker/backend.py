"""The training side of the Tinker API, as a small typed protocol: what the HTTP layer asks of a
trainer (create a LoRA model, accumulate gradients, take an optimiser step, save and load weights,
hand weights to the sampler), and the plain records it passes.

:class:`~.peft_backend.PeftBackend` implements it on the project's transformers engine (peft LoRA
adapters trained in place, sampled by the same engine).

>>> adam_params({"learning_rate": 1e-3}).beta2
0.95
>>> Datum(tokens=[1, 2], inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]}).length
2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..rl.datum import AdamParams
from .futures import OpError

__all__ = [
    "AdamParams",
    "Datum",
    "ForwardBackwardResult",
    "ModelInfo",
    "SampledSequence",
    "TrainingBackend",
    "adam_params",
]


@dataclass
class Datum:
    """One training example: the ``tokens`` of its model input, and its loss inputs by name
    (``target_tokens``, ``weights``, ``logprobs``, ``advantages``...), each one value per token."""

    tokens: list[int]
    inputs: dict[str, list[float]] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.tokens)


def adam_params(body: Any) -> AdamParams:
    """The learner's :class:`~agentlightning_lite.rl.datum.AdamParams` from a request's ``adam_params``
    object (Tinker's defaults for what it leaves out); an :class:`~.futures.OpError` naming a field that
    is not a number or is out of range.

    >>> adam_params({"learning_rate": 1e-3}).beta2
    0.95
    """
    if not isinstance(body, dict):
        raise OpError(f"adam_params must be an object, got {type(body).__name__}")
    values: dict[str, float] = {}
    for name in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise OpError(f"adam_params.{name} must be a finite number, got {value!r}")
        values[name] = float(value)
    try:
        return AdamParams(**values)
    except ValueError as exc:
        raise OpError(f"adam_params: {exc}") from None


@dataclass
class ForwardBackwardResult:
    """Per datum, named arrays (``logprobs``: one per token, ``elementwise_loss``); the metrics
    (each key ``name:reduction``, with ``loss:sum`` always there)."""

    outputs: list[dict[str, list[float]]]
    metrics: dict[str, float]


@dataclass
class ModelInfo:
    """What ``/get_info`` reports about a training model."""

    model_id: str
    base_model: str
    lora_rank: int
    tokenizer_id: str
    train_attn: bool = True  #: LoRA on the attention projections
    train_mlp: bool = True  #: LoRA on the MLP projections
    train_unembed: bool = True  #: LoRA on the unembedding (``lm_head``)


@dataclass
class SampledSequence:
    """One sample: its tokens (the stop token included), their logprobs, and why it stopped
    (``"stop"`` or ``"length"``)."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str
    weights_version: int | None = None  #: the engine's weight version it was generated on


@runtime_checkable
class TrainingBackend(Protocol):
    """What the Tinker server asks of a trainer. Model ids are chosen by the server; ``sampler``
    names what :meth:`save_for_sampler` returned (``None``: the base model). Methods raise
    :class:`~.futures.OpError` for a request that cannot be served (its message reaches the client)."""

    def base_model_names(self) -> list[str]:
        """The names ``create_model(base_model=...)`` accepts; the first is the one reported."""
        ...

    def create_model(
        self,
        model_id: str,
        base_model: str,
        lora_rank: int,
        seed: int | None,
        *,
        train_attn: bool = True,
        train_mlp: bool = True,
        train_unembed: bool = True,
    ) -> ModelInfo:
        """A fresh LoRA adapter of rank ``lora_rank`` on the base model, with its own optimiser, on the
        attention projections, the MLP projections and the unembedding as the three flags say (Tinker's
        ``LoraConfig``)."""
        ...

    def info(self, model_id: str) -> ModelInfo:
        """The model's base model, rank and tokenizer."""
        ...

    def forward_backward(
        self,
        model_id: str,
        data: list[Datum],
        loss_fn: str,
        loss_fn_config: dict[str, float],
        forward_only: bool = False,
    ) -> ForwardBackwardResult:
        """The loss over ``data`` (summed over tokens, never normalised), its gradient added to the
        model's accumulated one unless ``forward_only``."""
        ...

    def optim_step(self, model_id: str, adam: AdamParams) -> dict[str, float]:
        """One AdamW step on the accumulated gradient, which is then cleared (the engine's weight
        version moves on); metrics ``grad_norm`` and ``learning_rate``."""
        ...

    def save_state(self, model_id: str, directory: Path, optimizer: bool = True) -> None:
        """Write the adapter (and the optimiser state) into ``directory``."""
        ...

    def saved_info(self, directory: Path) -> dict[str, Any]:
        """What the weights :meth:`save_state` wrote into ``directory`` were trained with: ``lora_rank``,
        ``train_attn``, ``train_mlp``, ``train_unembed``."""
        ...

    def load_state(self, model_id: str, directory: Path, optimizer: bool) -> None:
        """Load what :meth:`save_state` wrote into the (existing) model ``model_id``."""
        ...

    def save_for_sampler(self, model_id: str, directory: Path | None) -> str:
        """A frozen copy of the model's current weights that :meth:`sample` can use (saved into
        ``directory`` when given); its sampler name."""
        ...

    def load_sampler(self, directory: Path) -> str:
        """A sampler from weights saved by :meth:`save_for_sampler`; its sampler name."""
        ...

    def sample(
        self, sampler: str | None, prompt: list[int], params: dict[str, Any], num_samples: int
    ) -> list[SampledSequence]:
        """``num_samples`` continuations of ``prompt`` (``params``: max_tokens, temperature, top_p,
        top_k, seed, stop)."""
        ...

    def prompt_logprobs(self, sampler: str | None, prompt: list[int]) -> list[float | None]:
        """The logprob of each prompt token given the ones before it (``None`` for the first)."""
        ...

    def weights_version(self) -> int:
        """The version of the weights the engine serves (it moves on with every ``optim_step`` and
        every load of new weights)."""
        ...

    def close(self) -> None:
        """Release the model and the engine."""
        ...
