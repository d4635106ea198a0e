"""verifiers (``verifiers.v1``) tasksets as an environment: their tasks, scored by their own rewards.

The policy plays each task against the PolicyServer (so every call is captured with its tokens here),
in the role verifiers' tool-less chat harness plays; the conversation then becomes a verifiers
``Trace`` and the task's own ``Task.score`` runs its ``@vf.reward`` and ``@vf.metric`` functions on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.util
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..tracer import Tracer, emit_signal
from .base import Environment, require
from .episode import EpisodeResult, EpisodeSpec, Hooks, Observation, Reply, StepResult, run_episode
from .verifiers_env import EnvEpisode, load_env

__all__ = ["Verifiers", "chat_messages"]

EXTRA = "envs-verifiers"
_T = TypeVar("_T")


def _vf() -> Any:
    return require("verifiers.v1", EXTRA, "agl.envs.Verifiers")


def chat_messages(system_prompt: str | None, prompt: Any) -> list[dict[str, Any]]:
    """The chat messages a task starts with, as verifiers' chat harness sends them: the task's
    ``system_prompt`` as a system message, then its ``prompt`` (a string: one user message; a list of
    messages: each in the Chat Completions wire format).

    >>> chat_messages("Answer with a number.", "2+2?")
    [{'role': 'system', 'content': 'Answer with a number.'}, {'role': 'user', 'content': '2+2?'}]
    >>> chat_messages(None, [{"role": "user", "content": "Hi"}])
    [{'role': 'user', 'content': 'Hi'}]
    """
    out: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if prompt is None:
        return out
    if isinstance(prompt, str):
        return [*out, {"role": "user", "content": prompt}]
    for message in prompt:
        if isinstance(message, Mapping):
            out.append(dict(message))
        else:  # a verifiers Message (pydantic)
            out.append(importlib.import_module("verifiers.v1.dialects.chat").message_to_wire(message))
    return out


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion from sync code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _attr(spec: str) -> Any:
    """``pkg.module:attr`` (the current directory on ``sys.path``) or ``path/to/file.py:attr``."""
    module_path, _, name = spec.rpartition(":")
    if module_path.endswith(".py"):
        path = Path(module_path).resolve()
        if not path.is_file():
            raise ValueError(f"{spec!r}: no file {path}")
        loaded = importlib.util.spec_from_file_location(f"agl_verifiers_{path.stem}", path)
        if loaded is None or loaded.loader is None:
            raise ValueError(f"{spec!r}: cannot import {path}")
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:  # as agl-lite imports agents
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_path)
    if not hasattr(module, name):
        raise ValueError(f"{spec!r}: {module.__name__} has no attribute {name!r}")
    return getattr(module, name)


def _not_an_env(vf: Any, value: Any) -> None:
    """Refuse a verifiers ``vf.Env`` (a class or an object), saying what is played here instead."""
    env_type = getattr(vf, "Env", None)
    if env_type is None:
        return
    is_class = isinstance(value, type) and issubclass(value, env_type)
    if not (is_class or isinstance(value, env_type)):
        return
    name = value.__name__ if is_class else type(value).__name__
    raise TypeError(
        f"{name} is a verifiers environment (vf.Env: the agents of a multi-turn or multi-agent episode), "
        "not a taskset. agl.envs.Verifiers plays a taskset's tasks: give it the taskset (a vf.Taskset, "
        "its class, a function returning one, or its verifiers taskset id, e.g. the id in the env's "
        f"config.taskset), and an environment of one agent seat as env={name} (its run() is the other "
        "side of the conversation); run environments of several agents with verifiers' vf-eval"
    )


def _load_taskset(taskset: Any, config: Mapping[str, Any] | None = None) -> Any:
    """A ``vf.Taskset`` from what :class:`Verifiers` accepts (see there)."""
    vf = _vf()
    options = dict(config or {})
    if isinstance(taskset, str):
        if ":" in taskset:
            taskset = _attr(taskset)
        else:  # verifiers' own taskset id: an installed package exporting a Taskset subclass
            config_type = vf.taskset_config_type(taskset)
            return vf.load_taskset(config_type(**{**options, "id": taskset}))
    _not_an_env(vf, taskset)
    if isinstance(taskset, type) and issubclass(taskset, vf.Taskset):
        generic = importlib.import_module("verifiers.v1.utils.generic")
        config_type = generic.concrete_type(taskset, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
        return taskset(config_type(**options))
    if callable(taskset) and not isinstance(taskset, vf.Taskset):
        taskset = taskset(**options)
    elif options:
        raise ValueError("config= applies to a taskset id, class or loader, not to a Taskset object")
    _not_an_env(vf, taskset)  # what a loader returned
    if not isinstance(taskset, vf.Taskset):
        raise TypeError(f"expected a verifiers Taskset (vf.Taskset), got {type(taskset).__name__}")
    return taskset


def _requires_runtime(fn: Callable[..., Any]) -> bool:
    import inspect

    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _hosted(config: Any) -> bool:
    """A verifiers client config left on Prime's hosted endpoint with no key in the environment."""
    clients = importlib.import_module("verifiers.v1.configs.client")
    default = getattr(clients, "DEFAULT_PRIME_INFERENCE_URL", None)
    on_prime = config.api_key_var == "PRIME_API_KEY" and (
        config.base_url == default or "primeintellect" in str(config.base_url)
    )
    return bool(on_prime and not os.environ.get("PRIME_API_KEY"))


def _unsupported(task: Any, taskset: Any = None) -> list[str]:
    """Why a verifiers task cannot be played here (empty: it can): what needs verifiers' own
    harness, runtime or a hosted login rather than a chat with the policy and the task's rewards."""
    why: list[str] = []
    name = type(task).__name__
    if getattr(task, "NEEDS_CONTAINER", False):
        why.append(
            f"{name} needs a container runtime (verifiers' default runtime, prime, is a hosted sandbox "
            "that needs a Prime login; run it with verifiers' own `vf-eval`)"
        )
    toolsets = list(task.toolsets(task.config))
    if taskset is not None:
        toolsets += list(taskset.toolsets(taskset.config))
    if toolsets:
        names = ", ".join(type(t).__name__ for t in toolsets)
        why.append(f"{name} offers tools ({names}): tool servers run in verifiers' runtime")
    scoring = [*task.hooks("reward"), *task.hooks("metric")]
    if needing := [fn.__name__ for fn in scoring if _requires_runtime(fn)]:
        why.append(f"{name}'s rewards/metrics {needing} read the runtime (a sandbox), which is not here")
    decorators = importlib.import_module("verifiers.v1.utils.decorators")
    if hooks := [fn.__name__ for fn in decorators.discover_decorated(task, "intercept")]:
        why.append(f"{name}'s @vf.intercept hooks {hooks} rewrite requests inside verifiers' interception")
    for judge in task.config.judges:
        if _hosted(judge):
            why.append(
                f"{name}'s plugged judge {judge.id!r} calls Prime's hosted endpoint and PRIME_API_KEY is "
                "not set (a hosted login): give the judge a base_url and api_key_var of your endpoint"
            )
    return why


class Verifiers(Environment):
    """A verifiers taskset (``verifiers.v1``, PyPI ``verifiers`` 0.4): its tasks, played by the
    policy through the PolicyServer, scored by the task's own ``@vf.reward`` functions.

    ``taskset`` is a ``vf.Taskset``, a ``vf.Taskset`` subclass (built with its default config plus
    ``config``), a function returning one (called with ``config`` as keywords), a string
    ``"pkg.module:name"`` or ``"path/file.py:name"`` naming any of these, or verifiers' own taskset
    id (an installed taskset package, loaded as ``vf.load_taskset`` does); a verifiers environment
    (``vf.Env``: a multi-turn or multi-agent episode) given as the taskset is refused with a
    ``TypeError`` saying so. ``size`` caps the tasks
    (``None``: all; an infinite taskset needs it), after a shuffle with ``seed`` when one is given.

    Multi-turn: ``env`` is a ``vf.Env`` of one agent seat (its class, built with its config type and
    ``env_config``; an instance; or ``"path/file.py:Name"``) whose ``run`` is the environment's side of
    the conversation (``agents.<seat>.interaction(task)`` and ``await chat.turn(message)``). Each task
    is then one episode of :func:`agl.envs.episode.run_episode`: the environment's ``run`` in a thread
    of its own, each turn's message an observation, each policy reply the seat's answer, at most
    ``max_turns`` model calls (then the next turn answers ``terminated``); the task the environment
    handed its seat scores the whole conversation. Environments of several seats, or overriding
    ``finalize`` / ``start`` / ``stop``, are refused with a ``TypeError`` saying why.

    The default agent is verifiers' tool-less chat harness played against the rollout's ``llm``:
    the task's ``system_prompt`` and ``prompt`` (:func:`chat_messages`) in one chat call. Its
    reply is committed to a ``vf.Trace`` of the task (with the call's usage and finish reason), the
    task's ``score`` runs its rewards and metrics on it, and the rollout's reward is the trace's
    ``reward`` (the weighted sum of the named rewards); the named rewards and metrics are recorded
    as a ``signal`` span ``verifiers``. Nothing of verifiers' client, interception server or
    runtime is involved, so no login is needed; tasks that need them (tools, a container, rewards
    that read the runtime, ``@vf.intercept`` hooks, a plugged judge on Prime's hosted endpoint)
    are refused at construction, saying why. Score your own agent's reply with :meth:`reward`
    (or :meth:`score` for the whole trace). Needs ``pip install "agentlightning-lite[envs-verifiers]"``.

    Each task is JSON: ``{"key": ..., "idx": ..., "data": {...}}`` (the task's ``TaskData``,
    its defaults left out), matched back to its ``vf.Task`` by ``key`` (verifiers' content hash).

    >>> import agentlightning_lite as agl
    >>> env = agl.envs.Verifiers("my_tasks.py:load_taskset", size=32)  # doctest: +SKIP
    >>> env.reward(env.tasks[0], "The answer is 4.")  # doctest: +SKIP
    1.0
    >>> # trainer.fit(env.agent, env.tasks); trainer.evaluate(env.agent, env.tasks)
    """

    def __init__(
        self,
        taskset: Any,
        size: int | None = None,
        seed: int | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        env: Any = None,
        env_config: Mapping[str, Any] | None = None,
        max_turns: int = 10,
        max_tokens: int = 1024,
        temperature: float = 1.0,
        eval_temperature: float = 0.0,
    ) -> None:
        vf = _vf()  # the missing extra, named, before anything else
        named = getattr(taskset, "__name__", type(taskset).__name__)
        self.name: str = taskset if isinstance(taskset, str) else named
        self.max_tokens, self.max_turns = max_tokens, max_turns
        if isinstance(env, str):
            env = _attr(env)
        #: the verifiers environment (``env=``) and its agent seat, or ``None``: one chat call a task
        self.env: Any = None
        self.seat = ""
        if env is not None:
            self.env, self.seat = load_env(vf, env, env_config)
        self.taskset = _load_taskset(taskset, config)
        view = self.taskset
        if seed is not None:
            view = view.take(size).shuffle(seed) if not view.bounded and size else view.shuffle(seed)
        if size is not None:
            view = view.take(size)
        elif not view.bounded:
            raise ValueError(f"{self.name}: the taskset is infinite; give size")
        self.vf_tasks: dict[str, Any] = {}
        tasks = []
        for task in view:
            why = _unsupported(task, self.taskset)
            if self.env is not None and (stops := [fn.__name__ for fn in task.hooks("stop")]):
                why.append(f"{type(task).__name__}'s @vf.stop hooks {stops} run in verifiers' own rollouts")
            if why:
                raise ValueError(f"agl.envs.Verifiers cannot play {self.name}: " + "; ".join(why))
            self.vf_tasks[task.key] = task
            data = task.data.model_dump(mode="json", exclude_defaults=True)
            tasks.append({"key": task.key, "idx": task.data.idx, "data": data})
        if len(self.vf_tasks) != len(tasks):
            keys = f"{len(tasks)} tasks, {len(self.vf_tasks)} keys"
            raise ValueError(f"{self.name}: the tasks' keys (verifiers' Task.key) are not unique ({keys})")
        self._vf = vf
        super().__init__(tasks, temperature=temperature, eval_temperature=eval_temperature)

    def vf_task(self, task: Mapping[str, Any]) -> Any:
        """The ``vf.Task`` behind ``task`` (one of :attr:`tasks`, or its JSON copy)."""
        try:
            return self.vf_tasks[task["key"]]
        except (KeyError, TypeError):
            raise KeyError(f"not a task of {self!r}: {str(task)[:200]}") from None

    def messages(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The chat messages the default agent sends for ``task`` (:func:`chat_messages`)."""
        data = self.vf_task(task).data
        return chat_messages(data.system_prompt, data.prompt)

    def score(self, task: Mapping[str, Any], reply: Any, messages: list[dict[str, Any]] | None = None) -> Any:
        """The ``vf.Trace`` of ``task`` answered by ``reply``, scored by the task's own ``score``.

        ``reply`` is the model's text or its ``ChatCompletion`` (then its usage and finish reason
        reach the trace too); ``messages`` the conversation before it (default :meth:`messages`).
        """
        before = messages if messages is not None else self.messages(task)
        return self.score_turns(self.vf_task(task), [(before, reply)])

    def score_turns(self, vf_task: Any, turns: Sequence[tuple[list[dict[str, Any]], Any]]) -> Any:
        """The ``vf.Trace`` of a conversation on ``vf_task`` (a ``vf.Task``), scored by its ``score``:
        ``turns`` are each model call's ``(messages before it, reply)``, the reply its text or its
        ``ChatCompletion``, in order (a multi-turn episode: each call's messages extend the last's)."""
        vf = self._vf
        graph = importlib.import_module("verifiers.v1.graph")
        chat = importlib.import_module("verifiers.v1.dialects.chat")
        trace = vf.Trace(
            task=vf.TraceTask(
                type=type(vf_task).__name__, data=vf_task.data, key=vf_task.key, hash=vf_task.hash
            ),
            agent=vf.AgentInfo(config=vf.AgentConfig(model="policy")),
        )
        for messages, reply in turns:
            prompt = [chat.parse_message(m) for m in messages]
            if isinstance(reply, str) or reply is None:
                response = vf.Response(
                    id=f"agl-{uuid.uuid4().hex}",
                    created=int(time.time()),
                    model="policy",
                    message=vf.AssistantMessage(content=reply or ""),
                    finish_reason="stop",
                )
            else:
                response = chat.response_from_wire(reply)
            trace.agent.config = vf.AgentConfig(model=response.model)
            started = time.time()
            node = graph.prepare_turn(trace, prompt, []).commit(response)
            trace.calls.append(
                vf.ModelCall(
                    node=node,
                    model=response.model,
                    endpoint="/chat/completions",
                    finish_reason=response.finish_reason,
                    usage=response.usage,
                    time=vf.TimeSpan(start=started, end=time.time()),
                )
            )
        trace.is_completed = trace.ok = True
        _run(vf_task.score(trace))
        missing = [name for name, value in trace.rewards.items() if value is None]
        if missing:
            raise RuntimeError(f"{type(vf_task).__name__}: rewards {missing} did not score")
        return trace

    def reward(
        self, task: Mapping[str, Any], reply: Any, messages: list[dict[str, Any]] | None = None
    ) -> float:
        """The task's reward for ``reply``: the scored trace's ``reward`` (see :meth:`score`); its
        named rewards and metrics go to the current rollout as a ``signal`` span ``verifiers``."""
        return _recorded(self.score(task, reply, messages))

    def play(self, task: Mapping[str, Any], llm: Any, temperature: float) -> float:
        """One episode of ``task`` (:func:`agl.envs.episode.run_episode`): one chat call with the
        task's messages, or with ``env=`` the environment's turns; the task's reward of the
        conversation. The task's system prompt is read through ``llm.prompt("system", default=...)``,
        so ``agl.APO`` can optimise it."""

        def system(text: str) -> str:
            return str(llm.prompt("system", default=text))

        if self.env is None:
            hooks: Hooks = _OneCall(self, task, system)
            spec = EpisodeSpec("verifiers", max_turns=1, max_tokens=self.max_tokens)
        else:
            hooks = EnvEpisode(
                self._vf,
                self.env,
                self.seat,
                self.vf_task(task),
                lambda vt: chat_messages(vt.data.system_prompt, vt.data.prompt),
                lambda vt, turns: _recorded(self.score_turns(vt, turns)),
                system,
            )
            spec = EpisodeSpec("verifiers", max_turns=self.max_turns, max_tokens=self.max_tokens)
        return run_episode(hooks, spec, llm, temperature)

    def __repr__(self) -> str:
        return f"Verifiers({self.name!r}, {len(self.tasks)} tasks)"


def _recorded(trace: Any) -> float:
    """A scored trace's reward; its named rewards and metrics recorded as a ``signal`` span ``verifiers``."""
    if Tracer.current_rollout() is not None:
        rewards = {k: [r.score, r.weight] for k, r in trace.rewards.items() if r is not None}
        emit_signal("verifiers", json.loads(json.dumps({"rewards": rewards, "metrics": trace.metrics})))
    return float(trace.reward)


class _OneCall(Hooks):
    """A taskset's task in one chat call: the task's messages, the reply scored by the task."""

    def __init__(self, env: Verifiers, task: Mapping[str, Any], system: Callable[[str], str]) -> None:
        self.env, self.task = env, task
        self.messages = env.messages(task)
        first = self.messages[0] if self.messages else None
        if first is not None and first["role"] == "system" and isinstance(first["content"], str):
            self.messages[0] = {"role": "system", "content": system(first["content"])}
        self.completion: Any = None

    def reset(self) -> StepResult:
        return StepResult(Observation(self.messages))

    def act(self, reply: Reply) -> StepResult:
        self.completion = reply.completion
        return StepResult(done=True)

    def reward(self, episode: EpisodeResult) -> float:
        return self.env.reward(self.task, self.completion, self.messages)
