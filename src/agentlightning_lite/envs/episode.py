"""The one episode loop every environment hub plays: observation, model call (with the environment's
tools), tool calls as ``tool`` spans, action, step result, until the environment is done or the turns
run out. A hub writes only its hooks (:class:`Hooks`) and an :class:`EpisodeSpec`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tracer import Tracer, emit_reward, emit_signal

__all__ = [
    "EpisodeResult",
    "EpisodeSpec",
    "Hooks",
    "Observation",
    "Reply",
    "StepResult",
    "ToolCall",
    "ToolResult",
    "Unreadable",
    "UnreadableCount",
    "run_episode",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observation:
    """What the environment shows the model before its next call.

    ``messages`` are chat messages added to the conversation (``fresh=True``: the conversation
    starts over with them, after the system prompt); ``tools`` are the OpenAI chat tools offered
    from this call on (``None``: those offered so far).

    >>> Observation.text("Guess a digit.").messages
    [{'role': 'user', 'content': 'Guess a digit.'}]
    """

    messages: Sequence[dict[str, Any]] = ()
    tools: Sequence[dict[str, Any]] | None = None
    fresh: bool = False

    @classmethod
    def text(cls, text: str, *, fresh: bool = False) -> Observation:
        """One user message."""
        return cls([{"role": "user", "content": text}], fresh=fresh)


@dataclass(frozen=True)
class StepResult:
    """What the environment answered to a reset or an action: the next observation (``None``: nothing
    more to show), this step's reward (``None``: it gave none) and whether the episode is over."""

    observation: Observation | None = None
    reward: float | None = None
    done: bool = False


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a reply: its id, the tool's name and its arguments as the model wrote them."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolResult:
    """A tool call's outcome: the text the model gets back as the ``tool`` message, the error that
    marks its ``tool`` span failed (``None``: it succeeded), the step's reward, whether it ended
    the episode."""

    text: str
    error: str | None = None
    reward: float | None = None
    done: bool = False


@dataclass(frozen=True)
class Reply:
    """One model reply: its text, its tool calls, the assistant message added to the conversation
    and the ``ChatCompletion`` itself (usage, finish reason)."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    message: dict[str, Any]
    completion: Any = None


@dataclass
class EpisodeResult:
    """What an episode gathered: every reward the environment gave (the reset's, each action's and
    each tool call's, in order), whether it said done, the model calls made, and whether the
    episode ended on a reply that made no valid action (:class:`Unreadable`)."""

    rewards: list[float] = field(default_factory=list)
    done: bool = False
    turns: int = 0
    unreadable: str | None = None

    @property
    def cut(self) -> bool:
        """The turns ran out before the environment said done (and no unreadable reply ended it)."""
        return not self.done and self.unreadable is None


class Unreadable(Exception):
    """Raised by :meth:`Hooks.act`: the reply made no valid action. The episode ends with the spec's
    ``unreadable_reward`` (counted, and recorded as an error ``signal`` span ``<name>.unreadable``);
    a hook raises its own error instead when the hub has no ``unreadable_reward``."""


class UnreadableCount:
    """A thread-safe count of the replies that made no valid action, over every rollout of a hub."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self) -> int:
        """Count one more; the new count."""
        with self._lock:
            self.value += 1
            return self.value


@dataclass(frozen=True)
class EpisodeSpec:
    """How a hub's episodes run.

    ``name`` names the hub in span names (``<name>.unreadable``, ``<name>.step``);
    ``system_prompt`` opens the conversation, read through ``llm.prompt("system", default=...)`` so
    ``agl.APO`` can optimise it (``None``: the observations bring their own); at most ``max_turns``
    model calls of ``max_tokens`` each, each waiting ``timeout`` seconds at most (``None``: the
    client's default). With ``step_rewards=True`` every reward the environment gives is also
    recorded as an intermediate reward (a ``reward`` span ``<name>.step``, at the call that earned
    it); see :func:`run_episode` for how that combines with the final reward. With
    ``unreadable_reward`` set, an :class:`Unreadable` reply ends the episode with that reward,
    counted in ``unreadable``.
    """

    name: str
    max_turns: int
    max_tokens: int
    system_prompt: str | None = None
    timeout: float | None = None
    step_rewards: bool = False
    unreadable_reward: float | None = None
    unreadable: UnreadableCount | None = None
    log: logging.Logger = logger


class Hooks:
    """One episode of a hub (a new object per rollout): :meth:`reset`, :meth:`act`, optionally
    :meth:`call_tool`, :meth:`replied` and :meth:`answered`, then :meth:`reward`; :meth:`close` at the end.

    >>> class Countdown(Hooks):
    ...     def reset(self):
    ...         self.left = 2
    ...         return StepResult(Observation.text("Say go."))
    ...     def act(self, reply):
    ...         self.left -= 1
    ...         return StepResult(Observation.text(f"{self.left} left"), reward=0.5, done=not self.left)
    >>> Countdown().reward(EpisodeResult(rewards=[0.5, 0.5], done=True))
    1.0
    """

    def reset(self) -> StepResult:
        """Start the episode: its first observation (and whether it is already over)."""
        raise NotImplementedError("an episode's hooks implement reset()")

    def replied(self, reply: Reply) -> None:
        """Every model reply, before its tool calls or its action run (default: nothing)."""

    def act(self, reply: Reply) -> StepResult:
        """The reply (one with no tool call) as the environment's action; what came of it. Raise
        :class:`Unreadable` when it makes no valid action."""
        raise NotImplementedError("an episode's hooks implement act(reply)")

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool call (its arguments decoded from JSON); the result the model gets back."""
        raise NotImplementedError(f"this environment has no tools, yet the model called {name!r}")

    def answered(self, call: ToolCall, result: ToolResult) -> None:
        """Every tool call once answered, also one whose arguments were not JSON (default: nothing)."""

    def reward(self, episode: EpisodeResult) -> float:
        """The episode's final reward (default: the sum of every reward the environment gave)."""
        return float(sum(episode.rewards))

    def close(self) -> None:
        """Release what the episode held (default: nothing)."""


def _tracer() -> Tracer:
    current = Tracer.current_rollout()
    return current.tracer if current is not None else Tracer()


def _call_tool(hooks: Hooks, call: ToolCall) -> ToolResult:
    """One tool call, recorded once as a ``tool`` span (failed when the arguments are not JSON or
    the tool reports an error)."""
    result = _run_tool(hooks, call)
    hooks.answered(call, result)
    return result


def _run_tool(hooks: Hooks, call: ToolCall) -> ToolResult:
    with _tracer().span("tool", call.name, input=call.arguments) as span:
        try:
            args = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            span.set_error(exc)
            text = f"error: the arguments are not JSON: {exc}"
            span.set_output(text)
            return ToolResult(text)
        result = hooks.call_tool(call.name, args)
        if result.error is not None:
            span.set_error(RuntimeError(result.error))
        span.set_output(result.text)
    return result


def _unreadable(spec: EpisodeSpec, reply: str, why: str) -> None:
    first = spec.unreadable.add() == 1 if spec.unreadable is not None else False
    if Tracer.current_rollout() is not None:
        emit_signal(f"{spec.name}.unreadable", value=why, status="error", reply=reply[:500])
    if first:
        spec.log.warning(
            "%s; the episode ends with unreadable_reward=%s (env.unreadable_replies counts these)",
            why,
            spec.unreadable_reward,
        )


def run_episode(hooks: Hooks, spec: EpisodeSpec, llm: Any, temperature: float) -> float:
    """Play one episode of ``hooks`` against ``llm``; its final reward.

    The loop: ``reset``; then, until the environment says done or ``spec.max_turns`` model calls,
    a model call on the conversation (the tools the observations offered); each tool call of the
    reply runs through ``call_tool`` (one ``tool`` span each; the result goes back as a ``tool``
    message, and the next model call follows); a reply with no tool call goes to ``act``, whose
    observation joins the conversation. An episode cut at ``max_turns`` keeps what it gathered.

    Rewards: every reward a step gives is kept in :attr:`EpisodeResult.rewards`, and the final
    reward is ``hooks.reward(result)`` (the hub's choice: OpenEnv's ``reward="sum"`` or ``"last"``,
    a verifier's score...). With ``spec.step_rewards`` each step's reward is also recorded as an
    intermediate reward, and the hub's final reward must then not include them: nothing is counted
    twice, whichever credit rule is used. An :class:`Unreadable` reply ends the episode with
    ``spec.unreadable_reward``, not ``hooks.reward``.

    >>> class Echo(Hooks):
    ...     def reset(self):
    ...         return StepResult(Observation.text("Say hi."))
    ...     def act(self, reply):
    ...         return StepResult(reward=float(reply.text == "hi"), done=True)
    >>> from agentlightning_lite.serving import PolicyServer, engines
    >>> import agentlightning_lite as agl
    >>> with PolicyServer(engines.ScriptedEngine(["hi"], tokenizer="bytes"), agl.MemoryStore()) as server:
    ...     run_episode(Echo(), EpisodeSpec("echo", max_turns=3, max_tokens=8), server.llm(), 0.0)
    1.0
    """
    result = EpisodeResult()
    try:
        _play(hooks, spec, llm, temperature, result)
        if result.unreadable is not None:
            assert spec.unreadable_reward is not None
            return spec.unreadable_reward
        return float(hooks.reward(result))
    finally:
        hooks.close()


def _play(hooks: Hooks, spec: EpisodeSpec, llm: Any, temperature: float, result: EpisodeResult) -> None:
    def gave(reward: float | None) -> None:
        if reward is None:
            return
        result.rewards.append(float(reward))
        if spec.step_rewards and Tracer.current_rollout() is not None:
            emit_reward(float(reward), name=f"{spec.name}.step")

    system: list[dict[str, Any]] = []
    if spec.system_prompt is not None:
        system = [{"role": "system", "content": llm.prompt("system", default=spec.system_prompt)}]
    messages: list[dict[str, Any]] = list(system)
    tools: list[dict[str, Any]] = []

    def show(observation: Observation | None) -> None:
        nonlocal messages, tools
        if observation is None:
            return
        if observation.fresh:
            messages = list(system)
        messages.extend(dict(m) for m in observation.messages)
        if observation.tools is not None:
            tools = list(observation.tools)

    start = hooks.reset()
    gave(start.reward)
    result.done = start.done
    show(start.observation)
    client_options: dict[str, Any] = {"max_retries": 0}
    if spec.timeout is not None:
        client_options["timeout"] = spec.timeout
    openai = llm.openai_client(**client_options)
    while result.turns < spec.max_turns and not result.done:
        options: dict[str, Any] = {"tools": tools} if tools else {}
        completion = openai.chat.completions.create(
            model=llm.model,
            messages=messages,
            max_tokens=spec.max_tokens,
            temperature=temperature,
            **options,
        )
        result.turns += 1
        message = completion.choices[0].message
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or [])
        said = message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        reply = Reply(message.content or "", calls, said, completion)
        hooks.replied(reply)
        messages.append(said)
        if calls:
            for call in calls:
                outcome = _call_tool(hooks, call)
                gave(outcome.reward)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": outcome.text})
                if outcome.done:
                    result.done = True
                    break
            continue
        try:
            step = hooks.act(reply)
        except Unreadable as exc:
            if spec.unreadable_reward is None:
                raise
            result.unreadable = str(exc)
            _unreadable(spec, reply.text, str(exc))
            return
        gave(step.reward)
        result.done = step.done
        if not step.done:
            show(step.observation)
