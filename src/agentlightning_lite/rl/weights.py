"""Weight hand-over: how an update reaches the engine that serves the policy.

An engine that trains in place (``HFEngine``: its module is the training model) runs the update
itself, as ``engine.update_weights(fn)``: under its lock, so no request decodes mid-update, and it
bumps its own version. Any other trainable engine (vLLM) gets each updated adapter as a state dict
from the transformers copy that trained. The trainer never changes an engine's version itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..serving.engines.contract import InPlaceEngine, ServingEngine, TrainableEngine

__all__ = ["WeightHandOver"]


class WeightHandOver:
    """Apply updates of ``model`` (the training model) so that ``engine`` serves them."""

    def __init__(self, engine: ServingEngine, model: Any) -> None:
        self.engine = engine
        self.model = model

    @property
    def in_place(self) -> bool:
        """Whether the engine's own module is the training model."""
        return isinstance(self.engine, InPlaceEngine) and self.engine.model is self.model

    @property
    def pad_id(self) -> int:
        """The id that pads training batches (the in-place engine's; else 0: padding is masked anyway)."""
        engine = self.engine
        return int(engine.pad_token_id or 0) if isinstance(engine, InPlaceEngine) else 0

    def trainable(self) -> TrainableEngine:
        """The engine, checked to take new weights."""
        if not isinstance(self.engine, TrainableEngine):
            raise TypeError(f"{type(self.engine).__name__} takes no new weights (it has no update_weights)")
        return self.engine

    def apply(self, update: Callable[[Any], None], adapters: Sequence[str | None] = (None,)) -> None:
        """Run ``update(model)`` and have the engine serve the result (``adapters``: the ones it changed;
        ``None``: the model's only adapter)."""
        if self.in_place:
            self.trainable().update_weights(update)  # under the engine's lock: no generation mid-update
            return
        update(self.model)
        self.push(adapters)

    def push(self, adapters: Sequence[str | None] = (None,)) -> None:
        """Hand the training model's adapters to an engine that does not share it (vLLM)."""
        if self.in_place:
            return
        from peft import get_peft_model_state_dict

        engine = self.trainable()
        for adapter in adapters:
            if adapter is None:
                engine.update_weights(get_peft_model_state_dict(self.model, save_embedding_layers=False))
            else:
                state = get_peft_model_state_dict(
                    self.model, adapter_name=adapter, save_embedding_layers=False
                )
                engine.update_weights(state, adapter=adapter)
