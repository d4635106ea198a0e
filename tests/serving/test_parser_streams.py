"""Streamed replies (serving.parsers ``stream``): every reply of the parser tests, fed in pieces of every
size and at random cuts, streams exactly what the whole reply reads as; calls are sent as they close."""

# ruff: noqa: RUF001  (DeepSeek's markers are written with full-width bars)
from __future__ import annotations

import json
import random
from typing import Any

import pytest

from agentlightning_lite.serving.engines import ScriptedEngine
from agentlightning_lite.serving.parsers import (
    ModelReplyParser,
    ReplyDelta,
    StreamMismatchError,
    reply_parser,
)
from agentlightning_lite.serving.parsers.base import held_end_markers
from agentlightning_lite.serving.reply import HermesReplyParser

from .test_parsers import CASES, REASONING, TOOLS


def _streamed(parser: ModelReplyParser, pieces: list[str], tools: Any, with_calls: bool) -> tuple:
    """(reasoning, content, calls, ids) joined from what a stream of ``pieces`` sends, and its reply."""
    stream = parser.stream(tools, with_calls)
    deltas = [stream.read_delta(p) for p in pieces] + [stream.finish()]
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for c in d.tool_calls:
            if c.id is not None:
                assert c.index == len(calls) and c.name  # a call's first piece: its id and name, in order
                calls[c.index] = [c.id, c.name, ""]
            calls[c.index][2] += c.arguments
    reasoning = "".join(d.reasoning for d in deltas)
    content = "".join(d.content for d in deltas)
    return reasoning, content, [(n, json.loads(a)) for _, n, a in calls.values()], stream.reply, calls


def _cuts(text: str, seed: int, sizes: int | None = None) -> list[list[str]]:
    """``text`` in pieces of every size 1..len (1..``sizes``), and cut at 20 random sets of places."""
    out = [[text[i : i + k] for i in range(0, len(text), k)] for k in range(1, (sizes or len(text)) + 1)]
    rng = random.Random(seed)
    for _ in range(20):
        at = (
            sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
            if len(text) > 1
            else []
        )
        out.append([text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)])
    return out or [[""]]


def _check(
    parser: ModelReplyParser, text: str, tools: Any, with_calls: bool = True, sizes: int | None = None
) -> None:
    whole = parser.read(text, tools, with_calls)
    for pieces in _cuts(text, len(text), sizes):
        reasoning, content, calls, reply, sent = _streamed(parser, pieces, tools, with_calls)
        where = f"{parser!r} on {text!r} in pieces {pieces!r}"
        assert (reasoning, content, calls) == (whole.reasoning or "", whole.content or "", whole.calls), where
        assert (reply.content, reply.reasoning, reply.calls) == (whole.content, whole.reasoning, whole.calls)
        assert reply.tool_parse_failed == whole.tool_parse_failed
        assert [c["id"] for c in reply.tool_calls] == [c[0] for c in sent.values()]  # the ids it streamed


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
def test_every_tool_parser_case_streams_what_the_whole_reply_reads(
    name: str, text: str, content: str | None, calls: list
) -> None:
    parser = reply_parser(name)
    _check(parser, text, TOOLS)
    _check(parser, text, TOOLS, with_calls=False, sizes=3)  # no tools offered: the content only


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), REASONING)
def test_every_reasoning_case_streams_what_the_whole_reply_reads(
    name: str, text: str, reasoning: str | None, content: str | None
) -> None:
    tool = "openai" if name in ("openai_gptoss", "gpt_oss") else "hermes"
    _check(reply_parser(tool, name), text, None)
    _check(reply_parser(tool, name), text, TOOLS, with_calls=False, sizes=3)


@pytest.mark.parametrize(
    ("tool", "reasoning", "text"),
    [
        ("qwen3_coder", "qwen3", "<think>Weather.</think>\n\n<tool_call>\n<function=f>\n<parameter=n>\n2\n"
         "</parameter>\n</function>\n</tool_call>"),
        ("openai", "openai_gptoss", "<|channel|>analysis<|message|>Call f.<|end|><|start|>assistant"
         '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"n": 1}<|call|>'),
        ("hermes", "qwen3", '<think>Two calls.</think>Sure: <tool_call>{"name": "f", "arguments": {"n": 1}}'
         '</tool_call> and <tool_call>{"name": "g", "arguments": {}}</tool_call><|im_end|>'),
        ("mistral", "mistral", '[THINK]Look it up.[/THINK][TOOL_CALLS]f[ARGS]{"n": 3}</s>'),
        ("kimi_k2", "qwen3", "<think>x</think>Ok.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
         '<|tool_call_argument_begin|>{"n": "4"}<|tool_call_end|><|tool_calls_section_end|>'),
        ("glm45", "qwen3", "<think>y</think>\n<tool_call>g\n</tool_call>\n<tool_call>f\n"
         "<arg_key>n</arg_key>\n<arg_value>5</arg_value>\n</tool_call>"),
        ("deepseek_v31", "deepseek_r1", "<think>z</think>Then<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f"
         '<｜tool▁sep｜>{"n": 6}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'),
    ],
)  # fmt: skip
def test_reasoning_then_calls_stream_what_the_whole_reply_reads(tool: str, reasoning: str, text: str) -> None:
    _check(reply_parser(tool, reasoning), text, TOOLS)


@pytest.mark.parametrize(
    ("tool", "text", "closer"),
    [
        ("hermes", 'Sure. <tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call> more', "</tool_call>"),
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n</function> then",
         "</function>"),
        ("glm45", "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>1</arg_value>\n</tool_call> then",
         "</tool_call>"),
        ("deepseek_v31", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"n": 1}'
         "<｜tool▁call▁end｜>x", "<｜tool▁call▁end｜>"),
        ("kimi_k2", '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>'
         '{"n": 1}<|tool_call_end|>x', "<|tool_call_end|>"),
        ("openai", '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"n": 1}<|call|>'
         "<|start|>assistant", "<|call|><|s"),  # <|call|> may end the reply: an end token, held back
    ],
)  # fmt: skip
def test_a_call_is_sent_as_soon_as_it_closes(tool: str, text: str, closer: str) -> None:
    stream = reply_parser(tool).stream(TOOLS)
    done = text.index(closer) + len(closer)
    first = {i: stream.read_delta(ch) for i, ch in enumerate(text)}
    sent = [i for i, d in first.items() if d.tool_calls]
    assert sent and sent[0] == done - 1, (sent, done)  # the character that closes the call sends it
    (call,) = first[sent[0]].tool_calls
    assert (call.index, call.name, json.loads(call.arguments)) == (0, "f", {"n": 1})
    stream.finish()
    assert stream.reply.tool_calls[0]["id"] == call.id


def test_content_streams_as_it_comes_and_holds_back_what_may_be_a_marker() -> None:
    stream = reply_parser("hermes", "qwen3").stream(TOOLS)
    got = [
        stream.read_delta(p) for p in ("<think>Plan", " it.</thi", "nk>\n\nHello", " there <tool_", "call>{")
    ]
    assert [(d.reasoning, d.content) for d in got] == [
        ("Plan", ""),
        (" it.", ""),  # "</thi" may be the end of the thinking: held back
        ("", "Hello"),
        ("", " there"),  # the space may be stripped, "<tool_" may begin a call
        ("", ""),
    ]
    stream.read_delta('"name": "g", "arguments": {}}</tool_call>')
    assert stream.finish() == ReplyDelta()
    assert (stream.reply.content, stream.reply.calls) == ("Hello there", [("g", {})])


def test_end_of_turn_tokens_are_held_back_until_the_reply_ends() -> None:
    assert held_end_markers("Done<|im_end|>") == "Done"
    assert held_end_markers("Done<|im_") == "Done"
    assert held_end_markers("a<|end|>b<|ret") == "a<|end|>b"
    assert held_end_markers("x </s>\n") == "x "
    stream = reply_parser("mistral").stream(TOOLS)
    assert stream.read_delta("Hi</s>").content == "Hi"
    assert stream.read_delta(" and on").content == "</s> and on"  # not the end after all: it is text


def test_the_hermes_default_parser_streams_too() -> None:
    parser = HermesReplyParser()
    text = 'Checking.<tool_call>{"name": "g", "arguments": {}}</tool_call> done'
    _check(parser, text, TOOLS)
    assert isinstance(parser.stream(TOOLS).finish(), ReplyDelta)


def test_a_finished_stream_refuses_more_and_a_wrong_stream_is_named() -> None:
    stream = reply_parser("hermes").stream(None)
    with pytest.raises(RuntimeError, match="finish"):
        _ = stream.reply
    stream.finish()
    with pytest.raises(RuntimeError, match="finished"):
        stream.read_delta("x")

    class Eager(ModelReplyParser):  # claims the content is certain while it is not
        def certain(self, text: str, tools: Any = None, with_calls: bool = True) -> tuple[str, str, list]:
            return "", text, []

    eager = Eager(reply_parser("hermes").tool).stream(TOOLS)
    eager.read_delta('<tool_call>{"name": "g", "arguments": {}}')
    with pytest.raises(StreamMismatchError, match=r"hermes.*sent content '<tool_call>"):
        eager.finish()


def test_a_streamed_chat_completion_sends_each_call_where_it_closes(serve: Any, store: Any) -> None:
    reply = (
        '<think>Two lookups.</think>First, <tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call> then '
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )
    engine = ScriptedEngine([reply], tokenizer="bytes")
    server = serve(engine, store, tool_parser="hermes", reasoning_parser="qwen3")
    ro = store.start_rollout("t", mode="train")
    llm = server.llm(ro.rollout_id)
    client = llm.openai_client(max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": "go"}],
            tools=TOOLS,
            stream=True,
            logprobs=True,
        )
    )
    deltas = [c.choices[0].delta for c in chunks]
    kinds = [
        "reasoning"
        if (d.model_extra or {}).get("reasoning_content")
        else f"call {d.tool_calls[0].index}"
        if d.tool_calls
        else "content"
        if d.content
        else None
        for d in deltas
    ]
    # the calls come as they close, between the content around them: not replayed after the reply
    runs = [k for i, k in enumerate(kinds) if k and (i == 0 or kinds[i - 1] != k)]
    assert runs == ["reasoning", "content", "call 0", "content", "call 1"]
    assert kinds.count("content") > 3  # the content in pieces too
    assert deltas[kinds.index("reasoning")].model_extra["reasoning_content"] == "Two lookups."
    assert "".join(d.content or "" for d in deltas) == "First,  then"
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
        ("f", {"n": 1}),
        ("g", {}),
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    (span,) = [s for s in store.spans(ro.rollout_id) if s.kind == "llm"]
    assert [c["id"] for c in span.output["tool_calls"]] == [tc.id for tc in calls]  # the ids the agent got
    assert span.output["content"] == "First,  then" and span.output["reasoning_content"] == "Two lookups."
    streamed_lp = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(streamed_lp) == len(span.response_token_ids)  # every token's logprob, once
    one = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": "go"}], tools=TOOLS, stream=True,
        parallel_tool_calls=False,
    )  # fmt: skip
    assert [tc.function.name for c in one for tc in c.choices[0].delta.tool_calls or []] == ["f"]


def test_an_empty_reply_streams_its_role_and_finish_only(serve: Any, store: Any) -> None:
    server = serve(
        ScriptedEngine([""], tokenizer="bytes"), store, tool_parser="hermes", reasoning_parser="qwen3"
    )
    llm = server.llm()
    client = llm.openai_client(max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": "go"}],
            tools=TOOLS,
            stream=True,
            logprobs=True,
        )
    )
    assert [c.choices[0].delta.role for c in chunks] == ["assistant", None]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert chunks[-1].choices[0].finish_reason == "stop"
