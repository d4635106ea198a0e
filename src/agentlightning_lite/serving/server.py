"""The PolicyServer: an OpenAI-compatible HTTP server that records every call as an ``llm`` span.

Routes (each also under ``/rollout/<rollout_id>``, ``/rollout/<rollout_id>/agent/<agent>`` and the
lease forms ``/rollout/<rollout_id>/lease/<token>[/agent/<agent>]``):
``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses`` (OpenAI Responses),
``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic Messages), ``GET /v1/models``;
plus ``GET /health``, ``GET /version`` and vLLM's runtime LoRA routes ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``.
The handlers live in :mod:`.routes` (one module per route family); this module holds the server's
life cycle and the app.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import AGLError, UnknownRolloutError
from ..store.base import Store
from ..store.memory import MemoryStore
from .context import ServingContext
from .engines.batching import describe_running
from .engines.contract import ServingEngine
from .errors import APIError, api_error_of, internal_error
from .llm import LLM
from .parsers import auto_parser
from .reply import ReplyParser, special_markers
from .routes import chat, completions, lora, messages, meta, responses
from .routes.request import AGENT_HEADER, PARENT_HEADER, ROLLOUT_HEADER
from .settings import ServingOptions, ServingSettings
from .state import RecentDict, RolloutState
from .threaded import ThreadedUvicorn

if TYPE_CHECKING:  # the keyword arguments' types, for the type checker (Python 3.10 has no typing.Unpack)
    from typing_extensions import Unpack

__all__ = ["AGENT_HEADER", "PARENT_HEADER", "ROLLOUT_HEADER", "APIError", "PolicyServer", "ServingSettings"]

logger = logging.getLogger(__name__)

Handler = Callable[[ServingContext, Request], Awaitable[Response]]


class PolicyServer(ThreadedUvicorn):
    """Serve an engine over the OpenAI API and record each call, with its tokens, in a store.

    The server runs in a background thread of this process (``with PolicyServer(...) as server``
    or ``start()``/``stop()``); ``port=0`` picks a free port. Hand agents ``server.llm(rollout_id)``:
    its ``base_url`` (``http://host:port/rollout/<id>/v1``) routes every call to that rollout.

    Settings: ``PolicyServer(engine, store, settings=ServingSettings(...))`` is the preferred form (see
    :class:`~.settings.ServingSettings` for every field: host, port, key, limits, loop, parsers...).
    Each field is also taken as a keyword, applied over ``settings`` (``PolicyServer(engine, store,
    port=8000)``); ``server.settings`` holds what the server runs with.

    >>> from agentlightning_lite.serving import PolicyServer, ServingSettings, engines
    >>> engine = engines.ScriptedEngine(["ok"], tokenizer="bytes")
    >>> server = PolicyServer(engine, settings=ServingSettings(api_key="k", max_n=4), port=0)
    >>> server.settings.api_key, server.settings.max_n, server.settings.host
    ('k', 4, '127.0.0.1')

    Recording: each generated choice becomes one ``llm`` span (``n=3`` gives three spans sharing
    ``attributes["request_id"]``) with ``input`` = the request messages (the prompt string for
    ``/v1/completions``), ``output`` = the assistant message dict (the text for completions),
    the engine's own ``prompt_token_ids``/``response_token_ids``/``response_logprobs``, and
    attributes ``policy``, ``server``, ``usage``, ``params``, ``tools``, ``finish_reason``,
    ``prompt_text``, ``weights_version`` and ``adapter`` (the LoRA adapter that served the call,
    ``None`` for the base model), and ``response_format`` when the request asked for JSON (enforced
    by the engine, see :mod:`.structured`; a format the engine cannot honour gets a 400). The agent
    comes from the URL (``/rollout/<id>/agent/<name>/v1``), else the ``X-Agl-Agent`` header, else a
    model name ``<model>@<agent>``; an engine with several adapters serves each agent with its own
    (``engine.set_routes``). Calls to plain ``/v1`` (no rollout; also settable with the
    ``X-Agl-Rollout-Id`` header) each get their own implicit rollout of mode ``trace``
    (metadata ``{"implicit": True}``), or are not recorded with ``record_unrouted=False``.
    Spans are written before the response is sent; ``flush=True`` also commits them at once
    (for readers in other processes; otherwise the store's batching decides when).

    ``loop``: uvicorn's event loop, ``"auto"`` (uvloop when installed, else asyncio), ``"asyncio"``
    or ``"uvloop"``; each answers without Nagle's delay (``TCP_NODELAY`` on every connection).

    Errors: a body over ``max_body_bytes`` (413), malformed JSON, unknown model (404), unknown
    rollout (404), bad parameters and context overflow get a 4xx with an OpenAI error body and
    record nothing; an engine failure gets a 500 and an ``error`` span (behind the HTTP engine, a
    400/413/422 of the inference server to the generation reaches the agent as that status, and a
    server that failed as a 502). Sampling: ``temperature``, ``top_p``, ``presence_penalty`` and
    ``frequency_penalty`` (OpenAI's), and vLLM's ``top_k``, ``min_p`` and ``repetition_penalty``,
    applied by the engine; which logprobs are recorded is the engine's ``logprobs_mode``. A training
    rollout's (mode ``train``) request for truncated sampling (``top_p < 1``, ``top_k``, ``min_p``)
    is served from the full tempered distribution, the one the trainer scores, and records what it
    asked for as ``params.truncation_ignored`` (``truncated_sampling="ignore"``, the default; a warning
    the first time); ``"refuse"`` answers it with a 400 instead, ``"keep"`` samples as asked (the
    recorded logprobs are then not those of the distribution sampled from, see docs/training.md).
    Evaluation (``val``), ``trace`` and unrouted calls always sample as asked. Streaming
    (``stream=true``) sends OpenAI chunks once the engine has produced the whole reply, then
    ``data: [DONE]``: the reply is read token by token by the reply parser's stream, so each tool
    call comes as a delta where it closes, between the content around it.

    Other API dialects, one capture point: ``/v1/responses`` (OpenAI Responses, e.g. Codex or the
    Agents SDK's default model) and ``/v1/messages`` (Anthropic Messages, e.g. Claude Code or
    ``llm.anthropic_client()``; errors in Anthropic's shape) convert the request to chat messages and
    tools and serve it through the same engine path, one ``llm`` span per call (``attributes["api"]``
    names the dialect), then answer in the dialect's shape and SSE events (see
    :mod:`.openai_responses`, :mod:`.anthropic_messages`). The API key is taken as
    ``Authorization: Bearer`` or ``x-api-key``. ``clamp_max_tokens``: ``None`` (default) cuts a
    ``max_tokens`` larger than the context leaves to the room left on those two routes (harnesses ask
    for 32000 and exit on a 400; ``params.max_tokens_requested`` records the ask) and keeps OpenAI's
    400 on chat and text completions; ``True`` cuts on every route, ``False`` on none.

    Replies are read by vLLM's parsers of the same names (:mod:`.parsers`): ``tool_parser`` (``hermes``,
    ``qwen3_coder``, ``llama3_json``, ``pythonic``, ``mistral``, ``deepseek_v31``, ``glm45``,
    ``kimi_k2``, ``openai``) and ``reasoning_parser`` (``qwen3``, ``deepseek_r1``, ``mistral``,
    ``openai_gptoss``; ``None``: no reasoning); ``"auto"`` (the default of both) reads the family from
    the engine's chat template (:func:`.parsers.detect`; a template without tool markers gets
    ``hermes``, what the tool prompt asks for) and logs its pick. Reasoning found goes to the message's
    ``reasoning_content``; each ``llm`` span records ``tool_parser`` and ``reasoning_parser``.

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

    _label = "PolicyServer"
    _thread_name = "agl-policy-server"
    _backlog = 2048

    def __init__(
        self,
        engine: ServingEngine,
        store: Store | None = None,
        settings: ServingSettings | None = None,
        **options: Unpack[ServingOptions],
    ) -> None:
        if settings is not None and not isinstance(settings, ServingSettings):
            raise TypeError(
                f"settings must be a ServingSettings, got {type(settings).__name__} {settings!r} (the other "
                "settings are keywords: PolicyServer(engine, store, host=..., port=...))"
            )
        #: the server's settings: ``settings`` with the keyword ``options`` applied over it
        self.settings: ServingSettings = (settings if settings is not None else ServingSettings()).replace(
            **options
        )
        s = self.settings
        super().__init__(s.host, s.port, s.log_level)
        self.engine = engine
        self.store: Store = store if store is not None else MemoryStore()
        self.model_name = s.model_name or engine.model_name
        self.served_names = {self.model_name, engine.model_name, *s.aliases}
        #: what the server knows of the rollouts it serves (the last 10,000 of each kind): known rollouts,
        #: their modes, engine requests in flight, cancellations, rollout keys, warnings given once
        self.rollouts = RolloutState(10_000)
        #: Responses API: the conversations of responses kept for ``previous_response_id`` (the last 1,000)
        self.responses: RecentDict[list[dict[str, Any]]] = RecentDict(1000)
        #: how the served model writes tool calls (and reasoning) in its replies (see :mod:`.parsers`)
        self.reply_parser: ReplyParser = auto_parser(engine.chat_template, s.tool_parser, s.reasoning_parser)
        #: the reply parser's markers (``<tool_call>``, ``<think>``...) that are special tokens of the
        #: served tokenizer, id -> text: replies are decoded keeping them (other special tokens dropped)
        self.reply_markers = special_markers(engine, self.reply_parser)
        if self.reply_markers:
            logger.info(
                "reply markers %s are special tokens of the tokenizer: replies are read decoded with them "
                "(other special tokens dropped)",
                ", ".join(sorted(self.reply_markers.values())),
            )
        #: called as ``rollout_guard(rollout_id, lease_tokens)`` before a call routed to a rollout is
        #: served; raises (an ``AGLError``, such as a ``LeaseError``) to refuse it. The runner routes
        #: set it so that a rollout claimed by a runner takes calls only with its claim's lease token.
        self.rollout_guard: Callable[[str, list[str]], None] | None = None
        #: adapters loaded over HTTP (``/v1/load_lora_adapter``): name -> directory; a request whose
        #: ``model`` names one is served by it
        self.lora_adapters: dict[str, str] = {}
        self.lora_lock = asyncio.Lock()
        self.app = self._build_app()

    # -- the settings, as the attributes they were read as (read-only) ------------------------
    @property
    def api_key(self) -> str | None:
        """``settings.api_key``."""
        return self.settings.api_key

    @property
    def default_max_tokens(self) -> int:
        """``settings.default_max_tokens``."""
        return self.settings.default_max_tokens

    @property
    def max_n(self) -> int:
        """``settings.max_n``."""
        return self.settings.max_n

    @property
    def record_unrouted(self) -> bool:
        """``settings.record_unrouted``."""
        return self.settings.record_unrouted

    @property
    def flush(self) -> bool:
        """``settings.flush``."""
        return self.settings.flush

    @property
    def max_body_bytes(self) -> int:
        """``settings.max_body_bytes``."""
        return self.settings.max_body_bytes

    @property
    def loop(self) -> str:
        """``settings.loop``."""
        return self.settings.loop

    @property
    def clamp_max_tokens(self) -> bool | None:
        """``settings.clamp_max_tokens``."""
        return self.settings.clamp_max_tokens

    @property
    def truncated_sampling(self) -> str:
        """``settings.truncated_sampling``."""
        return self.settings.truncated_sampling

    # -- lifecycle (start, stop, serve_forever, port, url, running: ThreadedUvicorn) -------------
    @property
    def base_url(self) -> str:
        """The OpenAI base URL of unrouted calls: ``http://host:port/v1``."""
        return f"{self.url}/v1"

    def _config_options(self) -> dict[str, Any]:
        return {"timeout_keep_alive": 30, "loop": self.loop}

    def _on_started(self) -> None:
        logger.info("PolicyServer serving %s at %s", self.model_name, self.base_url)

    def __repr__(self) -> str:
        where = self.base_url if self._port is not None else "not started"
        return f"PolicyServer({self.model_name!r}, {where})"

    # -- endpoints for agents -------------------------------------------------------------
    def llm(self, rollout_id: str | None = None, agent: str | None = None) -> LLM:
        """The endpoint for one rollout (and optionally one agent of it).

        Raises :class:`~agentlightning_lite.errors.UnknownRolloutError` (a ``KeyError``) when the
        store has no such rollout.
        """
        root = self.url
        if rollout_id is not None:
            if not self.rollouts.known(rollout_id) and self.store.get_rollout(rollout_id) is None:
                raise UnknownRolloutError(
                    rollout_id, f"unknown rollout {rollout_id!r}: start it in the store first"
                )
            self.rollouts.remember(rollout_id)
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
            rollout_key=self.rollout_key(rollout_id) if self.api_key and rollout_id is not None else None,
        )

    def rollout_key(self, rollout_id: str) -> str:
        """A key that authorises model calls routed to ``rollout_id`` and nothing else (not another
        rollout, not unrouted calls, not the LoRA or runner routes): what a program run for one rollout
        is given instead of the server's key (``agl.CommandAgent`` does). It is an HMAC of the rollout
        id under a secret of this server, so it needs no storage and ends with the server. Only
        checked when the server has an ``api_key`` (without one nothing is).

        >>> from agentlightning_lite.serving import PolicyServer, engines
        >>> server = PolicyServer(engines.ScriptedEngine(["ok"]), api_key="k")
        >>> server.rollout_key("r1") == server.rollout_key("r1") != server.rollout_key("r2")
        True
        """
        return self.rollouts.key(rollout_id)

    def clamps(self, api: str) -> bool:
        """Whether a ``max_tokens`` larger than the context leaves is cut to fit (else a 400) on the
        route of ``api``: ``clamp_max_tokens=None`` (the default) clamps on the Responses and Messages
        routes (what harnesses speak) and keeps OpenAI's 400 on chat and text completions;
        ``True``/``False`` clamps on every route / on none."""
        if self.clamp_max_tokens is None:
            return api in ("responses", "messages")
        return self.clamp_max_tokens

    def lora_adapter_of(self, body: dict[str, Any]) -> str | None:
        """The adapter a request's ``model`` names (one loaded over HTTP), else ``None``."""
        model = body.get("model")
        return model if isinstance(model, str) and model in self.lora_adapters else None

    def cancel_rollout(self, rollout_id: str) -> int:
        """Cancel the engine requests of ``rollout_id`` in flight now (its rollout timed out).

        Requests still queued are dropped and those decoding stop at their next step (``HFEngine``);
        their clients get a 409 ``rollout_cancelled``, and so do later requests of the rollout (the
        last 10,000 cancelled rollouts are remembered: the set stays bounded over a long run).
        Returns how many requests were cancelled.
        """
        return sum(1 for f in self.rollouts.cancel(rollout_id) if self.engine.cancel(f))

    def running_replies(self, rollout_id: str) -> str | None:
        """One line naming ``rollout_id``'s replies the engine is generating now, with their token
        counts so far and how long they have run (``None``: none, or the engine does not tell).

        >>> server.running_replies(ro.id)  # doctest: +SKIP
        '1 reply still generating: chatcmpl-3 (rollout ro-7): 412 tokens so far (prompt 120) in 95.2 s'
        """
        mine = [r for r in self.engine.running() if r.session == rollout_id]
        return describe_running(mine) if mine else None

    # -- app ------------------------------------------------------------------------------
    def _handler(self, fn: Handler) -> Callable[[Request], Awaitable[Response]]:
        ctx: ServingContext = self  # the routes see the server through this protocol alone

        async def handle(request: Request) -> Response:
            try:
                return await fn(ctx, request)
            except (APIError, AGLError, HTTPException):
                raise  # answered by their exception handlers (a 4xx, or a deliberate 5xx)
            except Exception as exc:  # a bug: a generic 500 (answered here, so the connection stays)
                raise internal_error(f"{request.method} {request.url.path}", exc) from None

        return handle

    def extra_routes(self) -> list[BaseRoute]:
        """Routes mounted beside the OpenAI ones (none here; subclasses and extensions add theirs)."""
        return []

    def _build_app(self) -> Starlette:
        routes: list[BaseRoute] = []
        for prefix in (
            "",
            "/rollout/{rollout_id}",
            "/rollout/{rollout_id}/agent/{agent}",
            "/rollout/{rollout_id}/lease/{lease}",
            "/rollout/{rollout_id}/lease/{lease}/agent/{agent}",
        ):
            routes += [
                Route(
                    prefix + "/v1/chat/completions", self._handler(chat.chat_completions), methods=["POST"]
                ),
                Route(prefix + "/v1/completions", self._handler(completions.completions), methods=["POST"]),
                Route(prefix + "/v1/responses", self._handler(responses.responses), methods=["POST"]),
                Route(prefix + "/v1/messages", self._handler(messages.messages), methods=["POST"]),
                Route(
                    prefix + "/v1/messages/count_tokens",
                    self._handler(messages.count_tokens),
                    methods=["POST"],
                ),
                Route(prefix + "/v1/models", self._handler(meta.models), methods=["GET"]),
            ]
        routes.append(Route("/health", self._handler(meta.health), methods=["GET"]))
        routes.append(Route("/version", self._handler(lora.version), methods=["GET"]))
        for path, fn in (
            ("/v1/load_lora_adapter", lora.load_lora_adapter),
            ("/v1/unload_lora_adapter", lora.unload_lora_adapter),
        ):
            routes.append(Route(path, self._handler(fn), methods=["POST"]))
        routes += self.extra_routes()

        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            code = "not_found" if exc.status_code == 404 else None
            msg = f"{request.method} {request.url.path}: {exc.detail}"
            return APIError(exc.status_code, msg, code=code).response()

        async def api_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, APIError)
            return exc.response()

        async def agl_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, AGLError)
            return api_error_of(exc).response()

        async def unexpected(request: Request, exc: Exception) -> Response:
            return internal_error(f"{request.method} {request.url.path}", exc).response()

        return Starlette(
            routes=routes,
            exception_handlers={
                HTTPException: http_error,
                APIError: api_error,
                AGLError: agl_error,
                Exception: unexpected,
            },
        )
