"""A deterministic engine that answers from a script: for tests, examples and dry runs of agents.

Replies are tokenised with a real tokenizer (SmolLM2's by default), so the token ids it reports
are exact: decoding ``token_ids`` gives the reply text back.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ...models import load_tokenizer
from ..chat_format import format_tool_calls
from ..structured import ResponseFormat, ResponseFormatError, check_grammar, text_fits, tool_names
from ..tokenizer import ByteTokenizer
from .base import Engine, GenRequest, GenResult

__all__ = ["Reply", "ScriptedEngine"]

#: A scripted reply: text, ``{"content": ..., "tool_calls": [{"name", "arguments"}]}``, or an
#: exception instance (raised, to exercise error handling).
Reply = Any


def reply_text(reply: Reply) -> str:
    """The text a model would have written for ``reply`` (tool calls as ``<tool_call>`` blocks).

    >>> print(reply_text({"tool_calls": [{"name": "calc", "arguments": {"expr": "2+2"}}]}))
    <tool_call>
    {"name": "calc", "arguments": {"expr": "2+2"}}
    </tool_call>
    """
    if isinstance(reply, str):
        return reply
    if isinstance(reply, dict):
        content = reply.get("content") or ""
        calls = reply.get("tool_calls") or []
        if not calls:
            return str(content)
        rendered = format_tool_calls(calls)
        return f"{content}\n{rendered}" if content else rendered
    raise TypeError(f"a scripted reply must be a str or a dict, got {type(reply).__name__}")


class ScriptedEngine(Engine):
    """Replies from a list (taken in order, cycling) or from ``replies(messages) -> reply``.

    ``tokenizer`` is a model name (default ``"smollm2-135m"``: its real tokenizer and chat
    template), ``"bytes"`` (a tiny byte-level tokenizer, instant to load) or a tokenizer object.
    Every reply token gets logprob ``logprob`` (default 0.0); an EOS token is appended when
    the reply ends naturally (``append_eos``), as a real model would emit it.

    A request with ``response_format`` gets its scripted reply when that reply fits the format
    (a JSON object; JSON valid under the schema; or tool calls, when tools are offered), and a
    :class:`~agentlightning_lite.serving.structured.ResponseFormatError` otherwise (the server
    answers a 400 naming ``response_format``): a script cannot be constrained, only checked.

    >>> engine = ScriptedEngine(["4", {"tool_calls": [{"name": "calc", "arguments": {"expr": "2+2"}}]}],
    ...                         tokenizer="bytes")
    >>> [r.text for r in engine.generate([GenRequest([1]), GenRequest([1])])][0]
    '4'
    >>> engine.generate([GenRequest([1])])[0].text  # the list cycles
    '4'
    """

    def __init__(
        self,
        replies: Iterable[Reply] | Callable[[list[dict[str, Any]]], Reply],
        tokenizer: Any = "smollm2-135m",
        model_name: str = "scripted",
        max_context: int = 8192,
        logprob: float = 0.0,
        append_eos: bool = True,
        cycle: bool = True,
        delay_s: float = 0.0,
    ) -> None:
        super().__init__()
        if callable(replies):
            self._fn: Callable[[list[dict[str, Any]]], Reply] | None = replies
            self._replies: Any = None
        else:
            items = list(replies)
            if not items:
                raise ValueError("ScriptedEngine needs at least one reply")
            self._fn = None
            self._replies = itertools.cycle(items) if cycle else iter(items)
        if isinstance(tokenizer, str):
            tokenizer = ByteTokenizer() if tokenizer == "bytes" else load_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_context = max_context
        self.logprob = float(logprob)
        self.append_eos = append_eos
        self.delay_s = delay_s
        self._next_lock = threading.Lock()

    def _next_reply(self, req: GenRequest) -> Reply:
        if self._fn is not None:
            messages = req.messages
            if messages is None:
                messages = [{"role": "user", "content": req.prompt or self.decode(req.prompt_token_ids)}]
            return self._fn(messages)
        with self._next_lock:
            try:
                return next(self._replies)
            except StopIteration:
                raise RuntimeError("ScriptedEngine ran out of replies") from None

    def _one(self, req: GenRequest) -> GenResult:
        reply = self._next_reply(req)
        if isinstance(reply, BaseException):
            raise reply
        text = reply_text(reply)
        fmt = req.response_format
        calls = isinstance(reply, dict) and bool(reply.get("tool_calls"))
        if fmt is not None and not (calls and req.tools) and not text_fits(fmt, text, tool_names(req.tools)):
            raise ResponseFormatError(
                f"the scripted reply {text[:200]!r} does not fit 'response_format' ({fmt.type}"
                + (f" {fmt.name!r}" if fmt.name else "")
                + "): ScriptedEngine replies from its script and cannot constrain it"
            )
        stop_reason: str | int | None = None
        finish = "stop"
        hits = sorted((text.find(s), s) for s in req.stop if s and s in text)
        if hits:  # cut at the earliest stop string, as a real engine would have stopped there
            text, stop_reason = text[: hits[0][0]], hits[0][1]
        ids = self.encode(text)
        if len(ids) > req.max_tokens:
            ids = ids[: req.max_tokens]
            text, finish, stop_reason = self.decode(ids), "length", None
        elif self.append_eos and stop_reason is None and self.eos_token_ids:
            if len(ids) < req.max_tokens:
                eos = min(self.eos_token_ids)
                ids = [*ids, eos]
                stop_reason = eos
            else:  # the budget ran out before the EOS a model would have written
                finish = "length"
        return GenResult(
            prompt_token_ids=list(req.prompt_token_ids),
            token_ids=ids,
            logprobs=[self.logprob] * len(ids),
            text=text,
            finish_reason=finish,
            top_logprobs=[[(t, self.logprob)] for t in ids] if req.top_logprobs else None,
            stop_reason=stop_reason,
            weights_version=self.version,
            adapter=self._adapter_of(req),
        )

    def check_response_format(
        self, fmt: ResponseFormat, tools: Sequence[dict[str, Any]] | None = None
    ) -> None:
        check_grammar(fmt, tool_names(tools))  # each reply is checked against it when generated

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        t0 = time.perf_counter()
        if self.delay_s:
            time.sleep(self.delay_s)
        results = [self._one(r) for r in requests]
        self._record_batch(requests, results, time.perf_counter() - t0)
        return results
