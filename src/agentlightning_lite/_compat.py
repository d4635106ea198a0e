"""Work-arounds for the libraries underneath: their warnings that say nothing to a user of this
package, and the lazy type builds of the OpenAI and Anthropic SDKs that race between threads.

peft (0.21) reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model, so
transformers (5.23) warns on every ``get_peft_model``/``PeftModel.from_pretrained``, whoever asked for
it; this package reads ``is_activation_checkpointing`` itself.

The OpenAI and Anthropic SDKs declare their response types with pydantic's ``defer_build``: each type
is built on its first use, by ``model_rebuild``, which is not thread-safe. While one thread rebuilds a
type, the type's own ``__pydantic_core_schema__`` is deleted from it, so another thread parsing a
response at that moment (``construct`` reads the schema to type the extra fields) reads the inherited
one instead: the SDK's ``BaseModel``'s, or, while that one is being rebuilt too, pydantic's own, whose
read raises ``PydanticUserError: Pydantic models should inherit from BaseModel, BaseModel cannot be
instantiated directly``. Concurrent rollouts whose agents make their first calls at once hit it now and
then. :func:`build_sdk_types` builds those types once, under a lock, before they are shared.
"""

from __future__ import annotations

import logging
import sys
import threading
import typing
import warnings
from typing import Any

__all__ = ["build_sdk_types", "quiet_upstream_warnings"]

logger = logging.getLogger(__name__)


def quiet_upstream_warnings() -> None:
    """Filter the warnings above (only those messages; idempotent).

    >>> quiet_upstream_warnings()
    """
    warnings.filterwarnings(
        "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )


#: per SDK, the response types its clients parse (``module:attribute``; those missing are skipped):
#: each is built with every model type its fields reach
SDK_RESPONSE_TYPES: dict[str, tuple[str, ...]] = {
    "openai": (
        "openai:BaseModel",
        "openai.types.chat:ChatCompletion",
        "openai.types.chat:ChatCompletionChunk",
        "openai.types:Completion",
        "openai.types:CreateEmbeddingResponse",
        "openai.types:Model",
        "openai.types.responses:Response",
        "openai.types.responses:ResponseStreamEvent",
    ),
    "anthropic": (
        "anthropic:BaseModel",
        "anthropic.types:Message",
        "anthropic.types:RawMessageStreamEvent",
        "anthropic.types:MessageTokensCount",
    ),
}

_building = threading.Lock()
_built: set[str] = set()


def build_sdk_types(*sdks: str, imported_only: bool = False) -> list[str]:
    """Build the response types of the OpenAI/Anthropic SDKs now, once per process, under a lock, so
    that threads parsing their first responses at the same time never build them concurrently.

    ``sdks``: which (default: both); ``imported_only``: only those this process has imported already
    (what the rollout runners do before their threads start: no SDK is imported for nothing). An SDK
    that is not installed is skipped. Returns the SDKs whose types are built.

    >>> "openai" in build_sdk_types("openai")
    True
    """
    out = []
    for sdk in sdks or tuple(SDK_RESPONSE_TYPES):
        if sdk not in _built and not (imported_only and sdk not in sys.modules):
            with _building:
                if sdk not in _built and _build(sdk):
                    _built.add(sdk)
        if sdk in _built:
            out.append(sdk)
    return out


def _build(sdk: str) -> bool:
    import importlib

    try:
        importlib.import_module(sdk)
        import pydantic
    except ImportError:
        return False
    models: list[type[pydantic.BaseModel]] = []
    for path in SDK_RESPONSE_TYPES[sdk]:
        module, _, name = path.partition(":")
        try:
            root = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):  # another version of the SDK
            continue
        _models_in(root, models, pydantic.BaseModel)
    for cls in models:  # the SDK's BaseModel first: the type a half-built one falls back on
        try:
            cls.model_rebuild()
        except Exception as exc:  # never worse than the lazy build, which will try again
            logger.debug("could not build %s: %s", cls, exc)
    return True


def _models_in(tp: Any, out: list[Any], base: type) -> None:
    """The model types ``tp`` reaches through its fields (unions, lists, ``Annotated``...), ``tp`` first."""
    if isinstance(tp, type) and issubclass(tp, base) and typing.get_origin(tp) is None:
        if tp in out:
            return
        out.append(tp)
        for field in tp.model_fields.values():  # type: ignore[attr-defined]
            _models_in(field.annotation, out, base)
        return
    for arg in typing.get_args(tp):
        _models_in(arg, out, base)
    value = getattr(tp, "__value__", None)  # a ``type X = ...`` alias
    if value is not None:
        _models_in(value, out, base)
