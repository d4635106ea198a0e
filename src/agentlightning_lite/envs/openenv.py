"""OpenEnv environments (Gym-style reset/step servers, MCP tools) as an environment.

One rollout is one WebSocket session with the environment server (``GenericEnvClient``): ``reset``
with the task's keyword arguments, then ``step`` until the observation says ``done``. A session is
the server's own environment instance for the whole episode; the HTTP ``/reset`` and ``/step``
routes each start a fresh one, so they are not used.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import socket
import threading
import typing
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Literal

from ..tracer import Tracer, emit_signal
from .base import Environment, require
from .episode import (
    EpisodeResult,
    EpisodeSpec,
    Hooks,
    Observation,
    Reply,
    StepResult,
    ToolResult,
    Unreadable,
    UnreadableCount,
    run_episode,
)
from .openenv_messages import (
    chat_tools,
    is_mcp,
    render_observation,
    server_error_text,
    text_action,
    tool_text,
)

__all__ = ["OpenEnv", "render_observation", "server_error_text", "text_action"]

logger = logging.getLogger(__name__)

EXTRA = "envs-openenv"
SYSTEM = (
    "You are acting in an environment. Each user message is what the environment shows you; "
    "reply with your next action, or call one of the tools when tools are offered."
)


def _oe() -> Any:
    require("openenv", EXTRA, "agl.envs.OpenEnv")
    return require("openenv.core", EXTRA, "agl.envs.OpenEnv")


class _Rejected(RuntimeError):
    """The environment refused an action (its error frame: a validation or execution error)."""


@functools.lru_cache(maxsize=1)
def _client_class() -> type:
    """openenv's ``GenericEnvClient``, keeping the data of the server's last error frame: the
    client's own ``RuntimeError`` gives only its message and code, not the field errors."""

    class DetailedEnvClient(_oe().GenericEnvClient):  # type: ignore[misc]
        last_error: dict[str, Any] | None = None

        async def _receive(self) -> dict[str, Any]:
            response: dict[str, Any] = await super()._receive()
            if isinstance(response, dict) and response.get("type") == "error":
                data = response.get("data")
                self.last_error = data if isinstance(data, dict) else {"message": str(data)}
            return response

    return DetailedEnvClient


def _env_classes(env_cls: type) -> tuple[type, type]:
    """The action and observation classes of an OpenEnv ``Environment`` subclass, from its
    ``Environment[Action, Observation, State]`` base (``CallToolAction`` for an ``MCPEnvironment``)."""
    core = _oe()
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if typing.get_origin(base) is core.Environment and len(args) >= 2:
                if all(isinstance(a, type) for a in args[:2]):
                    return args[0], args[1]
    if core.MCPEnvironment is not None and issubclass(env_cls, core.MCPEnvironment):
        return core.CallToolAction, core.CallToolObservation
    raise ValueError(
        f"{env_cls.__name__}: cannot tell its action and observation classes (it does not subclass "
        "Environment[MyAction, MyObservation, State]); pass action_cls= and observation_cls="
    )


class _Served:
    """An OpenEnv ``Environment`` class served by ``create_app`` under uvicorn on 127.0.0.1 (a free
    port), in a thread of this process."""

    def __init__(self, env_cls: type, action_cls: type, observation_cls: type, max_sessions: int) -> None:
        uvicorn = require("uvicorn", EXTRA, "agl.envs.OpenEnv")
        app = _oe().create_app(env_cls, action_cls, observation_cls, max_concurrent_envs=max_sessions)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="agl-openenv", daemon=True
        )
        self.thread.start()
        while not self.server.started:
            self.thread.join(0.02)
            if not self.thread.is_alive():
                self.sock.close()
                raise RuntimeError(f"the OpenEnv server for {env_cls.__name__} did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


class OpenEnv(Environment):
    """An OpenEnv environment: a server at ``base_url``, or an OpenEnv ``Environment`` class served
    here (``create_app`` under uvicorn on 127.0.0.1, a free port, stopped by :meth:`close`).

    The tasks are ``reset`` keyword arguments: ``tasks`` as given, else ``{"seed": s}`` for
    ``size`` seeds from ``seed``. A rollout is one WebSocket session: ``reset(**task)``, then a
    model call per turn until the environment says ``done`` or ``max_turns`` model calls. Each
    observation is rendered (``render``, default :func:`render_observation`) as a user message of one
    growing conversation; the model's reply becomes the action through ``action_from_reply``
    (default :func:`text_action` of the server's action schema: the reply as the action's one
    required string field). The reward is the sum of the rewards of every step (``reward="sum"``;
    ``"last"``: the last reward the environment gave); an episode cut at ``max_turns`` keeps what it
    gathered. ``timeout`` is how long a server's answer, or a model call, may take (seconds).
    ``max_sessions`` bounds the sessions open at once (more rollouts wait for one): unbounded for a
    URL, and for a class served here 64, or 1 when it is not marked ``SUPPORTS_CONCURRENT_SESSIONS``
    (its server refuses a second). A class's action and observation classes come from its
    ``Environment[Action, Observation, State]`` base (``CallToolAction`` for an ``MCPEnvironment``),
    or ``action_cls=`` / ``observation_cls=``.

    MCP tools: when the action schema is ``CallToolAction`` (an ``MCPEnvironment``), or
    ``tools=True``, every rollout lists the environment's tools (a ``list_tools`` step) and offers
    them to the model as OpenAI tools; each tool call is a ``call_tool`` step of the same session
    (a ``tool`` span; its reward counts), its result sent back as a ``tool`` message. A reply with
    no tool call steps ``action_from_reply(reply)``, or ends the episode when the environment takes
    no text action.

    An action the environment rejects (a validation or execution error) fails the rollout with
    the environment's message (:func:`server_error_text`: for a schema rejection, each field that
    failed and why); :attr:`rejected_actions` counts them, and each is an error ``signal`` span
    ``openenv.rejected``. So does a reply ``action_from_reply`` cannot read (it raises). To train,
    every reply must become a valid action, or an untrained model's rollouts all fail: with
    ``unreadable_reward`` set, such a reply (``action_from_reply`` raised, or the environment
    rejected its action) ends the episode with that reward instead, counted in
    :attr:`unreadable_replies` and recorded as an error ``signal`` span ``openenv.unreadable``.
    A server that is down raises a ``ConnectionError`` naming it. Episodes run through
    :func:`agl.envs.episode.run_episode` (:meth:`spec`; this class writes only the hooks). Needs
    ``pip install "agentlightning-lite[envs-openenv]"``.

    >>> import agentlightning_lite as agl
    >>> env = agl.envs.OpenEnv("http://127.0.0.1:8000", size=3, seed=7)  # doctest: +SKIP
    >>> env.tasks  # doctest: +SKIP
    [{'seed': 7}, {'seed': 8}, {'seed': 9}]
    >>> # trainer.fit(env.agent, env.tasks); env.close()
    """

    def __init__(
        self,
        env: str | type,
        size: int = 100,
        seed: int = 0,
        *,
        tasks: Sequence[dict[str, Any]] | None = None,
        action_from_reply: Callable[[str], Any] | None = None,
        render: Callable[[dict[str, Any]], str] = render_observation,
        tools: bool | None = None,
        reward: Literal["sum", "last"] = "sum",
        max_turns: int = 30,
        max_tokens: int = 512,
        system_prompt: str = SYSTEM,
        timeout: float = 300.0,
        action_cls: type | None = None,
        observation_cls: type | None = None,
        max_sessions: int | None = None,
        temperature: float = 1.0,
        eval_temperature: float = 0.0,
        unreadable_reward: float | None = None,
    ) -> None:
        _oe()  # the missing extra, named, before anything else
        if reward not in ("sum", "last"):
            raise ValueError(f"reward is 'sum' or 'last', got {reward!r}")
        if unreadable_reward is not None and not (
            isinstance(unreadable_reward, (int, float)) and math.isfinite(unreadable_reward)
        ):
            raise ValueError(
                f"unreadable_reward must be a finite number (or None), got {unreadable_reward!r}"
            )
        self.reward_mode, self.max_turns, self.max_tokens = reward, max_turns, max_tokens
        self.system_prompt, self.timeout, self.render = system_prompt, timeout, render
        self.unreadable_reward = None if unreadable_reward is None else float(unreadable_reward)
        #: actions the environment refused (replies that became no valid action: ``unreadable_replies``)
        self.rejected_actions = 0
        self._unreadable = UnreadableCount()
        self._lock = threading.Lock()
        self._served: _Served | None = None
        if isinstance(env, str):
            scheme, sep, rest = env.rstrip("/").partition("://")
            http = {"ws": "http", "wss": "https"}.get(scheme.lower(), scheme)
            self.base_url, self.name = (f"{http}{sep}{rest}" if sep else env.rstrip("/")), env
        elif isinstance(env, type):
            if action_cls is None or observation_cls is None:
                found = _env_classes(env)
                action_cls, observation_cls = action_cls or found[0], observation_cls or found[1]
            if max_sessions is None:
                max_sessions = 64 if getattr(env, "SUPPORTS_CONCURRENT_SESSIONS", False) else 1
            self._served = _Served(env, action_cls, observation_cls, max_sessions)
            self.base_url, self.name = self._served.url, env.__name__
        else:
            raise TypeError(f"OpenEnv takes a server URL or an OpenEnv Environment class, got {env!r}")
        # a server with one session at a time (an environment not marked SUPPORTS_CONCURRENT_SESSIONS)
        # refuses a second: rollouts wait for a free session here instead
        self._sessions = threading.BoundedSemaphore(max_sessions) if max_sessions else None
        try:
            self.action_schema: dict[str, Any] = self._schema()["action"]
        except BaseException:
            self.close()
            raise
        self.tools = is_mcp(self.action_schema) if tools is None else tools
        if action_from_reply is None and not is_mcp(self.action_schema):
            action_from_reply = text_action(self.action_schema)
            if action_from_reply is None and not self.tools:
                self.close()
                fields = sorted(set(self.action_schema.get("properties") or {}) - {"metadata"})
                raise ValueError(
                    f"OpenEnv {self.name}: its action ({self.action_schema.get('title')}, fields {fields}) "
                    "is not one text field; pass action_from_reply=, a function from the model's reply "
                    "to the action dict (agl-lite train: --action-from-reply module:function, or "
                    "file.py:function)"
                )
        self.action_from_reply = action_from_reply
        task_list = (
            [dict(t) for t in tasks] if tasks is not None else [{"seed": seed + i} for i in range(size)]
        )
        super().__init__(task_list, temperature=temperature, eval_temperature=eval_temperature)

    def _schema(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"{self.base_url}/schema", timeout=self.timeout) as reply:
                data: dict[str, Any] = json.loads(reply.read().decode())
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConnectionError(
                f"the OpenEnv server at {self.base_url} is not answering ({reason}): start it, or "
                "pass its Environment class to serve it here"
            ) from exc
        if "action" not in data:
            raise RuntimeError(f"{self.base_url}/schema is not an OpenEnv server's schema: {str(data)[:300]}")
        return data

    def close(self) -> None:
        """Stop the server this environment started (when given a class); nothing for a URL."""
        if self._served is not None:
            self._served.stop()
            self._served = None

    def __enter__(self) -> OpenEnv:
        """``with agl.envs.OpenEnv(MyEnvironment) as env:`` stops the server this started at the end."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def unreadable_replies(self) -> int:
        """Replies that became no valid action, each ending its episode with ``unreadable_reward``."""
        return self._unreadable.value

    def spec(self) -> EpisodeSpec:
        """How this environment's episodes run (:func:`agl.envs.episode.run_episode`)."""
        return EpisodeSpec(
            "openenv",
            max_turns=self.max_turns,
            max_tokens=self.max_tokens,
            system_prompt=self.system_prompt,
            timeout=self.timeout,
            unreadable_reward=self.unreadable_reward,
            unreadable=self._unreadable,
            log=logger,
        )

    def play(self, task: dict[str, Any], llm: Any, temperature: float) -> float:
        """One episode in one WebSocket session; the sum (or the last) of its rewards."""
        client = _client_class()(base_url=self.base_url, message_timeout_s=self.timeout).sync()
        if self._sessions is not None:
            self._sessions.acquire()
        try:
            try:
                client.connect()
            except ConnectionError as exc:
                raise ConnectionError(
                    f"the OpenEnv server at {self.base_url} is not answering: {exc}"
                ) from exc
            return run_episode(_Episode(self, client, dict(task)), self.spec(), llm, temperature)
        finally:
            try:
                client.close()
            finally:
                if self._sessions is not None:
                    self._sessions.release()

    def _rejected(self, action: Any, detail: str) -> None:
        with self._lock:
            self.rejected_actions += 1
        if Tracer.current_rollout() is not None:
            emit_signal("openenv.rejected", value=detail, status="error", action=repr(action))

    def __repr__(self) -> str:
        return f"OpenEnv({self.name!r}, {len(self.tasks)} tasks)"


class _Episode(Hooks):
    """One OpenEnv episode's hooks: ``reset`` / ``step`` over the session's client."""

    def __init__(self, env: OpenEnv, client: Any, task: dict[str, Any]) -> None:
        self.env, self.client, self.task = env, client, task

    def _step(self, action: Any) -> Any:
        """One ``step``; an action the environment refuses raises :class:`_Rejected` (counted)."""
        self.client.async_client.last_error = None
        try:
            return self.client.step(action)
        except RuntimeError as exc:  # the server's error frame: the action was refused or failed
            data = self.client.async_client.last_error
            detail = server_error_text(data) if data is not None else str(exc)
            self.env._rejected(action, detail)
            raise _Rejected(f"OpenEnv {self.env.name} rejected the action {action!r}: {detail}") from exc

    def _observation(self, result: Any) -> Observation:
        return Observation.text(self.env.render(result.observation))

    def reset(self) -> StepResult:
        result = self.client.reset(**self.task)
        reward = None if result.reward is None else float(result.reward)
        if result.done:
            return StepResult(self._observation(result), reward, done=True)
        tools: list[dict[str, Any]] | None = None
        if self.env.tools:
            listed = self._step({"type": "list_tools"})
            if listed.reward is not None:  # a reward with the tool list: the reset's and this one
                reward = (reward or 0.0) + float(listed.reward)
            tools = chat_tools(listed.observation.get("tools") or [])
        observation = self._observation(result)
        return StepResult(Observation(observation.messages, tools=tools), reward)

    def act(self, reply: Reply) -> StepResult:
        """The action ``action_from_reply`` reads from the reply; :class:`Unreadable` when there is no
        valid action in it and ``unreadable_reward`` is set (else that raises)."""
        env = self.env
        if env.action_from_reply is None:  # tools only, and the model answered without one
            return StepResult(done=True)
        try:
            action = env.action_from_reply(reply.text)
        except Exception as exc:
            read = f"action_from_reply could not read the reply {reply.text[:200]!r}"
            why = f"{read}: {type(exc).__name__}: {exc}"
            if env.unreadable_reward is None:
                raise ValueError(
                    f"OpenEnv {env.name}: {why} (to train, every reply must become an action; "
                    "unreadable_reward= scores such replies instead of failing the rollout)"
                ) from exc
            raise Unreadable(why) from exc
        try:
            result = self._step(action)
        except _Rejected as exc:
            if env.unreadable_reward is None:
                raise
            raise Unreadable(str(exc)) from exc
        reward = None if result.reward is None else float(result.reward)
        return StepResult(self._observation(result), reward, bool(result.done))

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """One ``call_tool`` step of the session; its result's text for the model."""
        result = self._step({"type": "call_tool", "tool_name": name, "arguments": arguments})
        text, failed = tool_text(result.observation)
        reward = None if result.reward is None else float(result.reward)
        return ToolResult(text, error=text if failed else None, reward=reward, done=bool(result.done))

    def reward(self, episode: EpisodeResult) -> float:
        if self.env.reward_mode == "last":
            return episode.rewards[-1] if episode.rewards else 0.0
        return float(sum(episode.rewards))
