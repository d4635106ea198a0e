"""The HF engine's adapters and weights: peft adapters added, removed and switched on one base model,
and weight updates that wait for the rows decoding (a mixin of :class:`~.hf.HFEngine`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["HFAdapters"]


class HFAdapters:
    """Adapter and weight management of :class:`~.hf.HFEngine`; it reads the engine's ``model``,
    ``lock``, ``version``, and the update bookkeeping the engine sets up in its constructor."""

    model: Any
    lock: Any
    version: int
    _named_only: set[str]
    _update_cond: Any
    _updates_waiting: int

    @staticmethod
    def _attach_lora(module: Any, lora: Any) -> Any:
        try:
            import peft
        except ImportError as exc:  # pragma: no cover - peft is a dependency of training
            raise ImportError("LoRA needs peft: pip install peft") from exc
        if isinstance(lora, (str, os.PathLike)):
            return peft.PeftModel.from_pretrained(module, str(lora), is_trainable=True)
        if hasattr(lora, "to_peft_config"):
            lora = lora.to_peft_config()
        if isinstance(lora, peft.PeftConfig):
            return peft.get_peft_model(module, lora)
        raise TypeError(
            f"lora must be an adapter directory, a peft.LoraConfig or None, got {type(lora).__name__}"
        )

    @property
    def is_peft(self) -> bool:
        """Whether the model carries a peft adapter."""
        return hasattr(self.model, "peft_config")

    @property
    def adapters(self) -> list[str]:
        """The names of the model's peft adapters (``["default"]`` with ``lora=``)."""
        return list(self.model.peft_config) if self.is_peft else []

    def _own_adapter(self) -> str | None:
        if not self.is_peft:
            return None
        active = str(self.model.active_adapter)
        if active not in self._named_only:
            return active
        return next((a for a in self.adapters if a not in self._named_only), None)

    def add_adapter(
        self, name: str, lora: Any, trainable: bool | None = None, named_only: bool = False
    ) -> None:
        """Add adapter ``name`` beside the model's others, on the same base weights (peft multi-adapter).

        ``lora`` is adapter settings (``agl.LoRA(...)``, a ``peft.LoraConfig``): a fresh adapter,
        trainable; or a directory holding a saved peft adapter: loaded frozen (``trainable=True``
        to train it on). Which agent it serves is set with :meth:`set_routes`. ``named_only``: it serves
        only requests that name it (``GenRequest.adapter``), never as a default (the PolicyServer's
        ``/v1/load_lora_adapter`` loads adapters so).

        >>> engine.add_adapter("rewriter", agl.LoRA(r=8))  # doctest: +SKIP
        >>> engine.set_routes({"writer": "default", "rewriter": "rewriter"})  # doctest: +SKIP
        """
        import peft

        if not name or "." in name:
            raise ValueError(f"an adapter name must be non-empty and have no '.', got {name!r}")
        with self._updating():
            if name in self.adapters:
                raise ValueError(f"adapter {name!r} already exists")
            if named_only:
                self._named_only.add(name)
            if isinstance(lora, (str, os.PathLike)):
                path = str(lora)
                if not os.path.isfile(os.path.join(path, "adapter_config.json")):
                    raise FileNotFoundError(
                        f"{path} is not a peft adapter directory (no adapter_config.json)"
                    )
                if self.is_peft:
                    self.model.load_adapter(path, adapter_name=name, is_trainable=bool(trainable))
                else:
                    self.model = peft.PeftModel.from_pretrained(
                        self.model, path, adapter_name=name, is_trainable=bool(trainable)
                    )
            else:
                config = lora.to_peft_config() if hasattr(lora, "to_peft_config") else lora
                if not isinstance(config, peft.PeftConfig):
                    raise TypeError(
                        f"an adapter is LoRA settings or a saved adapter directory, got {type(lora).__name__}"
                    )
                if self.is_peft:
                    self.model.add_adapter(name, config)
                else:
                    self.model = peft.get_peft_model(self.model, config, adapter_name=name)
            self.model.eval()

    def remove_adapter(self, name: str) -> None:
        """Remove adapter ``name`` (once the rows decoding now are done: they hold ``lock``). Removing
        the model's last adapter leaves the plain base model."""
        with self._updating():
            if name not in self.adapters:
                raise KeyError(f"unknown adapter {name!r}: this engine serves {sorted(self.adapters)}")
            if len(self.adapters) == 1:
                self.model = self.model.unload()  # the base model, LoRA layers taken out
            else:
                if self.model.active_adapter == name:
                    self.model.set_adapter(next(a for a in self.adapters if a != name))
                self.model.delete_adapter(name)
            self._named_only.discard(name)
            self.model.eval()

    @contextlib.contextmanager
    def using_adapter(self, name: str | None) -> Iterator[Any]:
        """Run the model with adapter ``name`` active (``None``: the base model, adapters off); yields
        the model. Hold ``lock`` around it when other threads may generate.

        >>> with engine.lock, engine.using_adapter("rewriter") as model:  # doctest: +SKIP
        ...     logits = model(input_ids=ids).logits
        """
        if name is None:
            if self.is_peft:
                with self.model.disable_adapter():
                    yield self.model
            else:
                yield self.model
            return
        if name not in self.adapters:
            raise KeyError(f"unknown adapter {name!r}: this engine serves {sorted(self.adapters)}")
        if self.model.active_adapter != name:
            self.model.set_adapter(name)
        yield self.model

    def update_weights(
        self,
        source: Mapping[str, Any] | Callable[[Any], Any] | str | os.PathLike[str],
        adapter: str | None = None,
    ) -> int:
        """Change the policy weights under ``lock`` and bump ``version`` (returned).

        ``source`` is a callable ``fn(model)`` (e.g. an optimiser step on the same module),
        a state dict (the adapter's, as ``peft.get_peft_model_state_dict`` returns, when the
        model has a LoRA adapter; else a full or partial model state dict), or a directory
        holding a saved peft adapter. ``adapter`` names which adapter a state dict or directory
        is for (default: the active one).

        >>> engine.update_weights(lambda model: None)  # doctest: +SKIP
        1
        """
        with self._updating():
            if callable(source) and not isinstance(source, Mapping):
                source(self.model)
            else:
                if isinstance(source, (str, os.PathLike)):
                    source = self._read_adapter(str(source))
                self._load_state(source, adapter)
            self.version += 1
            return self.version

    @contextlib.contextmanager
    def _updating(self) -> Iterator[None]:
        """Hold ``lock`` for a change of the weights: no new row starts meanwhile, the rows decoding
        finish first (they hold the lock until none is left)."""
        with self._update_cond:
            self._updates_waiting += 1
        try:
            with self.lock:
                yield
        finally:
            with self._update_cond:
                self._updates_waiting -= 1
                self._update_cond.notify_all()

    def _wait_for_updates(self) -> None:
        """Block until no weight update waits (the batching loop, before it starts rows)."""
        with self._update_cond:
            self._update_cond.wait_for(lambda: self._updates_waiting == 0)

    @staticmethod
    def _read_adapter(path: str) -> dict[str, Any]:
        st = os.path.join(path, "adapter_model.safetensors")
        if os.path.isfile(st):
            from safetensors.torch import load_file

            return load_file(st)
        raise FileNotFoundError(f"no adapter_model.safetensors in {path}")

    def _load_state(self, state: Mapping[str, Any], adapter: str | None = None) -> None:
        if self.is_peft:
            from peft import set_peft_model_state_dict

            name = adapter or str(self.model.active_adapter)
            result = set_peft_model_state_dict(self.model, dict(state), adapter_name=name)
            unexpected = getattr(result, "unexpected_keys", None) or []
            if unexpected:
                raise KeyError(f"adapter weights not in the model: {unexpected[:5]}")
        else:
            result = self.model.load_state_dict(dict(state), strict=False)
            if result.unexpected_keys:
                raise KeyError(f"weights not in the model: {result.unexpected_keys[:5]}")
