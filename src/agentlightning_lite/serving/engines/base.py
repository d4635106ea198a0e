"""The engine interface the PolicyServer talks to: token-in, token-out generation with logprobs.

An engine turns :class:`GenRequest` (prompt token ids plus sampling settings) into
:class:`GenResult` (the sampled token ids, their logprobs, the text and why it stopped).
:class:`~.batching.BatchingEngine` (in :mod:`.batching`) adds a background loop that groups concurrent
requests into batches.
"""

from __future__ import annotations

import abc
import collections
import concurrent.futures
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..chat_format import chat_template_text, render_chat
from ..structured import ResponseFormat, ResponseFormatError
from .pausing import PauseGate

__all__ = ["Engine", "GenRequest", "GenResult", "RunningRequest", "describe_running"]


@dataclass
class GenRequest:
    """One generation: a prompt as token ids and how to sample the continuation.

    ``temperature == 0`` means greedy. ``top_logprobs`` asks for that many alternatives per
    token. ``top_k`` (0: all tokens), ``min_p``, and the penalties (``presence_penalty`` and
    ``frequency_penalty`` on the reply's tokens so far, OpenAI's; ``repetition_penalty`` on the
    prompt's and the reply's, vLLM's) shape the distribution like vLLM's sampler; their defaults are
    neutral. ``messages``/``tools`` carry the chat request (a scripted engine answers from them).
    ``agent`` is the calling agent (the engine serves it with its adapter, see
    :meth:`Engine.set_routes`); ``adapter`` names the adapter explicitly instead.
    ``session`` groups the requests of one rollout (engines with several backends keep them on one).
    ``response_format`` asks for JSON (an object, or one that validates against a schema), enforced
    while decoding by engines that support it (see :meth:`Engine.check_response_format`).

    >>> GenRequest(prompt_token_ids=[1, 2, 3], max_tokens=8, temperature=0.0).stop
    []
    """

    prompt_token_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = 0
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    request_id: str = ""
    agent: str | None = None
    adapter: str | None = None
    response_format: ResponseFormat | None = None
    session: str | None = None
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    @property
    def penalised(self) -> bool:
        """Whether a penalty applies (they need the tokens so far)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def truncated(self) -> bool:
        """Whether part of the distribution is cut off (top-p, top-k or min-p)."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0


@dataclass
class GenResult:
    """What an engine generated for one :class:`GenRequest`.

    ``token_ids`` are the sampled tokens exactly as generated (an EOS token that ended the
    reply is included; text cut at a stop string keeps the tokens that were sampled);
    ``logprobs[i]`` is the log-probability of ``token_ids[i]``; ``text`` is the decoded reply
    without special tokens and without a matched stop string. ``finish_reason`` is
    ``"stop"`` (EOS or stop string), ``"length"``, or ``"abort"`` (stopped by ``Engine.cancel``).
    ``adapter`` is the LoRA adapter that generated it (``None``: the base model).

    >>> r = GenResult(prompt_token_ids=[1], token_ids=[5, 2], logprobs=[-0.1, -0.2], text="hi",
    ...               finish_reason="stop")
    >>> r.num_tokens
    2
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    top_logprobs: list[list[tuple[int, float]]] | None = None
    stop_reason: str | int | None = None
    weights_version: int = 0
    adapter: str | None = None

    @property
    def num_tokens(self) -> int:
        """How many tokens were generated."""
        return len(self.token_ids)


class RunningRequest(NamedTuple):
    """A request generating now (see :meth:`BatchingEngine.running`): its ``request_id`` and
    ``session`` (the rollout, for requests of the PolicyServer), ``prompt_tokens``, the ``tokens``
    generated so far (0 where the engine does not report progress), ``seconds`` since it started
    generating and the ``adapter`` serving it."""

    request_id: str
    session: str | None
    prompt_tokens: int
    tokens: int
    seconds: float
    adapter: str | None


def describe_running(running: Sequence[RunningRequest], limit: int = 5) -> str:
    """One line naming the replies still generating (the longest running first, at most ``limit``): what
    an error about requests that timed out can add.

    >>> describe_running([RunningRequest("chatcmpl-1", "ro-7", 120, 412, 95.25, None)])
    '1 reply still generating: chatcmpl-1 (rollout ro-7): 412 tokens so far (prompt 120) in 95.2 s'
    >>> describe_running([])
    'no reply is generating'
    """
    if not running:
        return "no reply is generating"
    items = sorted(running, key=lambda r: -r.seconds)
    parts = []
    for r in items[:limit]:
        who = r.request_id or "a request"
        if r.session:
            who += f" (rollout {r.session})"
        parts.append(f"{who}: {r.tokens} tokens so far (prompt {r.prompt_tokens}) in {r.seconds:.1f} s")
    more = f", and {len(items) - limit} more" if len(items) > limit else ""
    noun = "reply" if len(items) == 1 else "replies"
    return f"{len(items)} {noun} still generating: " + "; ".join(parts) + more


class Engine(abc.ABC):
    """Base class of the policy engines (``HFEngine``, ``VLLMEngine``, ``ScriptedEngine``).

    Subclasses set ``model_name``, ``tokenizer`` (a Hugging Face tokenizer or one with the same
    ``encode``/``decode``/``apply_chat_template``) and ``max_context``, and implement
    :meth:`generate`. ``version`` counts weight updates; ``lock`` guards the weights. The typed
    contract callers rely on is in :mod:`.contract`: every engine is a ``ServingEngine``; one that
    takes new weights adds ``update_weights(source, adapter=None)`` (a ``TrainableEngine``, and only it
    changes its ``version``); one that serves several adapters adds ``add_adapter``. Every engine can
    be paused for a weight switch (``with engine.paused(): ...``, the :class:`~.pausing.Pausable`
    contract): :meth:`submit` and :meth:`cancel` pass every request through the engine's
    :class:`~.pausing.PauseGate`, then to :meth:`start_request` and :meth:`cancel_request`, which
    subclasses override to start and stop one request (never ``submit``/``cancel`` themselves: code
    there would run for requests the pause holds).

    >>> from agentlightning_lite.serving.engines import ScriptedEngine
    >>> engine = ScriptedEngine(["Hello!"], tokenizer="bytes")
    >>> ids = engine.encode(engine.apply_chat_template([{"role": "user", "content": "Hi"}]))
    >>> engine.generate([GenRequest(prompt_token_ids=ids)])[0].text
    'Hello!'
    """

    model_name: str = "model"
    tokenizer: Any = None
    max_context: int = 8192

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.version = 0
        self._stats_lock = threading.Lock()
        self._stats: dict[str, Any] = {
            "requests": 0,
            "batches": 0,
            "max_batch_size": 0,
            "batch_sizes": collections.Counter(),
            "prompt_tokens": 0,
            "generated_tokens": 0,
            "busy_s": 0.0,
            "aborted": 0,
        }
        #: holds the requests that arrive while paused and counts those in flight (see :mod:`.pausing`)
        self.pause_gate = PauseGate()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self.routes: dict[str, str | None] = {}
        self.route_default: str | None = None
        self._routed = False

    # -- text <-> tokens ------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for OpenAI chat ``messages`` (tools rendered as the model expects);
        ``template_kwargs``: extra variables of the chat template (``enable_thinking=False``...)."""
        return render_chat(self.tokenizer, list(messages), tools, tool_choice, **template_kwargs)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (no BOS added by default: chat templates write their own)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The text of one token (special tokens included), as reported in logprobs."""
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template (``None``: none), what ``tool_parser="auto"`` reads."""
        return chat_template_text(self.tokenizer)

    @property
    def vocab_size(self) -> int | None:
        """How many token ids the tokenizer knows (ids at or past it are refused), if it says."""
        try:
            return len(self.tokenizer)
        except TypeError:
            return None

    @property
    def eos_token_ids(self) -> set[int]:
        """Token ids that end a reply."""
        ids: set[int] = set()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        return ids

    # -- generation -----------------------------------------------------------------------
    def check_response_format(
        self, fmt: ResponseFormat, tools: Sequence[dict[str, Any]] | None = None
    ) -> None:
        """Raise :class:`~agentlightning_lite.serving.structured.ResponseFormatError` unless this engine
        can honour ``fmt`` (for a chat request offering ``tools``); the server answers a 400 then.
        Engines that enforce a format while decoding override it; this one cannot."""
        raise ResponseFormatError(
            f"'response_format' {fmt.type!r} is not supported by {type(self).__name__}: it cannot constrain "
            "its output"
        )

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        """Generate for every request (blocking; thread-safe). One result per request, in order."""

    def submit(self, request: GenRequest) -> concurrent.futures.Future[GenResult]:
        """Start one generation and return a future (the server awaits it without blocking); while the
        engine is paused the future is held, and the request starts at :meth:`resume`."""
        return self.pause_gate.submit(request, self.start_request)

    def start_request(self, request: GenRequest) -> concurrent.futures.Future[GenResult]:
        """Start one generation now and return its future (what :meth:`submit` calls once the pause
        gate lets the request through; engines override it). This one runs :meth:`generate` on a
        worker thread."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if self._executor is None:
            with self._stats_lock:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=4, thread_name_prefix=f"agl-{type(self).__name__}"
                    )
        return self._executor.submit(lambda: self.generate([request])[0])

    def cancel(self, future: concurrent.futures.Future[GenResult]) -> bool:
        """Give up a request made with :meth:`submit` (its client is gone, or its rollout timed out).

        A request still waiting is dropped. One already generating stops at its next decoding step
        in engines that support it (``HFEngine``): its future then gets the tokens so far, with
        ``finish_reason="abort"``. Returns whether the request was dropped or marked to stop.
        """
        return self.pause_gate.cancel(future, self.cancel_request)

    def cancel_request(self, future: concurrent.futures.Future[GenResult]) -> bool:
        """Give up a request that :meth:`start_request` started (what :meth:`cancel` calls for a
        request not held by a pause; engines that can stop a running request override it)."""
        return future.cancel()

    # -- pausing (the Pausable contract) ----------------------------------------------------
    def pause(self) -> None:
        """Hold new requests; return once no request is in flight (the weights may then switch)."""
        self.pause_gate.pause()

    def resume(self) -> None:
        """End a :meth:`pause`: the held requests go on (at the last of nested pauses)."""
        self.pause_gate.resume()

    def paused(self) -> AbstractContextManager[None]:
        """No request generates inside: new ones wait, the ones in flight finish first.

        >>> from agentlightning_lite.serving.engines import ScriptedEngine
        >>> engine = ScriptedEngine(["hi"], tokenizer="bytes")
        >>> with engine.paused():
        ...     pass  # switch the weights here
        """
        return self.pause_gate.paused()

    # -- adapters -------------------------------------------------------------------------
    @property
    def adapters(self) -> list[str]:
        """The names of the LoRA adapters this engine can serve (none for a plain model)."""
        return []

    def _own_adapter(self) -> str | None:
        """The adapter serving calls while no routes are set (the engine's single adapter, if any)."""
        return None

    def set_routes(self, routes: Mapping[str, str | None], default: str | None = None) -> None:
        """Serve each agent's calls with its own adapter: ``routes`` maps agent names to adapter
        names (``None``: the base model); other agents, and calls that name no agent, get ``default``.

        >>> from agentlightning_lite.serving.engines import ScriptedEngine
        >>> engine = ScriptedEngine(["hi"], tokenizer="bytes")
        >>> engine.set_routes({"checker": None})
        >>> engine.adapter_for("checker"), engine.adapter_for("writer")
        (None, None)
        >>> engine.set_routes({"writer": "writer"})
        Traceback (most recent call last):
        ...
        KeyError: "unknown adapter(s) ['writer']: this engine serves []"
        """
        wanted = {a for a in (*routes.values(), default) if a is not None}
        unknown = sorted(a for a in wanted if a not in self.adapters)
        if unknown:
            raise KeyError(f"unknown adapter(s) {unknown}: this engine serves {sorted(self.adapters)}")
        with self.lock:
            self.routes = dict(routes)
            self.route_default = default
            self._routed = True

    def adapter_for(self, agent: str | None) -> str | None:
        """The adapter that serves ``agent``'s calls (``None``: the base model)."""
        if not self._routed:
            return self._own_adapter()
        if agent is not None and agent in self.routes:
            return self.routes[agent]
        return self.route_default

    def _adapter_of(self, request: GenRequest) -> str | None:
        return request.adapter if request.adapter is not None else self.adapter_for(request.agent)

    # -- weights --------------------------------------------------------------------------
    def expect(self, n: int, wait_s: float = 2.0) -> None:
        """A hint that ``n`` requests are about to arrive together; batching engines wait for them."""
        return None

    # -- statistics -----------------------------------------------------------------------
    def _record_batch(
        self, requests: Sequence[GenRequest], results: Sequence[GenResult], busy: float
    ) -> None:
        with self._stats_lock:
            s = self._stats
            s["requests"] += len(requests)
            s["batches"] += 1
            s["max_batch_size"] = max(s["max_batch_size"], len(requests))
            s["batch_sizes"][len(requests)] += 1
            s["prompt_tokens"] += sum(len(r.prompt_token_ids) for r in requests)
            s["generated_tokens"] += sum(r.num_tokens for r in results)
            s["busy_s"] += busy
            s["aborted"] += sum(r.finish_reason == "abort" for r in results)

    def _record_result(self, request: GenRequest, result: GenResult) -> None:
        """Count one request as it ends (engines that resolve requests one by one)."""
        with self._stats_lock:
            s = self._stats
            s["requests"] += 1
            s["prompt_tokens"] += len(request.prompt_token_ids)
            s["generated_tokens"] += result.num_tokens
            s["aborted"] += result.finish_reason == "abort"

    def _record_rows(self, rows: int, first: bool) -> None:
        """Note ``rows`` generating at once in an engine that batches continuously; ``first``: the first
        rows since it went busy (a new batch, in :attr:`stats`)."""
        with self._stats_lock:
            s = self._stats
            s["batches"] += first
            s["max_batch_size"] = max(s["max_batch_size"], rows)

    def _record_busy(self, requests: int, busy: float) -> None:
        """Count the end of one batch of an engine that batches continuously: ``requests`` served from
        the engine going busy until it had nothing left, in ``busy`` seconds."""
        with self._stats_lock:
            self._stats["batch_sizes"][requests] += 1
            self._stats["busy_s"] += busy

    def running(self) -> list[RunningRequest]:
        """The requests generating now, the longest running first (``[]`` for engines that do not
        track them; :class:`~.batching.BatchingEngine` does)."""
        return []

    @property
    def stats(self) -> dict[str, Any]:
        """Counters: ``requests``, ``batches``, ``max_batch_size``, ``batch_sizes`` (size -> count),
        ``prompt_tokens``, ``generated_tokens``, ``busy_s`` (seconds spent generating), ``aborted``
        (requests stopped mid-generation by :meth:`cancel`)."""
        with self._stats_lock:
            out = dict(self._stats)
            out["batch_sizes"] = dict(self._stats["batch_sizes"])
            return out

    def reset_stats(self) -> None:
        """Zero the counters of :attr:`stats`."""
        with self._stats_lock:
            for k, v in self._stats.items():
                self._stats[k] = collections.Counter() if isinstance(v, collections.Counter) else type(v)()

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop background threads; pending requests fail."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_name!r}, version={self.version})"
