"""A verifiers multi-turn environment (a ``vf.Env`` with one agent seat) played turn by turn through the
episode loop: its ``run`` is the environment's side of the conversation, the policy the seat's.

verifiers 0.4 writes a multi-turn environment as ``vf.Env.run(task, agents)``: it opens the seat's
``interaction(task)`` and sends each next user message with ``await interaction.turn(message)``,
reading the seat's reply from the returned ``vf.Segment``; leaving the interaction ends the episode.
Here ``run`` runs in a thread of its own with a stand-in for the seat, whose every ``turn`` is one
step of :func:`agentlightning_lite.envs.episode.run_episode` (the policy's model call).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from .episode import EpisodeResult, Hooks, Observation, Reply, StepResult

__all__ = ["EnvEpisode", "load_env"]

#: seconds an environment's ``run`` may take to finish once the episode is over
FINISH_TIMEOUT_S = 60.0

#: the ``vf.Env`` methods an environment played here may override
_PLAYED = ("run", "setup")


def load_env(vf: Any, env: Any, config: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """A ``vf.Env`` instance from ``env`` (an instance, or a class built with its config type and
    ``config``) and the name of its one agent seat; a ``TypeError`` saying why when it cannot be
    played here (several seats, a ``finalize`` across agents, not a ``vf.Env``)."""
    fields = importlib.import_module("verifiers.v1.configs.agent").agent_config_fields
    if isinstance(env, type) and issubclass(env, vf.Env):
        generic = importlib.import_module("verifiers.v1.utils.generic")
        config_type = generic.concrete_type(env, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
        instance: Any = object.__new__(env)  # not Env.__init__: it loads the taskset by id and the harnesses
        instance.config = config_type(**dict(config or {}))
        env = instance
    elif config:
        raise ValueError("env_config= applies to a vf.Env class, not to an environment object")
    if not isinstance(env, vf.Env):
        raise TypeError(f"env= takes a verifiers environment (a vf.Env class or object), got {env!r}")
    name = type(env).__name__
    seats = list(fields(env.config))
    if len(seats) != 1:
        raise TypeError(
            f"{name} has {len(seats)} agent seats ({', '.join(seats) or 'none'}): agl.envs.Verifiers plays "
            "a verifiers environment with one seat, the policy's, its run() being the other side of the "
            "conversation; run environments of several agents with verifiers' vf-eval"
        )
    overridden = [m for m in ("finalize", "start", "stop") if getattr(type(env), m) is not getattr(vf.Env, m)]
    if overridden:
        raise TypeError(
            f"{name} overrides {', '.join(overridden)}: agl.envs.Verifiers runs an environment's "
            f"{' and '.join(_PLAYED)} only (the task's own rewards score the seat's trace); run it with "
            "verifiers' vf-eval"
        )
    return env, seats[0]


class _Interaction:
    """The seat's side of ``agent.interaction(task)``: each ``turn`` hands the environment's message to
    the episode loop and waits for the policy's reply."""

    def __init__(self, episode: EnvEpisode, task: Any) -> None:
        self.episode, self.task = episode, task
        self.started = self.over = False

    async def turn(self, message: Any = None) -> Any:
        vf = self.episode.vf
        if self.over:
            raise RuntimeError("the exchange is over (the episode ended); the task's rewards score it")
        prompted = not self.started and self.task.data.prompt is not None
        if message is None and not prompted:
            raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
        self.started = True
        reply = await asyncio.to_thread(self.episode.ask, message)
        if reply is None:  # the episode's turns ran out
            self.over = True
            return vf.Segment(messages=[], terminated=True)
        return vf.Segment(messages=[vf.AssistantMessage(content=reply)])

    async def close(self) -> None:
        self.over = True


class _Seat:
    """The one agent seat of the environment, played by the policy through the episode loop."""

    def __init__(self, episode: EnvEpisode) -> None:
        self.episode = episode
        self.trainable = True

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> AsyncIterator[_Interaction]:
        if self.episode.task is not None:
            raise RuntimeError("the environment opened a second interaction: one episode is one exchange")
        self.episode.task = task
        chat = _Interaction(self.episode, task)
        try:
            yield chat
        finally:
            await chat.close()

    async def run(self, task: Any, **_: Any) -> None:
        """A whole run of ``task``: its opening reply (a one-turn exchange)."""
        async with self.interaction(task) as chat:
            await chat.turn(None if task.data.prompt is not None else "")


class _Agents:
    def __init__(self, seat: str, episode: EnvEpisode) -> None:
        self._seat, self._agent = seat, _Seat(episode)

    def __getattr__(self, name: str) -> _Seat:
        if name.startswith("_") or name != self._seat:
            raise AttributeError(f"no agent {name!r}; this environment's one seat is {self._seat!r}")
        return self._agent


class EnvEpisode(Hooks):
    """One episode of a verifiers environment: its ``run`` in a thread of its own, each of its
    ``turn`` messages an observation, each policy reply the seat's answer; at the end the task the
    seat was handed scores the whole conversation (``score(task, turns)``: its reward).

    ``messages(task)`` gives a task's opening messages (system prompt and prompt); ``score`` is
    given the seat's task and every turn as ``(messages before the reply, the reply's completion)``.
    """

    def __init__(
        self,
        vf: Any,
        env: Any,
        seat: str,
        task: Any,
        messages: Callable[[Any], list[dict[str, Any]]],
        score: Callable[[Any, list[tuple[list[dict[str, Any]], Any]]], float],
        system: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.vf, self.env, self.seat, self.root = vf, env, seat, task
        self.messages, self.score, self.system = messages, score, system
        self.task: Any = None  # the task the environment hands its seat
        self.asks: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.replies: queue.Queue[str | None] = queue.Queue()
        self.conversation: list[dict[str, Any]] = []
        self.turns: list[tuple[list[dict[str, Any]], Any]] = []
        self.thread: threading.Thread | None = None
        self.finished = False

    # -- the environment's thread ---------------------------------------------------------------
    def ask(self, message: Any) -> str | None:
        """The environment's next message (``None``: the opening turn of a prompted task); the reply."""
        self.asks.put(("turn", message))
        return self.replies.get()

    def _run(self) -> None:
        async def episode() -> None:
            agents = _Agents(self.seat, self)
            await self.env.setup(agents)
            await self.env.run(self.root, agents)

        try:
            asyncio.run(episode())
        except BaseException as exc:  # handed to the episode loop's thread, which raises it
            self.asks.put(("error", exc))
        else:
            self.asks.put(("end", None))

    def _next(self) -> StepResult:
        """Wait for the environment: its next message as an observation, or the end."""
        kind, value = self.asks.get()
        if kind == "error":
            self.finished = True
            name = type(self.env).__name__
            raise RuntimeError(f"{name}.run failed: {type(value).__name__}: {value}") from value
        if kind == "end":
            self.finished = True
            return StepResult(done=True)
        if not self.turns and not self.conversation:  # the opening turn: the task's own messages
            opening = self.messages(self.task)
            if opening and opening[0]["role"] == "system" and isinstance(opening[0]["content"], str):
                opening[0] = {"role": "system", "content": self.system(opening[0]["content"])}
            new = opening + _user_messages(value)
        else:
            new = _user_messages(value)
        self.conversation.extend(new)
        return StepResult(Observation(new))

    # -- the hooks ------------------------------------------------------------------------------
    def reset(self) -> StepResult:
        name = f"agl-verifiers-{type(self.env).__name__}"
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        return self._next()

    def act(self, reply: Reply) -> StepResult:
        self.turns.append((list(self.conversation), reply.completion))
        self.conversation.append({"role": "assistant", "content": reply.text})
        self.replies.put(reply.text)
        return self._next()

    def _finish(self) -> None:
        """Let the environment's ``run`` end: every further turn is answered ``terminated``."""
        while not self.finished:
            self.replies.put(None)
            try:
                kind, value = self.asks.get(timeout=FINISH_TIMEOUT_S)
            except queue.Empty:
                name = type(self.env).__name__
                raise RuntimeError(
                    f"{name}.run did not end {FINISH_TIMEOUT_S:.0f} s after the episode"
                ) from None
            if kind == "error":
                self.finished = True
                name = type(self.env).__name__
                raise RuntimeError(f"{name}.run failed: {type(value).__name__}: {value}") from value
            self.finished = kind == "end"

    def reward(self, episode: EpisodeResult) -> float:
        self._finish()
        if self.task is None or not self.turns:
            name = type(self.env).__name__
            raise RuntimeError(f"{name}.run ended without a turn of its seat {self.seat!r}: nothing to score")
        return self.score(self.task, self.turns)

    def close(self) -> None:
        if self.thread is None:
            return
        if not self.finished:
            with contextlib.suppress(RuntimeError):
                self._finish()
        self.thread.join(FINISH_TIMEOUT_S)


def _user_messages(message: Any) -> list[dict[str, Any]]:
    """A ``turn`` message as chat messages: a string is one user message; a list, its messages."""
    if message is None:
        return []
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    out = []
    for m in message:
        if isinstance(m, Mapping):
            out.append(dict(m))
        else:  # a verifiers Message (pydantic)
            out.append(importlib.import_module("verifiers.v1.dialects.chat").message_to_wire(m))
    return out
