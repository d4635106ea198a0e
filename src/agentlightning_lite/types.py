"""The data model: spans, rollouts and RL transitions (pydantic v2, JSON-serialisable)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ._json import jsonable_copy

SpanKind = Literal["llm", "tool", "agent", "chain", "reward", "signal", "custom"]
SpanStatus = Literal["ok", "error"]
RolloutMode = Literal["train", "val", "trace"]
RolloutStatus = Literal["running", "succeeded", "failed", "timeout"]

SPAN_KINDS: tuple[str, ...] = ("llm", "tool", "agent", "chain", "reward", "signal", "custom")
ROLLOUT_MODES: tuple[str, ...] = ("train", "val", "trace")
ROLLOUT_STATUSES: tuple[str, ...] = ("running", "succeeded", "failed", "timeout")

#: Validation context for payloads that are JSON-decoded already (read back from a store).
TRUSTED: dict[str, bool] = {"agl_trusted": True}


def _copy(v: Any, info: ValidationInfo) -> Any:
    return v if info.context is TRUSTED else jsonable_copy(v)


def check_reward(value: Any, what: str = "reward") -> float | None:
    """Return ``value`` as a float, or raise ``ValueError`` for NaN, inf or non-numbers.

    >>> check_reward(1)
    1.0
    >>> check_reward(float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: reward must be a finite number, got nan
    """
    if type(value) is float and math.isfinite(value):  # the common case, first
        return value
    if value is None:
        return None
    if isinstance(value, (str, bytes)):  # "0.5" is a bug in the agent more often than a reward
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy / torch scalars
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be a finite number, got {value!r}") from None
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return value


class Span(BaseModel):
    """One unit of work inside a rollout: an LLM call, a tool call, an agent step, a reward...

    ``input``, ``output`` and ``attributes`` accept any Python object; values that JSON cannot
    carry are stored in a readable fallback form (``{"__type__": ..., "__repr__": ...}``).
    For ``llm`` spans, ``prompt_token_ids``, ``response_token_ids`` and ``response_logprobs``
    hold the engine's exact tokens when it provided them.

    >>> import agentlightning_lite as agl
    >>> sp = agl.Span(span_id="s1", rollout_id="r1", kind="tool", name="calculator",
    ...               input={"expr": "2+2"}, output=4, start_time=0.0, end_time=0.1)
    >>> sp.status, sp.duration
    ('ok', 0.1)
    """

    model_config = ConfigDict(extra="forbid")

    span_id: str
    rollout_id: str
    parent_id: str | None = None
    kind: SpanKind = "custom"
    name: str = ""
    agent: str | None = None
    start_time: float
    end_time: float | None = None
    status: SpanStatus = "ok"
    error: str | None = None
    input: Any = None
    output: Any = None
    attributes: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None

    @field_validator("input", "output", mode="before")
    @classmethod
    def _jsonable(cls, v: Any, info: ValidationInfo) -> Any:
        return _copy(v, info)

    @field_validator("attributes", mode="before")
    @classmethod
    def _jsonable_attrs(cls, v: Any, info: ValidationInfo) -> Any:
        return {} if v is None else _copy(v, info)

    @field_validator("start_time", "end_time", mode="after")
    @classmethod
    def _finite_time(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{info.field_name} must be a finite timestamp, got {v!r}")
        return v

    @field_validator("prompt_token_ids", "response_token_ids", mode="after")
    @classmethod
    def _token_ids(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if v and (min(v) < 0 or max(v) >= 2**31):
            bad = min(v) if min(v) < 0 else max(v)
            raise ValueError(f"{info.field_name} must hold token ids from 0 to 2**31-1, got {bad}")
        return v

    @property
    def duration(self) -> float | None:
        """Seconds between start and end, or ``None`` while the span is open."""
        return None if self.end_time is None else self.end_time - self.start_time

    @property
    def has_tokens(self) -> bool:
        """True when the span carries the engine's exact prompt and response token ids."""
        return self.prompt_token_ids is not None and self.response_token_ids is not None


class Rollout(BaseModel):
    """One episode of an agent on one task, with its final reward and outcome.

    >>> import agentlightning_lite as agl
    >>> store = agl.MemoryStore()
    >>> ro = store.start_rollout({"question": "2+2?"}, mode="train")
    >>> store.finish_rollout(ro.rollout_id, reward=1.0).status
    'succeeded'
    """

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    task: Any = None
    mode: RolloutMode = "trace"
    status: RolloutStatus = "running"
    start_time: float
    end_time: float | None = None
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None

    @field_validator("task", mode="before")
    @classmethod
    def _jsonable(cls, v: Any, info: ValidationInfo) -> Any:
        return _copy(v, info)

    @field_validator("metadata", mode="before")
    @classmethod
    def _jsonable_meta(cls, v: Any, info: ValidationInfo) -> Any:
        return {} if v is None else _copy(v, info)

    @field_validator("reward", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        return check_reward(v)


class Transition(BaseModel):
    """One RL sample: a single call of the policy model with its credited reward.

    ``reward`` is the reward after credit assignment; ``final_reward`` is the episode's reward;
    ``finish_reason``: why the call's generation ended, as its span recorded it (``"stop"``,
    ``"tool_calls"``, ``"length"``: cut at ``max_tokens``; ``None`` when not recorded).

    >>> import agentlightning_lite as agl
    >>> t = agl.Transition(rollout_id="r1", index=0, prompt=[{"role": "user", "content": "hi"}],
    ...                    response="hello", reward=1.0, final_reward=1.0)
    >>> t.agent is None, t.reward
    (True, 1.0)
    """

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    index: int
    agent: str | None = None
    prompt: Any = None
    response: Any = None
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    reward: float | None = None
    final_reward: float | None = None
    finish_reason: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
