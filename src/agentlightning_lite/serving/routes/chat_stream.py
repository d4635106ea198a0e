"""A streamed chat reply: the reply's text, token by token, read by the reply parser's stream (what each
piece makes certain: content, reasoning, each tool call once whole), and the Chat Completions chunks
that carry it, each with the logprobs of the tokens it is made of."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..context import ServingContext
from ..engines.base import GenResult
from ..params import Params
from ..parsers import ParsedReply, ReplyDelta, StreamMismatchError
from ..reply import decode_keeping
from .calls import pieces

if TYPE_CHECKING:
    from .chat import ChatRun

logger = logging.getLogger(__name__)

#: a streamed reply: what each piece of its text made certain, with the tokens [start, end) of that piece
Streamed = list[tuple[ReplyDelta, int, int]]

#: the most pieces a reply is read in (each read looks at the reply so far: longer replies, longer pieces)
MAX_PIECES = 256


def reply_decoder(ctx: ServingContext) -> Callable[[Sequence[int]], str]:
    """How the reply parser reads token ids as text: with every special token for a parser whose
    markers are special tokens, with the parser's marker tokens only where the served tokenizer marks
    them special (``ctx.reply_markers``), else a plain decode."""
    engine = ctx.engine
    if ctx.reply_parser.special_tokens:
        return lambda ids: engine.decode(ids, skip_special_tokens=False)
    if ctx.reply_markers:
        markers = ctx.reply_markers
        return lambda ids: decode_keeping(engine, ids, markers)
    return lambda ids: engine.decode(ids)


def stream_reply(
    ctx: ServingContext, res: GenResult, text: str, tools: list[dict[str, Any]] | None
) -> tuple[ParsedReply, Streamed] | None:
    """Read ``text`` (the reply ``res`` as the parser reads it) piece by piece, token-aligned, with the
    reply parser's stream: the whole reply read, and what each piece made certain. ``None`` for a reply
    parser that cannot stream (a ``ReplyParser`` without ``stream``) or, logged, whose stream sent what
    the whole reply does not read as (the reply is then replayed from its whole reading)."""
    start = getattr(ctx.reply_parser, "stream", None)
    if start is None:
        return None
    parts = pieces(ctx, res, text, reply_decoder(ctx))
    step = max(1, -(-len(parts) // MAX_PIECES))
    stream = start(tools or None, with_calls=bool(tools))
    out: Streamed = []
    try:
        for i in range(0, len(parts), step):
            group = parts[i : i + step]
            out.append((stream.read_delta("".join(p for p, _, _ in group)), group[0][1], group[-1][2]))
        out.append((stream.finish(), len(res.token_ids), len(res.token_ids)))
    except StreamMismatchError as exc:
        logger.error("the reply is streamed from its whole reading: %s", exc)
        return None
    return stream.reply, out


def token_logprobs(
    ctx: ServingContext, res: GenResult, start: int = 0, end: int | None = None
) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content`` entries of tokens [start, end) of ``res``."""
    out = []
    end = len(res.token_ids) if end is None else end
    for k in range(start, end):
        text = ctx.engine.token_text(res.token_ids[k])
        entry: dict[str, Any] = {
            "token": text,
            "logprob": res.logprobs[k],
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": [],
        }
        if res.top_logprobs:
            for tid, lp in res.top_logprobs[k]:
                t = ctx.engine.token_text(tid)
                entry["top_logprobs"].append({"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))})
        out.append(entry)
    return out


def _deltas(msg: dict[str, Any], streamed: Streamed, n_tokens: int) -> list[tuple[dict[str, Any], int, int]]:
    """The chunk deltas of a streamed reply, each with its tokens [start, end) (``start == end``: none).
    The reasoning goes as one delta, before the first content or call; calls past those of the message
    (``parallel_tool_calls: false`` keeps the first) are not sent."""
    kept = len(msg.get("tool_calls") or [])
    out: list[tuple[dict[str, Any], int, int]] = []
    reasoning, taken = "", 0
    for d, _, end in streamed:
        reasoning += d.reasoning
        calls = [c.openai() for c in d.tool_calls if c.index < kept]
        parts: list[dict[str, Any]] = []
        if reasoning and (d.content or calls):
            parts.append({"reasoning_content": reasoning})
            reasoning = ""
        if d.content:
            parts.append({"content": d.content})
        if calls:
            parts.append({"tool_calls": calls})
        for k, part in enumerate(parts):
            out.append((part, taken, end) if k == 0 else (part, end, end))
        taken = end if parts else taken
    if reasoning:
        out.append(({"reasoning_content": reasoning}, taken, n_tokens))
        taken = n_tokens
    if taken < n_tokens and out:  # trailing tokens (EOS) ride on the last delta that has tokens
        last = max(i for i, (_, s, e) in enumerate(out) if e > s or i == 0)
        part, s, _ = out[last]
        out[last] = (part, s, n_tokens)
    return out


def chat_chunks(ctx: ServingContext, run: ChatRun, p: Params) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a served chat request, each choice's from what its
    reply's stream made certain, piece by piece (``run.streamed``), or, for a reply read whole, its
    message replayed (content in token-aligned pieces, each call whole)."""
    request_id, created, fingerprint = run.request_id, run.created, run.fingerprint

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict:
        return {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": ctx.model_name,
            "system_fingerprint": fingerprint,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }

    def lp(res: GenResult, s: int, e: int) -> Any:
        return {"content": token_logprobs(ctx, res, s, e), "refusal": None} if p.logprobs and e > s else None

    out: list[dict[str, Any]] = []
    for choice, res, by_piece in zip(run.choices, run.results, run.streamed, strict=True):
        i, msg = choice["index"], choice["message"]
        out.append(chunk(i, {"role": "assistant", "content": ""}))
        if by_piece is not None:
            for delta, s, e in _deltas(msg, by_piece, len(res.token_ids)):
                out.append(chunk(i, delta, logprobs=lp(res, s, e)))
        else:
            out += [chunk(i, d, logprobs=lp(res, s, e)) for d, s, e in _replayed(ctx, msg, res)]
        out.append(chunk(i, {}, finish=choice["finish_reason"]))
    if p.include_usage:  # OpenAI: "usage": null on every chunk, then one chunk with usage only
        for c in out:
            c["usage"] = None
        last = chunk(0, {})
        last["choices"], last["usage"] = [], run.total
        out.append(last)
    return out


def _replayed(
    ctx: ServingContext, msg: dict[str, Any], res: GenResult
) -> list[tuple[dict[str, Any], int, int]]:
    """A message read whole, as deltas: its reasoning, then its content in token-aligned pieces, or its
    content and then each call whole (the first carrying every token's logprobs)."""
    out: list[tuple[dict[str, Any], int, int]] = []
    if msg.get("reasoning_content"):
        out.append(({"reasoning_content": msg["reasoning_content"]}, 0, 0))
    if msg.get("tool_calls"):
        if msg.get("content"):
            out.append(({"content": msg["content"]}, 0, 0))
        for j, tc in enumerate(msg["tool_calls"]):
            out.append(({"tool_calls": [{"index": j, **tc}]}, 0, len(res.token_ids) if j == 0 else 0))
    else:
        out += [({"content": d}, s, e) for d, s, e in pieces(ctx, res, msg["content"] or "")]
    return out


def content_deltas(ctx: ServingContext, run: ChatRun) -> list[str] | None:
    """The first choice's content as it streams: the pieces its reply's stream made certain, or, for a
    reply read whole, token-aligned pieces of its content (``None``: no content). The Responses and
    Messages streams send these as their text deltas."""
    text = run.choices[0]["message"].get("content") or ""
    if not text:
        return None
    by_piece = run.streamed[0] if run.streamed else None
    if by_piece is None:
        return [d for d, _, _ in pieces(ctx, run.results[0], text)]
    return [d.content for d, _, _ in by_piece if d.content]
