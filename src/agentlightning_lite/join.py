"""Join a framework's view of an LLM call (an adapter's span) with the PolicyServer's token-level span.

The framework span knows which agent and step made the call; the server span has the exact token ids.
After the join the server span carries the agent and hangs under the framework span, and the framework
span is marked ``agl.duplicate_of`` so that the call is counted once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeAlias

from ._json import json_or_text
from .store.base import Store
from .types import Span

__all__ = [
    "DUPLICATE_OF",
    "FRAMEWORK_SPAN",
    "HAS_TOKENS",
    "JOINED",
    "RESPONSE_ID",
    "SOURCE",
    "is_framework_llm",
    "is_server_llm",
    "join_rollout",
    "join_spans",
    "resolve",
    "untokenized",
]

#: attribute naming the framework an adapter span came from (``"langchain"``, ``"crewai"``...)
SOURCE = "agl.source"
#: on a joined framework span: the server span that holds the same call with tokens
DUPLICATE_OF = "agl.duplicate_of"
JOINED = "agl.joined_span_id"
#: on a framework LLM span: whether a token-level span of the call was found
HAS_TOKENS = "agl.has_tokens"
#: on a framework LLM span: the response id the framework saw (``chatcmpl-...``), the surest join key
RESPONSE_ID = "agl.response_id"
#: on a joined server span: the framework span it was joined to
FRAMEWORK_SPAN = "agl.framework_span_id"

#: seconds of slack when checking that the server span lies inside the framework span
TOLERANCE_S = 0.05

#: ``json.dumps(args, sort_keys=True, default=str)``, with the encoder built once
_encode_args = json.JSONEncoder(sort_keys=True, default=str).encode


def is_framework_llm(span: Span) -> bool:
    """True for an ``llm`` span recorded by an adapter (it has ``agl.source``)."""
    return span.kind == "llm" and bool(span.attributes.get(SOURCE))


def is_server_llm(span: Span) -> bool:
    """True for an ``llm`` span recorded by the PolicyServer (``attributes["server"] == "agl"``)."""
    return span.kind == "llm" and span.attributes.get("server") == "agl"


def _norm_args(args: Any) -> Any:
    decoded = json_or_text(args)
    return args.strip() if decoded is args and isinstance(args, str) else decoded  # text: stripped


_Reply: TypeAlias = "tuple[str, tuple[tuple[str, str], ...]] | None"


def _reply(output: Any) -> _Reply:
    """(text, tool calls) of an assistant message in OpenAI shape, or ``None`` when unknown."""
    if isinstance(output, list) and len(output) == 1:
        output = output[0]
    if isinstance(output, str):
        return output.strip(), ()
    if not isinstance(output, dict):
        return None
    if "message" in output and isinstance(output["message"], dict):
        output = output["message"]
    text = output.get("content")
    text = text.strip() if isinstance(text, str) else ""
    calls = []
    for c in output.get("tool_calls") or ():
        if not isinstance(c, dict):
            continue
        f = c.get("function")
        fn = f if isinstance(f, dict) else c
        name = fn.get("name")
        if isinstance(name, str):
            args = _norm_args(fn.get("arguments"))
            calls.append((name, _encode_args(args)))
    return text, tuple(calls)


def _same_reply(framework: Any, server: Any) -> bool:
    return _same(_reply(framework), _reply(server))


def _same(a: _Reply, b: _Reply) -> bool:
    if a is None or b is None:
        return False
    if a[1] or b[1]:
        return a[1] == b[1]
    return a[0] == b[0] or (bool(a[0]) and bool(b[0]) and (a[0] in b[0] or b[0] in a[0]))


def _inside(f: Span, s: Span) -> bool:
    f_end = f.end_time if f.end_time is not None else float("inf")
    s_end = s.end_time if s.end_time is not None else s.start_time
    return s.start_time >= f.start_time - TOLERANCE_S and s_end <= f_end + TOLERANCE_S


def _adopt(f: Span, s: Span) -> Span:
    """Server span ``s`` as a call of framework span ``f``: its agent, under it, marked as joined to it."""
    return s.model_copy(
        update={
            "agent": f.agent if f.agent is not None else s.agent,
            "parent_id": f.span_id,
            "attributes": {**s.attributes, FRAMEWORK_SPAN: f.span_id, "agl.framework": f.attributes[SOURCE]},
        }
    )


def _merge(f: Span, s: Span) -> tuple[Span, Span]:
    server = _adopt(f, s)
    framework = f.model_copy(
        update={
            # a framework span recorded from an end-of-call log encloses its server span from now on
            "start_time": min(f.start_time, s.start_time),
            "attributes": {
                **f.attributes,
                DUPLICATE_OF: s.span_id,
                JOINED: s.span_id,
                HAS_TOKENS: s.has_tokens,
            },
        }
    )
    return framework, server


def join_spans(spans: Sequence[Span], mark_unjoined: bool = False) -> list[Span]:
    """Pair the framework LLM spans of one rollout with the server's spans of the same calls.

    A pair is found by the response id the framework saw (``agl.response_id`` equal to the server
    span's ``request_id``), else, in call order, by the first unclaimed server span that lies in
    the framework span's time interval with the same reply (text or tool calls); a framework span
    with no comparable reply takes the only server span inside it. The other choices of the same
    request (``n > 1``: same ``request_id``) go with it: same agent, same parent. Returns the changed spans
    (copies: both halves of each pair, and with ``mark_unjoined`` the unjoined framework spans
    marked ``agl.has_tokens = False``); give them to ``store.add_spans`` to persist the join.

    >>> from agentlightning_lite import Span
    >>> fw = Span(span_id="f", rollout_id="r", kind="llm", agent="writer", start_time=1.0, end_time=2.0,
    ...           output={"role": "assistant", "content": "4"}, attributes={"agl.source": "langchain"})
    >>> sv = Span(span_id="s", rollout_id="r", kind="llm", start_time=1.1, end_time=1.9,
    ...           output={"role": "assistant", "content": "4"}, prompt_token_ids=[1], response_token_ids=[2],
    ...           attributes={"server": "agl"})
    >>> f, s = join_spans([fw, sv])
    >>> f.attributes["agl.duplicate_of"], s.agent, s.parent_id
    ('s', 'writer', 'f')
    """
    frameworks = [s for s in spans if is_framework_llm(s) and not s.attributes.get(JOINED)]
    if not frameworks:
        return []
    servers = [s for s in spans if is_server_llm(s) and not s.attributes.get(FRAMEWORK_SPAN)]
    changed: list[Span] = []
    claimed: set[str] = set()
    by_request: dict[str, Span] = {}
    choices: dict[str, list[Span]] = {}  # request id -> its server spans (more than one when n > 1)
    for s in servers:
        rid = s.attributes.get("request_id")
        if isinstance(rid, str):
            choices.setdefault(rid, []).append(s)
            if s.attributes.get("choice_index", 0) == 0:
                by_request.setdefault(rid, s)
    pending = []
    replies: dict[str, Any] = {}  # span id -> _reply(output), computed once per span

    def reply(span: Span) -> _Reply:
        r = replies.get(span.span_id, replies)
        if r is replies:
            r = replies[span.span_id] = _reply(span.output)
        return r

    def claim(f: Span, s: Span) -> None:
        claimed.add(s.span_id)
        changed.extend(_merge(f, s))
        rid = s.attributes.get("request_id")
        for sibling in choices.get(rid, ()) if isinstance(rid, str) else ():
            if sibling.span_id not in claimed:  # another choice of the same request (n > 1)
                claimed.add(sibling.span_id)
                changed.append(_adopt(f, sibling))

    for f in sorted(frameworks, key=lambda x: x.start_time):
        rid = f.attributes.get(RESPONSE_ID)
        match = by_request.get(rid) if isinstance(rid, str) else None
        if match is not None and match.span_id not in claimed:
            claim(f, match)
        else:
            pending.append(f)
    for f in pending:
        inside = [s for s in servers if s.span_id not in claimed and _inside(f, s)]
        if not inside:
            match = None
        else:
            fr = reply(f)
            match = next((s for s in inside if _same(fr, reply(s))), None)
        if match is None and len(inside) == 1 and reply(f) is None:
            match = inside[0]
        if match is not None:
            claim(f, match)
        elif mark_unjoined and f.attributes.get(HAS_TOKENS) is not False:
            changed.append(f.model_copy(update={"attributes": {**f.attributes, HAS_TOKENS: False}}))
    return changed


def resolve(spans: Sequence[Span]) -> list[Span]:
    """The spans of one rollout with any join not yet persisted applied (in memory, same order).

    >>> resolve([])
    []
    """
    changed = join_spans(spans)
    if not changed:
        return list(spans)
    new = {s.span_id: s for s in changed}
    return [new.get(s.span_id, s) for s in spans]


def untokenized(spans: Sequence[Span]) -> list[Span]:
    """Framework LLM spans that are not joined to a call with token ids (not training data).

    >>> untokenized([])
    []
    """
    return [
        s for s in spans if is_framework_llm(s) and not s.attributes.get(DUPLICATE_OF) and not s.has_tokens
    ]


def join_rollout(store: Store, rollout_id: str) -> int:
    """Join the framework LLM spans of one rollout in ``store`` and persist the result; returns pairs made.

    Unjoined framework LLM spans are marked ``agl.has_tokens = False``.

    >>> import agentlightning_lite as agl
    >>> store = agl.MemoryStore()
    >>> join_rollout(store, store.start_rollout("q").rollout_id)
    0
    """
    changed = join_spans(store.spans(rollout_id), mark_unjoined=True)
    if changed:
        store.add_spans(changed)
    return sum(1 for s in changed if s.attributes.get(FRAMEWORK_SPAN))
