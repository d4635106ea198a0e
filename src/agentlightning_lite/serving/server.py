"""The PolicyServer: an OpenAI-compatible HTTP server that records every call as an ``llm`` span.

Routes (each also under ``/rollout/<rollout_id>`` and ``/rollout/<rollout_id>/agent/<agent>``):
``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``; plus ``GET /health``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..store.base import Store
from ..store.memory import MemoryStore
from ..tracer import new_span_id
from ..types import Span
from .chat import ChatFormatError, content_text, parse_tool_calls, select_tools
from .engines.base import Engine, GenRequest, GenResult
from .llm import LLM

__all__ = ["APIError", "PolicyServer"]

logger = logging.getLogger("agentlightning_lite.serving")

AGENT_HEADER = "x-agl-agent"
ROLLOUT_HEADER = "x-agl-rollout-id"
PARENT_HEADER = "x-agl-parent-span-id"
MAX_TOP_LOGPROBS = 20


class APIError(Exception):
    """An error answered with an OpenAI-style body ``{"error": {message, type, param, code}}``.

    >>> APIError(400, "bad", param="n").body()
    {'error': {'message': 'bad', 'type': 'invalid_request_error', 'param': 'n', 'code': None}}
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body of the error response."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """The error as a starlette response."""
        return JSONResponse(self.body(), status_code=self.status)


@dataclass
class _Call:
    """What a request resolved to before generation."""

    body: dict[str, Any]
    rollout_id: str | None
    agent: str | None
    parent_id: str | None
    model: str


@dataclass
class _Params:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False

    def record(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "stop": self.stop,
            "seed": self.seed,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            "stream": self.stream,
        }


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _number(body: dict[str, Any], key: str, default: Any, lo: float, hi: float, integer: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise _bad(f"'{key}' must be {'an integer' if integer else 'a number'}, got {value!r}", key)
    if not lo <= value <= hi:
        raise _bad(f"'{key}' must be between {lo} and {hi}, got {value!r}", key)
    return value


def _flag(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"'{key}' must be a boolean, got {value!r}", key)
    return value


class PolicyServer:
    """Serve an engine over the OpenAI API and record each call, with its tokens, in a store.

    The server runs in a background thread of this process (``with PolicyServer(...) as server``
    or ``start()``/``stop()``); ``port=0`` picks a free port. Hand agents ``server.llm(rollout_id)``:
    its ``base_url`` (``http://host:port/rollout/<id>/v1``) routes every call to that rollout.

    Recording: each generated choice becomes one ``llm`` span (``n=3`` gives three spans sharing
    ``attributes["request_id"]``) with ``input`` = the request messages (the prompt string for
    ``/v1/completions``), ``output`` = the assistant message dict (the text for completions),
    the engine's own ``prompt_token_ids``/``response_token_ids``/``response_logprobs``, and
    attributes ``policy``, ``server``, ``usage``, ``params``, ``tools``, ``finish_reason``,
    ``prompt_text`` and ``weights_version``. The agent comes from the URL
    (``/rollout/<id>/agent/<name>/v1``), else the ``X-Agl-Agent`` header, else a model name
    ``<model>@<agent>``. Calls to plain ``/v1`` (no rollout; also settable with the
    ``X-Agl-Rollout-Id`` header) each get their own implicit rollout of mode ``trace``
    (metadata ``{"implicit": True}``), or are not recorded with ``record_unrouted=False``.
    Spans are written before the response is sent; ``flush=True`` also commits them at once
    (for readers in other processes; otherwise the store's batching decides when).

    Errors: malformed JSON, unknown model (404), unknown rollout (404), bad parameters and
    context overflow get a 4xx with an OpenAI error body and record nothing; an engine failure
    gets a 500 and an ``error`` span. Streaming (``stream=true``) sends OpenAI chunks once the
    engine has produced the whole reply, then ``data: [DONE]``.

    >>> import agentlightning_lite as agl
    >>> from agentlightning_lite.serving import PolicyServer, engines
    >>> store = agl.MemoryStore()
    >>> with PolicyServer(engines.ScriptedEngine(["4"]), store) as server:  # doctest: +SKIP
    ...     ro = store.start_rollout("2+2?")
    ...     llm = server.llm(ro.rollout_id, agent="solver")
    ...     reply = llm.openai_client().chat.completions.create(
    ...         model=llm.model, messages=[{"role": "user", "content": "2+2?"}])
    >>> reply.choices[0].message.content  # doctest: +SKIP
    '4'
    >>> [t.response_token_ids is not None for t in agl.transitions(store)]  # doctest: +SKIP
    [True]
    """

    def __init__(
        self,
        engine: Engine,
        store: Store | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        model_name: str | None = None,
        aliases: Sequence[str] = (),
        default_max_tokens: int = 1024,
        max_n: int = 16,
        record_unrouted: bool = True,
        flush: bool = False,
        log_level: str = "warning",
    ) -> None:
        self.engine = engine
        self.store: Store = store if store is not None else MemoryStore()
        self.host = host
        self._requested_port = int(port)
        self.api_key = api_key
        self.model_name = model_name or engine.model_name
        self.served_names = {self.model_name, engine.model_name, *aliases}
        self.default_max_tokens = default_max_tokens
        self.max_n = max_n
        self.record_unrouted = record_unrouted
        self.flush = flush
        self.log_level = log_level
        self._known_rollouts: set[str] = set()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._port: int | None = None
        self.app = self._build_app()

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port the server listens on (known once started)."""
        if self._port is None:
            raise RuntimeError("the PolicyServer is not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port`` (no path)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of unrouted calls: ``http://host:port/v1``."""
        return f"{self.url}/v1"

    @property
    def running(self) -> bool:
        """Whether the server thread is serving."""
        return self._thread is not None and self._thread.is_alive()

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._requested_port))
        except OSError as exc:
            sock.close()
            raise OSError(f"cannot listen on {self.host}:{self._requested_port}: {exc}") from exc
        sock.listen(2048)
        sock.set_inheritable(True)
        return sock

    def _make_server(self) -> Any:
        import uvicorn

        config = uvicorn.Config(
            self.app, log_level=self.log_level, access_log=False, lifespan="off", timeout_keep_alive=30
        )
        return uvicorn.Server(config)

    def start(self, timeout: float = 30.0) -> PolicyServer:
        """Start serving in a background thread; returns once the port accepts connections."""
        if self.running:
            return self
        self._socket = self._bind()
        self._port = self._socket.getsockname()[1]
        self._server = self._make_server()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="agl-policy-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the PolicyServer thread stopped while starting (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the PolicyServer did not start within {timeout} s")
            time.sleep(0.01)
        logger.info("PolicyServer serving %s at %s", self.model_name, self.base_url)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (open connections get ``timeout`` seconds to finish)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout)
        self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def serve_forever(self) -> None:
        """Serve in the foreground until Ctrl-C or SIGTERM (what ``agl-lite serve`` runs)."""
        import signal

        def _term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, _term)
        self.start()
        try:
            while self.running:
                self._thread.join(0.5)  # type: ignore[union-attr]
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.stop()

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.base_url if self._port is not None else "not started"
        return f"PolicyServer({self.model_name!r}, {where})"

    # -- endpoints for agents -------------------------------------------------------------
    def llm(self, rollout_id: str | None = None, agent: str | None = None) -> LLM:
        """The endpoint for one rollout (and optionally one agent of it).

        Raises ``KeyError`` when the store has no such rollout.
        """
        root = self.url
        if rollout_id is not None:
            if rollout_id not in self._known_rollouts and self.store.get_rollout(rollout_id) is None:
                raise KeyError(f"unknown rollout {rollout_id!r}: start it in the store first")
            self._known_rollouts.add(rollout_id)
            root += f"/rollout/{quote(rollout_id, safe='')}"
            if agent is not None:
                if "/" in agent:
                    raise ValueError(
                        f"agent names in URLs cannot contain '/': {agent!r} (use the X-Agl-Agent header)"
                    )
                root += f"/agent/{quote(agent, safe='')}"
        model = self.model_name if agent is None or rollout_id is not None else f"{self.model_name}@{agent}"
        return LLM(
            base_url=f"{root}/v1",
            model=model,
            api_key=self.api_key or "agl-no-key",
            rollout_id=rollout_id,
            agent=agent,
        )

    # -- app ------------------------------------------------------------------------------
    def _build_app(self) -> Starlette:
        routes = []
        for prefix in ("", "/rollout/{rollout_id}", "/rollout/{rollout_id}/agent/{agent}"):
            routes += [
                Route(prefix + "/v1/chat/completions", self._chat, methods=["POST"]),
                Route(prefix + "/v1/completions", self._completions, methods=["POST"]),
                Route(prefix + "/v1/models", self._models, methods=["GET"]),
            ]
        routes.append(Route("/health", self._health, methods=["GET"]))

        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            code = "not_found" if exc.status_code == 404 else None
            msg = f"{request.method} {request.url.path}: {exc.detail}"
            return APIError(exc.status_code, msg, code=code).response()

        async def api_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, APIError)
            return exc.response()

        async def unexpected(request: Request, exc: Exception) -> Response:
            logger.exception("PolicyServer: unexpected error")
            return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()

        return Starlette(
            routes=routes,
            exception_handlers={HTTPException: http_error, APIError: api_error, Exception: unexpected},
        )

    async def _health(self, request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "model": self.model_name, "weights_version": self.engine.version}
        )

    def _check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        ):
            raise APIError(
                401,
                "Incorrect API key provided. Pass the server's key as 'Authorization: Bearer <key>'.",
                type="invalid_request_error",
                code="invalid_api_key",
            )

    async def _models(self, request: Request) -> Response:
        self._check_auth(request)
        await self._rollout(request)
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "agentlightning-lite"}
            for name in sorted(self.served_names)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def _rollout(self, request: Request) -> str | None:
        rid = request.path_params.get("rollout_id") or request.headers.get(ROLLOUT_HEADER)
        if rid is None:
            return None
        if rid not in self._known_rollouts:
            found = await run_in_threadpool(self.store.get_rollout, rid)
            if found is None:
                raise APIError(
                    404,
                    f"Unknown rollout id {rid!r}: start the rollout in the store before routing calls to it.",
                    param="rollout_id",
                    code="rollout_not_found",
                )
            self._known_rollouts.add(rid)
        return rid

    async def _call(self, request: Request) -> _Call:
        self._check_auth(request)
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _bad(
                f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
            ) from None
        if not isinstance(body, dict):
            raise _bad("The request body must be a JSON object.", code="invalid_json")
        rollout_id = await self._rollout(request)
        agent = request.path_params.get("agent") or request.headers.get(AGENT_HEADER)
        model = body.get("model")
        if model is None:
            model = self.model_name
        if not isinstance(model, str):
            raise _bad("'model' must be a string", "model")
        base = model
        if model not in self.served_names and "@" in model:
            base, _, suffix = model.rpartition("@")
            agent = agent or suffix or None
        if base not in self.served_names:
            raise APIError(
                404,
                f"The model `{model}` does not exist. This server serves: "
                f"{', '.join(sorted(self.served_names))}.",
                param="model",
                code="model_not_found",
            )
        parent = request.headers.get(PARENT_HEADER)
        return _Call(body=body, rollout_id=rollout_id, agent=agent, parent_id=parent, model=self.model_name)

    def _params(self, body: dict[str, Any], chat: bool) -> _Params:
        p = _Params()
        p.n = _number(body, "n", 1, 1, self.max_n, integer=True)
        p.temperature = float(_number(body, "temperature", 1.0, 0.0, 2.0))
        p.top_p = float(_number(body, "top_p", 1.0, 0.0, 1.0))
        if p.top_p <= 0.0:
            raise _bad("'top_p' must be greater than 0", "top_p")
        key = (
            "max_completion_tokens"
            if chat and body.get("max_completion_tokens") is not None
            else "max_tokens"
        )
        p.max_tokens = _number(body, key, None, 1, 10**9, integer=True)
        if not chat and p.max_tokens is None:
            p.max_tokens = 16  # the OpenAI default for /v1/completions
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is None:
            stop = []
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _bad("'stop' must be a string or a list of strings", "stop")
        p.stop = [s for s in stop if s]
        p.seed = _number(body, "seed", None, -(2**63), 2**63 - 1, integer=True)
        p.stream = _flag(body, "stream")
        opts = body.get("stream_options")
        if opts is not None:
            if not isinstance(opts, dict):
                raise _bad("'stream_options' must be an object", "stream_options")
            p.include_usage = bool(opts.get("include_usage"))
        if chat:
            p.logprobs = _flag(body, "logprobs")
            p.top_logprobs = (
                _number(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS, integer=True) if p.logprobs else 0
            )
        else:
            lp = _number(body, "logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
            p.logprobs = lp is not None
            p.top_logprobs = lp or 0
            if _flag(body, "echo"):
                raise _bad("'echo' is not supported by this server", "echo")
            if body.get("suffix"):
                raise _bad("'suffix' is not supported by this server", "suffix")
            best_of = body.get("best_of")
            if best_of is not None and best_of != p.n:
                raise _bad("'best_of' is not supported by this server (use n)", "best_of")
        return p

    def _budget(self, prompt_len: int, p: _Params, param: str) -> int:
        limit = self.engine.max_context
        room = limit - prompt_len
        if room <= 0:
            raise _bad(
                f"This model's maximum context length is {limit} tokens. However, your {param} resulted in "
                f"{prompt_len} tokens. Please reduce the length of the {param}.",
                param,
                code="context_length_exceeded",
            )
        if p.max_tokens is not None and p.max_tokens > room:
            raise _bad(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + p.max_tokens} tokens ({prompt_len} in the {param}, {p.max_tokens} in the "
                f"completion). Please reduce the length of the {param} or completion.",
                param,
                code="context_length_exceeded",
            )
        return p.max_tokens if p.max_tokens is not None else min(self.default_max_tokens, room)

    def _requests(
        self, prompt_ids: list[int], p: _Params, max_tokens: int, request_id: str, **extra: Any
    ) -> list[GenRequest]:
        return [
            GenRequest(
                prompt_token_ids=prompt_ids,
                max_tokens=max_tokens,
                temperature=p.temperature,
                top_p=p.top_p,
                stop=list(p.stop),
                seed=None if p.seed is None else p.seed + i,  # n choices with a seed: seed, seed+1...
                top_logprobs=p.top_logprobs,
                request_id=f"{request_id}-{i}",
                **extra,
            )
            for i in range(p.n)
        ]

    async def _generate(self, requests: list[GenRequest]) -> list[GenResult]:
        futures = [asyncio.wrap_future(self.engine.submit(r)) for r in requests]
        return list(await asyncio.gather(*futures))

    # -- recording ------------------------------------------------------------------------
    def _record(self, call: _Call, task: Any, spans: list[Span], failed: bool) -> None:
        if not spans:
            return
        rollout_id = call.rollout_id
        implicit = rollout_id is None
        if implicit:
            if not self.record_unrouted:
                return
            ro = self.store.start_rollout(
                task, mode="trace", metadata={"implicit": True, "source": "agl.PolicyServer"}
            )
            rollout_id = ro.rollout_id
            spans = [s.model_copy(update={"rollout_id": rollout_id}) for s in spans]
        self.store.add_spans(spans)
        if implicit:
            self.store.finish_rollout(rollout_id, status="failed" if failed else "succeeded")
        if self.flush:
            self.store.flush()

    def _span(
        self, call: _Call, name: str, start: float, input: Any, attributes: dict[str, Any], **fields: Any
    ) -> Span:
        return Span(
            span_id=new_span_id(),
            rollout_id=call.rollout_id or "",
            parent_id=call.parent_id,
            kind="llm",
            name=name,
            agent=call.agent,
            start_time=start,
            end_time=time.time(),
            input=input,
            model=call.model,
            attributes={"policy": True, "server": "agl", **attributes},
            **fields,
        )

    async def _engine_failed(
        self,
        call: _Call,
        name: str,
        start: float,
        input: Any,
        attrs: dict[str, Any],
        prompt_ids: list[int],
        task: Any,
        exc: BaseException,
    ) -> APIError:
        logger.exception("PolicyServer: the engine failed", exc_info=exc)
        span = self._span(
            call,
            name,
            start,
            input,
            attrs,
            status="error",
            error=f"{type(exc).__name__}: {exc}",
            prompt_token_ids=prompt_ids,
        )
        try:
            await run_in_threadpool(self._record, call, task, [span], True)
        except Exception:
            logger.exception("PolicyServer: could not record the error span")
        return APIError(
            500, f"The engine failed: {type(exc).__name__}: {exc}", type="server_error", code="engine_error"
        )

    # -- /v1/chat/completions -------------------------------------------------------------
    async def _chat(self, request: Request) -> Response:
        start = time.time()
        call = await self._call(request)
        body = call.body
        p = self._params(body, chat=True)
        messages = body.get("messages")
        if messages is None:
            raise _bad(
                "Missing required parameter: 'messages'.", "messages", code="missing_required_parameter"
            )
        tools, tool_choice = body.get("tools"), body.get("tool_choice")
        try:
            offered, _ = select_tools(tools, tool_choice)
            prompt_text = self.engine.apply_chat_template(messages, tools, tool_choice)
        except ChatFormatError as exc:
            raise _bad(str(exc), exc.param) from None
        prompt_ids = self.engine.encode(prompt_text)
        max_tokens = self._budget(len(prompt_ids), p, "messages")
        request_id = "chatcmpl-" + secrets.token_hex(12)
        attrs: dict[str, Any] = {
            "api": "chat.completions",
            "request_id": request_id,
            "params": p.record() | {"max_tokens": max_tokens, "tool_choice": tool_choice},
            "tools": offered or None,
            "prompt_text": prompt_text,
            "engine": type(self.engine).__name__,
        }
        task = _task_of(messages)
        reqs = self._requests(
            prompt_ids,
            p,
            max_tokens,
            request_id,
            messages=messages,
            tools=offered or None,
            prompt=prompt_text,
        )
        try:
            results = await self._generate(reqs)
        except Exception as exc:
            raise await self._engine_failed(
                call, "chat.completions", start, messages, attrs, prompt_ids, task, exc
            ) from exc

        choices, spans = [], []
        usage = _usage(len(prompt_ids), results)
        for i, res in enumerate(results):
            content, calls = (res.text, [])
            if offered:
                content, calls = parse_tool_calls(res.text, offered)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            finish = "tool_calls" if calls else res.finish_reason
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": {"content": self._chat_logprobs(res), "refusal": None}
                    if p.logprobs
                    else None,
                    "finish_reason": finish,
                }
            )
            spans.append(
                self._span(
                    call,
                    "chat.completions",
                    start,
                    messages,
                    attrs
                    | {
                        "choice_index": i,
                        "n": p.n,
                        "finish_reason": finish,
                        "stop_reason": res.stop_reason,
                        "usage": _usage(len(prompt_ids), [res]),
                        "request_usage": usage,
                        "weights_version": res.weights_version,
                    },
                    output=message,
                    prompt_token_ids=res.prompt_token_ids,
                    response_token_ids=res.token_ids,
                    response_logprobs=res.logprobs,
                )
            )
        await run_in_threadpool(self._record, call, task, spans, False)
        created = int(start)
        fingerprint = f"agl-{type(self.engine).__name__}-v{results[0].weights_version}"
        if p.stream:
            return _sse(self._chat_chunks(request_id, created, fingerprint, choices, results, p, usage))
        return JSONResponse(
            {
                "id": request_id,
                "object": "chat.completion",
                "created": created,
                "model": self.model_name,
                "system_fingerprint": fingerprint,
                "choices": choices,
                "usage": usage,
            },
            headers={"x-request-id": request_id},
        )

    def _chat_logprobs(self, res: GenResult, start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
        out = []
        end = len(res.token_ids) if end is None else end
        for k in range(start, end):
            text = self.engine.token_text(res.token_ids[k])
            entry: dict[str, Any] = {
                "token": text,
                "logprob": res.logprobs[k],
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [],
            }
            if res.top_logprobs:
                for tid, lp in res.top_logprobs[k]:
                    t = self.engine.token_text(tid)
                    entry["top_logprobs"].append(
                        {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
                    )
            out.append(entry)
        return out

    def _pieces(self, res: GenResult, text: str) -> list[tuple[str, int, int]]:
        """Split ``text`` into streamable deltas aligned with tokens: (delta, first token, end token)."""
        pieces, emitted, first = [], "", 0
        for k in range(len(res.token_ids)):
            cur = self._decode_prefix(res, k + 1)
            if cur.endswith("\ufffd") or not cur.startswith(emitted):
                continue  # an incomplete UTF-8 character: wait for the next token
            cur = cur[: len(text)]
            if not text.startswith(cur) or len(cur) <= len(emitted):
                continue
            pieces.append((cur[len(emitted) :], first, k + 1))
            emitted, first = cur, k + 1
        if emitted != text:
            pieces.append((text[len(emitted) :], first, len(res.token_ids)))
        elif first < len(res.token_ids) and pieces:
            delta, s, _ = pieces[-1]
            pieces[-1] = (delta, s, len(res.token_ids))  # trailing tokens (EOS) ride on the last piece
        return pieces

    def _decode_prefix(self, res: GenResult, k: int) -> str:
        """The text of the first ``k`` generated tokens."""
        return self.engine.decode(res.token_ids[:k])

    def _chat_chunks(
        self,
        request_id: str,
        created: int,
        fingerprint: str,
        choices: list[dict[str, Any]],
        results: list[GenResult],
        p: _Params,
        usage: dict[str, int],
    ) -> list[dict[str, Any]]:
        def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict:
            return {
                "id": request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model_name,
                "system_fingerprint": fingerprint,
                "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            }

        def lp(res: GenResult, s: int, e: int) -> Any:
            return {"content": self._chat_logprobs(res, s, e), "refusal": None} if p.logprobs else None

        out: list[dict[str, Any]] = []
        for choice, res in zip(choices, results, strict=True):
            i, msg = choice["index"], choice["message"]
            out.append(chunk(i, {"role": "assistant", "content": ""}))
            if msg.get("tool_calls"):
                if msg.get("content"):
                    out.append(chunk(i, {"content": msg["content"]}))
                for j, tc in enumerate(msg["tool_calls"]):
                    every = lp(res, 0, len(res.token_ids)) if j == 0 else None
                    out.append(chunk(i, {"tool_calls": [{"index": j, **tc}]}, logprobs=every))
            else:
                for delta, s, e in self._pieces(res, msg["content"] or ""):
                    out.append(chunk(i, {"content": delta}, logprobs=lp(res, s, e)))
            out.append(chunk(i, {}, finish=choice["finish_reason"]))
        if p.include_usage:  # OpenAI: "usage": null on every chunk, then one chunk with usage only
            for c in out:
                c["usage"] = None
            last = chunk(0, {})
            last["choices"], last["usage"] = [], usage
            out.append(last)
        return out

    # -- /v1/completions ------------------------------------------------------------------
    async def _completions(self, request: Request) -> Response:
        start = time.time()
        call = await self._call(request)
        body = call.body
        p = self._params(body, chat=False)
        prompts = _prompts(body.get("prompt"))
        encoded = [
            (text, ids if ids is not None else self.engine.encode(text or "", add_special_tokens=True))
            for text, ids in prompts
        ]
        if any(not ids for _, ids in encoded):
            raise _bad("'prompt' must not be empty", "prompt")
        budgets = [self._budget(len(ids), p, "prompt") for _, ids in encoded]
        request_id = "cmpl-" + secrets.token_hex(12)
        attrs: dict[str, Any] = {
            "api": "completions",
            "request_id": request_id,
            "engine": type(self.engine).__name__,
        }
        reqs: list[GenRequest] = []
        for (text, ids), budget in zip(encoded, budgets, strict=True):
            reqs += self._requests(ids, p, budget, request_id, prompt=text)
        inputs = [text if text is not None else {"prompt_token_ids": ids} for text, ids in encoded]
        task = inputs[0] if len(inputs) == 1 else inputs
        try:
            results = await self._generate(reqs)
        except Exception as exc:
            raise await self._engine_failed(
                call, "completions", start, task, attrs | {"params": p.record()}, encoded[0][1], task, exc
            ) from exc
        choices, spans = [], []
        usage = {
            "prompt_tokens": sum(len(ids) for _, ids in encoded),
            "completion_tokens": sum(r.num_tokens for r in results),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        for i, res in enumerate(results):
            text_in = inputs[i // p.n]
            choices.append(
                {
                    "index": i,
                    "text": res.text,
                    "logprobs": self._completion_logprobs(res) if p.logprobs else None,
                    "finish_reason": res.finish_reason,
                }
            )
            spans.append(
                self._span(
                    call,
                    "completions",
                    start,
                    text_in,
                    attrs
                    | {
                        "params": p.record() | {"max_tokens": budgets[i // p.n]},
                        "choice_index": i,
                        "n": p.n,
                        "finish_reason": res.finish_reason,
                        "stop_reason": res.stop_reason,
                        "usage": _usage(len(res.prompt_token_ids), [res]),
                        "request_usage": usage,
                        "weights_version": res.weights_version,
                    },
                    output=res.text,
                    prompt_token_ids=res.prompt_token_ids,
                    response_token_ids=res.token_ids,
                    response_logprobs=res.logprobs,
                )
            )
        await run_in_threadpool(self._record, call, task, spans, False)
        created = int(start)
        if p.stream:
            return _sse(self._completion_chunks(request_id, created, choices, results, p, usage))
        return JSONResponse(
            {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": self.model_name,
                "choices": choices,
                "usage": usage,
            },
            headers={"x-request-id": request_id},
        )

    def _completion_logprobs(self, res: GenResult, s: int = 0, e: int | None = None, offset: int = 0) -> dict:
        e = len(res.token_ids) if e is None else e
        tokens = [self.engine.token_text(t) for t in res.token_ids[s:e]]
        offsets, pos = [], offset
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        tops = None
        if res.top_logprobs:
            tops = [{self.engine.token_text(t): lp for t, lp in res.top_logprobs[k]} for k in range(s, e)]
        return {
            "tokens": tokens,
            "token_logprobs": res.logprobs[s:e],
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _completion_chunks(
        self,
        request_id: str,
        created: int,
        choices: list[dict[str, Any]],
        results: list[GenResult],
        p: _Params,
        usage: dict[str, int],
    ) -> list[dict[str, Any]]:
        out = []
        for choice, res in zip(choices, results, strict=True):
            pos = 0
            for delta, s, e in self._pieces(res, choice["text"]):
                out.append(
                    {
                        "id": request_id,
                        "object": "text_completion",
                        "created": created,
                        "model": self.model_name,
                        "choices": [
                            {
                                "index": choice["index"],
                                "text": delta,
                                "logprobs": self._completion_logprobs(res, s, e, pos) if p.logprobs else None,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
                pos += len(delta)
            out.append(
                {
                    "id": request_id,
                    "object": "text_completion",
                    "created": created,
                    "model": self.model_name,
                    "choices": [
                        {
                            "index": choice["index"],
                            "text": "",
                            "logprobs": None,
                            "finish_reason": choice["finish_reason"],
                        }
                    ],
                }
            )
        if p.include_usage:
            out.append(
                {
                    "id": request_id,
                    "object": "text_completion",
                    "created": created,
                    "model": self.model_name,
                    "choices": [],
                    "usage": usage,
                }
            )
        return out


def _usage(prompt_tokens: int, results: Sequence[GenResult]) -> dict[str, int]:
    completion = sum(r.num_tokens for r in results)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def _task_of(messages: Any) -> Any:
    """The task recorded on an implicit rollout: the last user message's text."""
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, dict) and m.get("role") == "user":
            try:
                return content_text(m.get("content"))
            except ChatFormatError:
                return None
    return None


def _prompts(prompt: Any) -> list[tuple[str | None, list[int] | None]]:
    """``/v1/completions`` prompts as (text, token ids): a string, strings, token ids or lists of them."""
    if prompt is None:
        raise _bad("Missing required parameter: 'prompt'.", "prompt", code="missing_required_parameter")
    if isinstance(prompt, str):
        return [(prompt, None)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(x, str) for x in prompt):
            return [(x, None) for x in prompt]
        if all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in prompt):
            return [(None, list(prompt))]
        if all(isinstance(x, list) and x and all(isinstance(t, int) and t >= 0 for t in x) for x in prompt):
            return [(None, list(x)) for x in prompt]
    raise _bad("'prompt' must be a string, a list of strings, or token ids", "prompt")


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        for c in chunks:
            yield f"data: {json.dumps(c, ensure_ascii=False)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})
