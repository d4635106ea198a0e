"""The PolicyServer's settings as one object: where it listens, its key, its limits and how it reads and
answers requests. ``PolicyServer(engine, store, settings=ServingSettings(...))`` is the preferred form; the
same names as keywords (``PolicyServer(engine, store, port=8000)``) still work and override the fields of
``settings``.

>>> from agentlightning_lite.serving import ServingSettings
>>> settings = ServingSettings(port=8000, api_key="k", max_n=4)
>>> settings.replace(port=0).port, settings.max_n
(0, 4)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

__all__ = ["ServingOptions", "ServingSettings"]

LOOPS = ("auto", "asyncio", "uvloop")
TRUNCATED_SAMPLING = ("ignore", "refuse", "keep")


@dataclass(frozen=True)
class ServingSettings:
    """The PolicyServer's optional settings (every field has a default).

    Attributes:
        host, port: where it listens (``port=0``: a free port, read back as ``server.port``).
        api_key: the key callers must send (``Authorization: Bearer`` or ``x-api-key``); ``None``: none.
        model_name: the name the server answers with (default: the engine's); ``aliases``: other names
            a request may ask for.
        default_max_tokens: the ``max_tokens`` of a request that names none.
        max_n: the largest ``n`` (choices per request) served.
        record_unrouted: whether calls to plain ``/v1`` (no rollout) are recorded, each in its own
            implicit ``trace`` rollout.
        flush: commit each call's spans before answering (for readers in other processes).
        log_level: uvicorn's log level.
        max_body_bytes: the largest request body (a larger one gets a 413).
        loop: uvicorn's event loop: ``"auto"`` (uvloop when installed), ``"asyncio"`` or ``"uvloop"``.
        clamp_max_tokens: ``None`` cuts a too-large ``max_tokens`` to the room left on the Responses and
            Messages routes only; ``True`` on every route; ``False`` on none (a 400 instead).
        truncated_sampling: what a training rollout's ``top_p``/``top_k``/``min_p`` gets: ``"ignore"``
            (sampled from the full distribution, recorded), ``"refuse"`` (a 400) or ``"keep"``.
        tool_parser, reasoning_parser: how replies are read (:mod:`.parsers`); ``"auto"`` reads the
            family from the engine's chat template; ``reasoning_parser=None``: no reasoning.

    Values are checked when the settings are made:

    >>> ServingSettings(loop="trio")
    Traceback (most recent call last):
    ...
    ValueError: loop must be 'auto', 'asyncio' or 'uvloop', got 'trio'
    """

    host: str = "127.0.0.1"
    port: int = 0
    api_key: str | None = None
    model_name: str | None = None
    aliases: tuple[str, ...] = ()
    default_max_tokens: int = 1024
    max_n: int = 16
    record_unrouted: bool = True
    flush: bool = False
    log_level: str = "warning"
    max_body_bytes: int = 32 * 2**20
    loop: str = "auto"
    clamp_max_tokens: bool | None = None
    truncated_sampling: str = "ignore"
    tool_parser: str = "auto"
    reasoning_parser: str | None = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.aliases, str):
            raise TypeError(f"aliases must be a sequence of names, not one string: {self.aliases!r}")
        object.__setattr__(self, "aliases", tuple(self.aliases))
        object.__setattr__(self, "max_body_bytes", int(self.max_body_bytes))
        if self.loop not in LOOPS:
            raise ValueError(f"loop must be 'auto', 'asyncio' or 'uvloop', got {self.loop!r}")
        if self.truncated_sampling not in TRUNCATED_SAMPLING:
            raise ValueError(
                f"truncated_sampling must be 'ignore', 'refuse' or 'keep', got {self.truncated_sampling!r}"
            )
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an int from 0 (a free port) to 65535, got {self.port!r}")
        for name in ("default_max_tokens", "max_n", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    def replace(self, **changes: Any) -> ServingSettings:
        """A copy with ``changes`` (checked like new settings; an unknown name is a ``TypeError``)."""
        unknown = sorted(set(changes) - FIELDS)
        if unknown:
            raise TypeError(f"unknown serving setting(s) {unknown}: the settings are {sorted(FIELDS)}")
        return dataclasses.replace(self, **changes)


FIELDS = frozenset(f.name for f in dataclasses.fields(ServingSettings))


class ServingOptions(TypedDict, total=False):
    """The fields of :class:`ServingSettings` as keyword arguments of ``PolicyServer`` (each optional)."""

    host: str
    port: int
    api_key: str | None
    model_name: str | None
    aliases: Sequence[str]
    default_max_tokens: int
    max_n: int
    record_unrouted: bool
    flush: bool
    log_level: str
    max_body_bytes: int
    loop: str
    clamp_max_tokens: bool | None
    truncated_sampling: str
    tool_parser: str
    reasoning_parser: str | None
