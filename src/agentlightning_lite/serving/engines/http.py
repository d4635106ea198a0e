"""An engine that generates through OpenAI-compatible inference servers over HTTP (vLLM, or a PolicyServer).

Our side applies the chat template and the tool format and sends the prompt as token ids to
``POST /v1/completions`` with ``return_token_ids`` and ``logprobs``; the server answers with the
reply's token ids and their logprobs, so every span holds exactly the tokens the model saw and
produced (no re-tokenisation anywhere). LoRA adapters are handed over with vLLM's runtime routes
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``, each weight version under its own name.

The subset of the HTTP API used is vLLM's (0.32-0.33); the project's own PolicyServer speaks it too,
and the ``vllm`` test group runs it against a real vLLM (its CPU build).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Engine, GenRequest, GenResult
from .contract import BackendError
from .http_backend import (
    Backend,
    adapter_directory,
    check_answer,
    completion_result,
    prompt_logprobs_of,
    sampling_settings,
    write_adapter,
)

logger = logging.getLogger(__name__)

__all__ = ["BackendError", "HTTPEngine"]


class HTTPEngine(Engine):
    """Generate through one or several OpenAI-compatible inference servers (vLLM's HTTP API subset).

    Args:
        urls: the servers' root URLs (``http://host:port``, no ``/v1``), or one URL.
        tokenizer: the model's tokenizer (a Hugging Face id or path, or a tokenizer object): our side
            renders chats and encodes prompts with it, so it must be the served model's.
        model: the served base model's name (default: the first model the first server lists).
        api_key: sent as ``Authorization: Bearer`` (vLLM's ``--api-key``, the PolicyServer's ``api_key``).
        lora: a peft adapter directory served from the start as the engine's own adapter
            (``"policy"``); ``adapters``: named ones, e.g. one per agent; ``routes``: which agent uses which.
        adapter_dir: where adapter weights given as a state dict are written (default: a temp dir);
            the servers read adapters from the file system, so it must be visible to them.
        max_context: the context length (default: ``max_model_len`` from ``/v1/models``, else 8192).
        timeout_s: how long one request may take.
        revive_after_s: how often the failed servers' ``/health`` is asked (one that answers serves again).

    Several servers: a rollout's calls (``GenRequest.session``) stick to one server (its prefix cache);
    new rollouts, and calls without a session, go to the server with the fewest requests in flight.
    A server that cannot be reached fails its requests with a :class:`BackendError` naming it, is left
    out while the others serve, and serves again once its ``/health`` answers (asked every
    ``revive_after_s``).

    LoRA hand-over: :meth:`update_weights` loads the new adapter under a new version name
    (``policy-v3``); requests admitted from then on use it, on every server (each loads a version
    before its first request with it); requests in flight finish on their version; a version no request
    uses any more is unloaded. Each result (and so each span) records its ``weights_version`` and
    ``adapter``. Streaming to the agent is the PolicyServer's: it chunks the final reply.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        tokenizer: Any,
        model: str | None = None,
        api_key: str | None = None,
        lora: str | os.PathLike[str] | None = None,
        adapters: Mapping[str, str | os.PathLike[str]] | None = None,
        routes: Mapping[str, str | None] | None = None,
        adapter_dir: str | None = None,
        max_context: int | None = None,
        model_name: str | None = None,
        timeout_s: float = 600.0,
        revive_after_s: float = 5.0,
        max_connections: int = 256,
    ) -> None:
        super().__init__()
        import httpx

        self._httpx = httpx
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("HTTPEngine needs at least one server URL")
        self.backends = [Backend(u.rstrip("/").removesuffix("/v1")) for u in urls]
        if isinstance(tokenizer, (str, os.PathLike)):
            from ..tokenizer import ByteTokenizer

            if tokenizer == "bytes":  # the byte-level test tokenizer
                tokenizer = ByteTokenizer()
            else:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.tokenizer = tokenizer
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.revive_after_s = float(revive_after_s)
        # absolute now: a server resolves a relative path against its own working directory (vLLM then
        # tries it as a Hugging Face repository id), and this process may change directory later
        self._adapter_dir = None if adapter_dir is None else os.path.abspath(adapter_dir)
        self._paths: dict[str, str] = {}  # adapter version name -> directory
        self._current: dict[str, str] = {}  # adapter name -> its current version name
        self._uses: dict[str, int] = {}  # version name -> requests in flight with it
        self._retired: set[str] = set()  # replaced versions, unloaded after their last request
        self._issued: set[str] = set()  # every version name given out (a name is never reused)
        self._sessions: OrderedDict[str, Backend] = OrderedDict()  # session -> its server (LRU)
        self._select_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agl-http-engine", daemon=True)
        self._thread.start()
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

        async def make_client() -> Any:
            for b in self.backends:
                b.lock = asyncio.Lock()
            return httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=10.0), limits=limits, headers=headers
            )

        self._client = self._run(make_client())
        self._prober = asyncio.run_coroutine_threadsafe(self._probe_dead(), self._loop)
        info = self._models(model)
        self.served_model = model or info.get("id") or "model"
        self.model_name = model_name or self.served_model
        self.max_context = int(max_context or info.get("max_model_len") or 8192)
        named = dict(adapters or {})
        if lora is not None:
            if "policy" in named:
                raise ValueError("lora= is the adapter named 'policy': do not name another one so")
            named = {"policy": lora, **named}
        for name, path in named.items():
            self.add_adapter(name, path)
        if routes is not None:
            self.set_routes(routes)

    # -- plumbing -------------------------------------------------------------------------
    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _models(self, wanted: str | None) -> dict[str, Any]:
        """The first server's entry for ``wanted`` (or its first model) in ``GET /v1/models``."""
        for b in self.backends:
            try:
                data = self._run(self._get(b, "/v1/models"), timeout=30)["data"]
            except Exception as exc:  # try the next server
                logger.warning("GET %s/v1/models failed: %s", b.url, exc)
                continue
            for entry in data:
                if wanted is None or entry.get("id") == wanted:
                    return dict(entry)
            return {}
        if wanted is None:
            raise BackendError(
                f"no inference server answered GET /v1/models at {[b.url for b in self.backends]}: "
                "are they running, and is the URL http://host:port (without /v1)?"
            )
        return {}

    async def _probe_dead(self) -> None:
        """Every ``revive_after_s``, ask the failed servers' ``/health``; one that answers serves again."""
        while True:
            await asyncio.sleep(self.revive_after_s)
            for b in self.backends:
                if b.dead_since is None:
                    continue
                try:
                    r = await self._client.get(b.url + "/health", timeout=5)
                except (self._httpx.TransportError, OSError):
                    continue
                if r.status_code == 200:
                    b.loaded.clear()  # a restarted server has none of our adapters
                    b.dead_since = None
                    logger.warning("inference server %s answers again", b.url)

    async def _get(self, b: Backend, path: str) -> Any:
        r = await self._client.get(b.url + path)
        check_answer(b, path, r)
        return r.json()

    async def _post(self, b: Backend, path: str, body: dict[str, Any]) -> Any:
        try:
            r = await self._client.post(b.url + path, json=body)
        except self._httpx.TimeoutException as exc:  # slow, not dead: this request alone fails
            raise BackendError(
                f"inference server {b.url} did not answer {path} within {self.timeout_s:.0f} s "
                f"({type(exc).__name__}); raise timeout_s for longer replies"
            ) from exc
        except (self._httpx.TransportError, OSError) as exc:
            b.dead_since, b.error = time.monotonic(), f"{type(exc).__name__}: {exc}"
            logger.warning("inference server %s failed: %s", b.url, b.error)
            raise BackendError(f"inference server {b.url} is unreachable ({b.error}); {path} failed") from exc
        check_answer(b, path, r)
        return r

    def _pick(self, session: str | None) -> Backend:
        """The server for a request: its session's, else the live one with the fewest in flight."""
        with self._select_lock:
            if session is not None:
                b = self._sessions.get(session)
                if b is not None and b.dead_since is None:
                    self._sessions.move_to_end(session)
                    b.in_flight += 1
                    return b
            live = [b for b in self.backends if b.dead_since is None]
            if not live:
                raise BackendError(
                    "every inference server failed: "
                    + "; ".join(f"{b.url}: {b.error}" for b in self.backends)
                )
            b = min(live, key=lambda x: x.in_flight)
            b.in_flight += 1
            if session is not None:
                self._sessions[session] = b
                while len(self._sessions) > 100_000:
                    self._sessions.popitem(last=False)
            return b

    @property
    def load(self) -> dict[str, int]:
        """Requests in flight per server URL."""
        return {b.url: b.in_flight for b in self.backends}

    @property
    def session_servers(self) -> dict[str, str]:
        """Which server each recent session (rollout) is pinned to."""
        with self._select_lock:
            return {s: b.url for s, b in self._sessions.items()}

    # -- adapters -------------------------------------------------------------------------
    @property
    def adapters(self) -> list[str]:
        return list(self._current)

    def _own_adapter(self) -> str | None:
        return next(iter(self._current), None)

    def adapter_version(self, name: str) -> str:
        """The name the servers know adapter ``name``'s current weights by (``policy-v3``)."""
        return self._current[name]

    def add_adapter(
        self, name: str, lora: Any, trainable: bool | None = None, named_only: bool = False
    ) -> None:
        """Serve the peft adapter in directory ``lora`` as ``name`` (loaded on each server before its
        first request with it)."""
        if not isinstance(lora, (str, os.PathLike)):
            raise TypeError(f"{type(self).__name__} serves saved adapters: pass a directory, not {lora!r}")
        if not name or "." in name or "@" in name:
            raise ValueError(f"an adapter name must be non-empty, without '.' or '@', got {name!r}")
        with self.lock:
            if name in self._current:
                raise ValueError(f"adapter {name!r} already exists")
            self._set_version(name, adapter_directory(str(lora)))

    def remove_adapter(self, name: str) -> None:
        """Stop serving adapter ``name``: requests admitted with it finish on it, then every server
        unloads it (``KeyError`` when the engine has no such adapter)."""
        with self.lock:
            if name not in self._current:
                raise KeyError(f"unknown adapter {name!r}: this engine serves {self.adapters}")
            vname = self._current.pop(name)
            self._retired.add(vname)
            if not self._uses.get(vname):
                self._unload_soon(vname)

    def preload_adapter(self, name: str) -> None:
        """Load adapter ``name``'s current version on every live server now (else each loads it before
        its first request with it), so a server that refuses it says so here: a :class:`BackendError`
        naming the server and its reason."""
        with self.lock:
            if name not in self._current:
                raise KeyError(f"unknown adapter {name!r}: this engine serves {self.adapters}")
            vname = self._current[name]
            path = self._paths[vname]
        for b in self.backends:
            if b.dead_since is None:
                self._run(self._ensure(b, vname, path), timeout=self.timeout_s)

    def _set_version(self, name: str, path: str) -> None:
        vname = f"{name}-v{self.version}"
        k = 1
        while vname in self._issued:  # an adapter removed and added again: never reuse a version's name
            vname, k = f"{name}-v{self.version}-{k}", k + 1
        self._issued.add(vname)
        old = self._current.get(name)
        self._paths[vname] = path
        self._current[name] = vname
        if old is not None and old != vname:
            self._retired.add(old)
            if not self._uses.get(old):
                self._unload_soon(old)

    def _unload_soon(self, vname: str) -> None:
        self._retired.discard(vname)
        self._paths.pop(vname, None)
        asyncio.run_coroutine_threadsafe(self._unload(vname), self._loop)

    async def _unload(self, vname: str) -> None:
        for b in self.backends:
            if vname not in b.loaded:
                continue
            b.loaded.discard(vname)
            try:  # best effort: a server that cannot unload keeps a slot used until it evicts it
                await self._post(b, "/v1/unload_lora_adapter", {"lora_name": vname})
            except BackendError as exc:
                logger.warning("unloading %s: %s", vname, exc)

    def _write_adapter(self, state: Mapping[str, Any], name: str) -> str:
        self._adapter_dir = os.path.abspath(self._adapter_dir or tempfile.mkdtemp(prefix="agl-http-lora-"))
        path = os.path.join(self._adapter_dir, name, f"v{self.version + 1}")
        return write_adapter(state, path, self._paths[self._current[name]])

    def update_weights(self, source: Any, adapter: str | None = None) -> int:
        """Serve new adapter weights from the next request on; returns the new ``version``.

        ``source``: a saved peft adapter directory, or the adapter's state dict (written beside a copy
        of its config). ``adapter`` names which adapter it replaces (default: the engine's first). The
        new version is loaded on every live server now (a server that fails is left out and loads it
        before its next request)."""
        with self.lock:
            name = adapter or self._own_adapter()
            if name is None:
                raise ValueError(f"{type(self).__name__} serves no adapter: pass lora= or adapters= first")
            if name not in self._current:
                raise KeyError(f"unknown adapter {name!r}: this engine serves {self.adapters}")
            if isinstance(source, Mapping):
                if not source or not all("lora_" in str(k) for k in source):
                    raise ValueError(
                        f"{type(self).__name__} hands over LoRA adapters only (a peft adapter state dict: "
                        "every key a lora_A/lora_B weight); full-weight updates are not handed over"
                    )
                path = self._write_adapter(source, name)
            elif isinstance(source, (str, os.PathLike)):
                path = adapter_directory(str(source))
            else:
                raise TypeError(
                    f"{type(self).__name__}.update_weights takes an adapter directory or a state dict"
                )
            self.version += 1
            self._set_version(name, path)
            vname = self._current[name]
        for b in self.backends:
            if b.dead_since is None:
                try:
                    self._run(self._ensure(b, vname, path), timeout=self.timeout_s)
                except BackendError as exc:
                    logger.warning("%s (it loads %s before its next request)", exc, vname)
        return self.version

    async def _ensure(self, b: Backend, vname: str, path: str) -> None:
        if vname in b.loaded:
            return
        assert b.lock is not None
        async with b.lock:
            if vname in b.loaded:
                return
            body = {"lora_name": vname, "lora_path": path}
            try:
                try:
                    await self._post(b, "/v1/load_lora_adapter", body)
                except BackendError as exc:
                    if exc.status != 400 or "already" not in str(exc):
                        raise
                    # a name left loaded by an earlier run on a server that outlived it: replace its weights
                    await self._post(b, "/v1/unload_lora_adapter", {"lora_name": vname})
                    await self._post(b, "/v1/load_lora_adapter", body)
            except BackendError as exc:
                if exc.status is None:  # unreachable or slow: the message already says so
                    raise
                raise BackendError(
                    f"inference server {b.url} refused to load adapter {vname} from {path} "
                    f"(HTTP {exc.status} to {exc.path}): {exc.reason}",
                    exc.status,
                    exc.path,
                    exc.reason,
                ) from exc
            b.loaded.add(vname)

    # -- generation -----------------------------------------------------------------------
    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def start_request(self, request: GenRequest) -> concurrent.futures.Future[GenResult]:
        """Send one request; cancelling the future closes its connection (vLLM then aborts it)."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        with self.lock:  # the adapter version is fixed at admission
            name = self._adapter_of(request)
            if name is not None and name not in self._current:
                raise KeyError(f"unknown adapter {name!r}: this engine serves {self.adapters}")
            vname = None if name is None else self._current[name]
            path = None if vname is None else self._paths[vname]
            version = self.version
            if vname is not None:
                self._uses[vname] = self._uses.get(vname, 0) + 1
        try:
            b = self._pick(request.session)
        except BaseException:
            self._release(vname)
            raise
        fut = asyncio.run_coroutine_threadsafe(
            self._generate(b, request, name, vname, path, version), self._loop
        )
        fut.add_done_callback(lambda _: self._done(b, vname))  # also when cancelled before it started
        return fut

    def _done(self, b: Backend, vname: str | None) -> None:
        with self._select_lock:
            b.in_flight -= 1
        self._release(vname)

    def _release(self, vname: str | None) -> None:
        if vname is None:
            return
        with self.lock:
            self._uses[vname] -= 1
            if self._uses[vname] <= 0:
                del self._uses[vname]
                if vname in self._retired:
                    self._unload_soon(vname)

    async def _generate(
        self,
        b: Backend,
        req: GenRequest,
        name: str | None,
        vname: str | None,
        path: str | None,
        version: int,
    ) -> GenResult:
        t0 = time.perf_counter()
        if vname is not None and path is not None:
            await self._ensure(b, vname, path)
        body: dict[str, Any] = {
            "model": vname or self.served_model,
            "prompt": list(req.prompt_token_ids),
            "max_tokens": int(req.max_tokens),
            **sampling_settings(req),
            "logprobs": int(req.top_logprobs),  # 0: the sampled token's logprob only
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if req.stop:
            body["stop"] = list(req.stop)
        if req.seed is not None:
            body["seed"] = int(req.seed)
        fmt = req.response_format
        if fmt is not None:  # enforced by the server (vLLM's structured outputs)
            body["response_format"] = {"type": fmt.type}
            if fmt.type == "json_schema":
                spec = {"name": fmt.name or "response", "schema": fmt.json_schema()}
                body["response_format"]["json_schema"] = spec | (
                    {} if fmt.strict is None else {"strict": fmt.strict}
                )
        r = await self._post(b, "/v1/completions", body)
        result = completion_result(b, req, r.json(), version, name)
        self._record_batch([req], [result], time.perf_counter() - t0)
        return result

    def prompt_logprobs(
        self, prompt_token_ids: Sequence[int], adapter: str | None = None
    ) -> list[float | None]:
        """The logprob of each of ``prompt_token_ids`` given the ones before it (``None`` for the
        first), as the server scores it under adapter ``adapter`` (``None``: the base model): vLLM's
        ``prompt_logprobs``, from the weights it samples with.

        >>> engine.prompt_logprobs([1, 15, 27])  # doctest: +SKIP
        [None, -9.1, -3.2]
        """
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            return []
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        with self.lock:
            if adapter is not None and adapter not in self._current:
                raise KeyError(f"unknown adapter {adapter!r}: this engine serves {self.adapters}")
            vname = None if adapter is None else self._current[adapter]
            path = None if vname is None else self._paths[vname]
            if vname is not None:
                self._uses[vname] = self._uses.get(vname, 0) + 1
        try:
            b = self._pick(None)
            try:
                fut = asyncio.run_coroutine_threadsafe(self._score(b, prompt, vname, path), self._loop)
                try:
                    return list(fut.result(self.timeout_s + 10))
                except concurrent.futures.TimeoutError:
                    fut.cancel()  # not left running on an adapter released below
                    waited = self.timeout_s + 10
                    raise BackendError(
                        f"inference server {b.url} did not score the prompt within {waited:.0f} s"
                    ) from None
            finally:
                with self._select_lock:
                    b.in_flight -= 1
        finally:
            self._release(vname)

    async def _score(
        self, b: Backend, prompt: list[int], vname: str | None, path: str | None
    ) -> list[float | None]:
        if vname is not None and path is not None:
            await self._ensure(b, vname, path)
        body = {
            "model": vname or self.served_model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,  # the logprob of each prompt token itself (no alternatives)
        }
        r = await self._post(b, "/v1/completions", body)
        return prompt_logprobs_of(b, prompt, r.json())

    def check_response_format(self, fmt: Any, tools: Sequence[dict[str, Any]] | None = None) -> None:
        """Accepted: the server enforces it (an error it answers fails that request). With tools offered,
        the reply is held to the format alone (the server does not see the tools)."""
        return None

    def cancel_request(self, future: concurrent.futures.Future[GenResult]) -> bool:
        return future.cancel()

    def health(self) -> dict[str, str]:
        """``GET /health`` of every server: ``"ok"`` or what failed."""

        async def one(b: Backend) -> str:
            try:
                r = await self._client.get(b.url + "/health", timeout=10)
                return "ok" if r.status_code == 200 else f"HTTP {r.status_code}"
            except (self._httpx.TransportError, OSError) as exc:
                return f"{type(exc).__name__}: {exc}"

        async def every() -> list[str]:
            return list(await asyncio.gather(*(one(b) for b in self.backends)))

        return dict(zip((b.url for b in self.backends), self._run(every(), timeout=30), strict=True))

    def close(self) -> None:
        if self._closed:
            return
        super().close()

        async def shutdown() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._client.aclose()

        try:
            self._run(shutdown(), timeout=30)
        except Exception:
            logger.debug("HTTPEngine clean-up step failed (best effort)", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def describe(self) -> str:
        """A one-line description: servers, adapters and version."""
        return json.dumps(
            {"servers": [b.url for b in self.backends], "adapters": self._current, "version": self.version}
        )
