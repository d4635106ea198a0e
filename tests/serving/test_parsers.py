"""The reply parsers by vLLM's names (serving.parsers): each format's calls, content and reasoning, the
registry, ``detect`` on real chat-template snippets, and a PolicyServer that reads replies with them."""

# ruff: noqa: RUF001  (DeepSeek's markers are written with full-width bars)
from __future__ import annotations

from typing import Any

import openai
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import parsers
from agentlightning_lite.serving.engines import ScriptedEngine
from agentlightning_lite.serving.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    detect,
    parse,
    reply_parser,
)
from agentlightning_lite.serving.reply import HermesReplyParser

PROPS = {
    "n": {"type": "integer"},
    "x": {"type": "number"},
    "ok": {"type": "boolean"},
    "s": {"type": "string"},
    "o": {"type": "object"},
    "a": {"type": "array"},
}
TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": PROPS}}},
    {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}},
]

# (tool parser, reply, content, calls) with TOOLS offered
CASES = [
    (
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {"n": 1}}\n</tool_call>',
        None,
        [("f", {"n": 1})],
    ),
    (
        "hermes",
        'Let me compute.<tool_call>{"name": "f", "arguments": {"s": "東京"}}</tool_call>',
        "Let me compute.",
        [("f", {"s": "東京"})],
    ),
    (
        "hermes",
        (
            '<tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call>\n<tool_call>{"name'
            '": "g", "arguments": {}}</tool_call>'
        ),
        None,
        [("f", {"n": 1}), ("g", {})],
    ),
    (
        "hermes",
        (
            '<tool_call>{"name": "f", "arguments": {"o": {"a": [1, {"b": null}]}, "ok": tru'
            'e, "x": 1.5}}</tool_call>'
        ),
        None,
        [("f", {"o": {"a": [1, {"b": None}]}, "ok": True, "x": 1.5})],
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call> Then I will answer.',
        "Then I will answer.",
        [("f", {"n": 1})],
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"n": 1}',
        '<tool_call>{"name": "f", "arguments": {"n": 1}',
        [],
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"n": 1}}',
        None,
        [("f", {"n": 1})],
    ),
    (
        "hermes",
        '<tool_call>{"name": "zzz", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "zzz", "arguments": {}}</tool_call>',
        [],
    ),
    (
        "hermes",
        "The answer is 4.",
        "The answer is 4.",
        [],
    ),
    (
        "hermes",
        '{"name": "f", "arguments": {"n": 2}}',
        None,
        [("f", {"n": 2})],
    ),
    (
        "hermes",
        "<tool_call>not json</tool_call>",
        "<tool_call>not json</tool_call>",
        [],
    ),
    (
        "qwen3_coder",
        (
            "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n<parameter=s>\nhi\n"
            "</parameter>\n</function>\n</tool_call>"
        ),
        None,
        [("f", {"n": 3, "s": "hi"})],
    ),
    (
        "qwen3_coder",
        (
            "Let me check.\n<tool_call>\n<function=f>\n<parameter=x>\n2.5\n</parameter>\n</"
            "function>\n</tool_call>"
        ),
        "Let me check.",
        [("f", {"x": 2.5})],
    ),
    (
        "qwen3_coder",
        (
            "<tool_call>\n<function=f>\n<parameter=ok>\ntrue\n</parameter>\n</function>\n</"
            "tool_call>\n<tool_call>\n<function=g>\n</function>\n</tool_call>"
        ),
        None,
        [("f", {"ok": True}), ("g", {})],
    ),
    (
        "qwen3_coder",
        (
            '<tool_call>\n<function=f>\n<parameter=o>\n{"k": [1, 2]}\n</parameter>\n<parame'
            'ter=a>\n["é", "東京"]\n</parameter>\n</function>\n</tool_call>'
        ),
        None,
        [("f", {"o": {"k": [1, 2]}, "a": ["é", "東京"]})],
    ),
    (
        "qwen3_coder",
        (
            "<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=free>\n"
            "7\n</parameter>\n</function>\n</tool_call>"
        ),
        None,
        [("f", {"s": "42", "free": "7"})],
    ),
    (
        "qwen3_coder",
        ("<tool_call>\n<function=unknown>\n<parameter=s>\nx\n</parameter>\n</function>\n</tool_call>"),
        None,
        [("unknown", {"s": "x"})],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n<parameter=s>\ncut sh",
        None,
        [("f", {"n": 5})],
    ),
    (
        "qwen3_coder",
        "<function=f>\n<parameter=n>\n1\n</parameter>\n</function>",
        None,
        [("f", {"n": 1})],
    ),
    (
        "qwen3_coder",
        "No tools needed: 4.",
        "No tools needed: 4.",
        [],
    ),
    (
        "qwen3_coder",
        ("<tool_call>\n<function=f>\n<parameter=n>\nmany\n</parameter>\n</function>\n</tool_call> done"),
        None,
        [("f", {"n": "many"})],
    ),
    (
        "qwen3_coder",
        (
            "<tool_call>\n<function=f>\n<parameter=s>\nline1\nline2\n</parameter>\n<paramet"
            "er=n>\n-3\n</parameter>\n</function>\n</tool_call>"
        ),
        None,
        [("f", {"s": "line1\nline2", "n": -3})],
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"n": 1}}',
        None,
        [("f", {"n": 1})],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "f", "parameters": {"s": "東京"}}',
        None,
        [("f", {"s": "東京"})],
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"n": 1}}; {"name": "g", "parameters": {}}',
        None,
        [("f", {"n": 1}), ("g", {})],
    ),
    (
        "llama3_json",
        '{"name": "f", "arguments": {"o": {"deep": {"x": [1, 2]}}}}',
        None,
        [("f", {"o": {"deep": {"x": [1, 2]}}})],
    ),
    (
        "llama3_json",
        'Sure! {"name": "f", "parameters": {"ok": true}}',
        None,
        [("f", {"ok": True})],
    ),
    (
        "llama3_json",
        '{"name": "f"}',
        '{"name": "f"}',
        [],
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"n": 1',
        '{"name": "f", "parameters": {"n": 1',
        [],
    ),
    (
        "llama3_json",
        "The answer is 4.",
        "The answer is 4.",
        [],
    ),
    (
        "llama3_json",
        '{"a": 1}',
        '{"a": 1}',
        [],
    ),
    (
        "llama3_json",
        '{"name": "zzz", "parameters": {}}',
        None,
        [("zzz", {})],
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": "{\\"n\\": 2}"}',
        None,
        [("f", {"n": 2})],
    ),
    (
        "pythonic",
        '[f(n=1, s="x")]',
        None,
        [("f", {"n": 1, "s": "x"})],
    ),
    (
        "pythonic",
        "[f(ok=True), g()]",
        None,
        [("f", {"ok": True}), ("g", {})],
    ),
    (
        "pythonic",
        '[f(o={"k": [1, 2]}, a=(1, 2))]',
        None,
        [("f", {"o": {"k": [1, 2]}, "a": [1, 2]})],
    ),
    (
        "pythonic",
        '[f(s="München", x=-1.5)]',
        None,
        [("f", {"s": "München", "x": -1.5})],
    ),
    (
        "pythonic",
        "[f(ok=true, o=null)]",
        None,
        [("f", {"ok": True, "o": None})],
    ),
    (
        "pythonic",
        "Sure: [f(n=1)]",
        "Sure: [f(n=1)]",
        [],
    ),
    (
        "pythonic",
        "[f(n=1)",
        "[f(n=1)",
        [],
    ),
    (
        "pythonic",
        '[f(n=open("x"))]',
        '[f(n=open("x"))]',
        [],
    ),
    (
        "pythonic",
        "just text",
        "just text",
        [],
    ),
    (
        "pythonic",
        "[zzz(n=1)]",
        None,
        [("zzz", {"n": 1})],
    ),
    (
        "pythonic",
        "[1, 2]",
        "[1, 2]",
        [],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {"n": 1}}]',
        None,
        [("f", {"n": 1})],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {"n": 1}}, {"name": "g", "arguments": {}}]',
        None,
        [("f", {"n": 1}), ("g", {})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]f[ARGS]{"s": "hi"}',
        None,
        [("f", {"s": "hi"})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]f[ARGS]{"n": "3"}[TOOL_CALLS]g[ARGS]{}',
        None,
        [("f", {"n": 3}), ("g", {})],
    ),
    (
        "mistral",
        'Let me check. [TOOL_CALLS]f[ARGS]{"o": {"a": [1, {"b": "ü"}]}}',
        "Let me check. ",
        [("f", {"o": {"a": [1, {"b": "ü"}]}})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]f{"ok": true}',
        None,
        [("f", {"ok": True})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]f[ARGS]{"n": 1',
        '[TOOL_CALLS]f[ARGS]{"n": 1',
        [],
    ),
    (
        "mistral",
        "No call here.",
        "No call here.",
        [],
    ),
    (
        "mistral",
        "[TOOL_CALLS]zzz[ARGS]{}",
        None,
        [("zzz", {})],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1.5}}]</s>',
        None,
        [("f", {"x": 1.5})],
    ),
    (
        "mistral",
        "[TOOL_CALLS]not json",
        "[TOOL_CALLS]not json",
        [],
    ),
    (
        "deepseek_v31",
        (
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"n": 1}<｜tool▁call▁end｜><'
            "｜tool▁calls▁end｜>"
        ),
        None,
        [("f", {"n": 1})],
    ),
    (
        "deepseek_v31",
        (
            'Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"s": "東京"}<｜tool'
            "▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        "Checking.",
        [("f", {"s": "東京"})],
    ),
    (
        "deepseek_v31",
        (
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"n": 1}<｜tool▁call▁end｜><'
            "｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        None,
        [("f", {"n": 1}), ("g", {})],
    ),
    (
        "deepseek_v31",
        (
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"o": {"a": [true, null]}}'
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
        ),
        None,
        [("f", {"o": {"a": [True, None]}})],
    ),
    (
        "deepseek_v31",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"n": 1',
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"n": 1',
        [],
    ),
    (
        "deepseek_v31",
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>not json<｜tool▁call▁end｜><"
            "｜tool▁calls▁end｜>"
        ),
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>not json"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        [],
    ),
    (
        "deepseek_v31",
        "Just an answer.",
        "Just an answer.",
        [],
    ),
    (
        "deepseek_v31",
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>zzz<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜too"
            "l▁calls▁end｜>"
        ),
        None,
        [("zzz", {})],
    ),
    (
        "deepseek_v31",
        (
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"x": 2.5, "ok": false}<｜t'
            "ool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        None,
        [("f", {"x": 2.5, "ok": False})],
    ),
    (
        "deepseek_v31",
        (
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"s": "a\\nb"}<｜tool▁call▁'
            "end｜><｜tool▁calls▁end｜>"
        ),
        None,
        [("f", {"s": "a\nb"})],
    ),
    (
        "glm45",
        (
            "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n<arg_key>s</arg_"
            "key>\n<arg_value>hi</arg_value>\n</tool_call>"
        ),
        None,
        [("f", {"n": 3, "s": "hi"})],
    ),
    (
        "glm45",
        ("Looking.<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>0.5</arg_value>\n</tool_call>"),
        "Looking.",
        [("f", {"x": 0.5})],
    ),
    (
        "glm45",
        (
            "<tool_call>f\n<arg_key>ok</arg_key>\n<arg_value>false</arg_value>\n</tool_call"
            ">\n<tool_call>g\n</tool_call>"
        ),
        None,
        [("f", {"ok": False}), ("g", {})],
    ),
    (
        "glm45",
        (
            '<tool_call>f\n<arg_key>o</arg_key>\n<arg_value>{"city": "Zürich"}</arg_value>'
            "\n<arg_key>a</arg_key>\n<arg_value>[1, 2]</arg_value>\n</tool_call>"
        ),
        None,
        [("f", {"o": {"city": "Zürich"}, "a": [1, 2]})],
    ),
    (
        "glm45",
        "<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>007</arg_value>\n</tool_call>",
        None,
        [("f", {"s": "007"})],
    ),
    (
        "glm45",
        "<tool_call>nope\n<arg_key>s</arg_key>\n<arg_value>x</arg_value>\n</tool_call>",
        None,
        [],
    ),
    (
        "glm45",
        (
            "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n<arg_key>s</arg_"
            "key>\n<arg_value>trunc"
        ),
        None,
        [("f", {"n": 2})],
    ),
    (
        "glm45",
        "plain answer",
        "plain answer",
        [],
    ),
    (
        "glm45",
        "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>two</arg_value>\n</tool_call>",
        None,
        [("f", {"n": "two"})],
    ),
    (
        "glm45",
        "<tool_call>g</tool_call> after",
        None,
        [("g", {})],
    ),
    (
        "kimi_k2",
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argume"
            'nt_begin|>{"n": 1}<|tool_call_end|><|tool_calls_section_end|>'
        ),
        None,
        [("f", {"n": 1})],
    ),
    (
        "kimi_k2",
        (
            "On it.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_"
            'argument_begin|>{"s": "ß"}<|tool_call_end|><|tool_calls_section_end|>'
        ),
        "On it.",
        [("f", {"s": "ß"})],
    ),
    (
        "kimi_k2",
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argume"
            'nt_begin|>{"n": 1}<|tool_call_end|><|tool_call_begin|>functions.g:1<|tool_call'
            "_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
        ),
        None,
        [("f", {"n": 1}), ("g", {})],
    ),
    (
        "kimi_k2",
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argume"
            'nt_begin|>{"n": "7", "s": 5}<|tool_call_end|><|tool_calls_section_end|>'
        ),
        None,
        [("f", {"n": 7, "s": "5"})],
    ),
    (
        "kimi_k2",
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argume"
            'nt_begin|>{"o": {"k": [1]}}<|tool_call_end|><|tool_calls_section_end|> trailin'
            "g"
        ),
        None,
        [("f", {"o": {"k": [1]}})],
    ),
    (
        "kimi_k2",
        ('<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"n": 1'),
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"n": 1',
        [],
    ),
    (
        "kimi_k2",
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.zzz:0<|tool_call_argu"
            "ment_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
        ),
        None,
        [("zzz", {})],
    ),
    (
        "kimi_k2",
        "Hello there.<|im_end|>",
        "Hello there.",
        [],
    ),
    (
        "kimi_k2",
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argume"
            "nt_begin|>nope<|tool_call_end|><|tool_calls_section_end|>"
        ),
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>nope<|tool_call_end|><|tool_calls_section_end|>",
        [],
    ),
    (
        "kimi_k2",
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>f:3<|tool_call_argument_begin|>"
            '{"ok": true}<|tool_call_end|><|tool_calls_section_end|>'
        ),
        None,
        [("f", {"ok": True})],
    ),
    (
        "openai",
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"n": 1}<|call|>',
        None,
        [("f", {"n": 1})],
    ),
    (
        "openai",
        (
            "<|channel|>analysis<|message|>Need f.<|end|><|start|>assistant<|channel|>comme"
            'ntary to=functions.f <|constrain|>json<|message|>{"s": "日本"}<|call|>'
        ),
        None,
        [("f", {"s": "日本"})],
    ),
    (
        "openai",
        "<|channel|>final<|message|>The answer is 4.<|return|>",
        "The answer is 4.",
        [],
    ),
    (
        "openai",
        (
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|"
            "message|>4<|return|>"
        ),
        "4",
        [],
    ),
    (
        "openai",
        "<|start|>assistant to=functions.g<|channel|>commentary json<|message|>{}<|call|>",
        None,
        [("g", {})],
    ),
    (
        "openai",
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"n": 1',
        None,
        [],
    ),
    (
        "openai",
        "<|channel|>commentary to=functions.zzz <|constrain|>json<|message|>{}<|call|>",
        None,
        [("zzz", {})],
    ),
    (
        "openai",
        (
            "<|channel|>commentary<|message|>Working on it.<|end|><|start|>assistant<|chann"
            'el|>commentary to=functions.f <|constrain|>json<|message|>{"o": {"a": [1]}}<|c'
            "all|>"
        ),
        "Working on it.",
        [("f", {"o": {"a": [1]}})],
    ),
    (
        "openai",
        "plain text without harmony",
        "plain text without harmony",
        [],
    ),
    (
        "openai",
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json<|call|>",
        None,
        [],
    ),
]


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
def test_each_tool_parser_reads_its_format(name: str, text: str, content: str | None, calls: list) -> None:
    reply = parse(text, name, tools=TOOLS)
    assert (reply.content, reply.calls) == (content, calls)
    for call, (fn, _) in zip(reply.tool_calls, calls, strict=True):  # OpenAI's shape for the routes
        assert call["type"] == "function"
        if name == "mistral":  # 9 letters and digits, as Mistral's templates take back
            assert len(call["id"]) == 9 and call["id"].isalnum()
        else:
            assert call["id"].startswith("call_")
        assert call["function"]["name"] == fn
        assert isinstance(call["function"]["arguments"], str)


def test_every_tool_parser_has_ten_cases_and_vllms_names() -> None:
    counts = {name: sum(1 for c in CASES if c[0] == name) for name in TOOL_PARSERS}
    assert all(n >= 10 for n in counts.values()), counts
    assert set(TOOL_PARSERS) == {
        "hermes", "qwen3_coder", "llama3_json", "pythonic", "mistral", "deepseek_v31", "glm45", "kimi_k2",
        "openai",
    }  # fmt: skip
    assert set(REASONING_PARSERS) == {"qwen3", "deepseek_r1", "mistral", "openai_gptoss", "gpt_oss"}


def test_without_tools_any_name_is_a_call_and_the_server_reads_no_calls() -> None:
    text = "<tool_call>\n<function=other>\n<parameter=q>\n1\n</parameter>\n</function>\n</tool_call>"
    assert parse(text, "qwen3_coder").calls == [("other", {"q": "1"})]  # no schema: the text is kept
    assert reply_parser("qwen3_coder").parse(text, None).tool_calls == []  # nothing offered: no calls read


def test_the_hermes_parser_reads_as_the_default_one() -> None:
    text = 'Checking.<tool_call>{"name": "g", "arguments": {}}</tool_call> done'
    ours, default = reply_parser("hermes").parse(text, TOOLS), HermesReplyParser().parse(text, TOOLS)
    assert (ours.content, ours.calls) == (default.content, default.calls) == ("Checking. done", [("g", {})])
    assert reply_parser("hermes").parse("4", None) == HermesReplyParser().parse("4", None)


REASONING = [
    ("qwen3", "<think>\nAdd them.\n</think>\n\nIt is 4.", "\nAdd them.\n", "It is 4."),
    ("qwen3", "Add them.</think>It is 4.", "Add them.", "It is 4."),  # <think> was in the prompt
    ("qwen3", "It is 4.", None, "It is 4."),  # thinking turned off
    ("qwen3", "<think>Still going", "Still going", None),  # cut short while thinking
    ("qwen3", "<think>多少？</think>四", "多少？", "四"),
    ("qwen3", "<think></think>4", None, "4"),
    ("qwen3", "<think>a</think>b</think>c", "a", "bc"),
    ("qwen3", "<think>Need f.\n<tool_call>x", "Need f.\n", "<tool_call>x"),  # a call ends the thinking
    ("qwen3", "<think>ok</think>", "ok", None),
    ("qwen3", "", None, ""),
    ("deepseek_r1", "Let me add.</think>The sum is 4.", "Let me add.", "The sum is 4."),
    ("deepseek_r1", "<think>Let me add.</think>4", "Let me add.", "4"),
    ("deepseek_r1", "Preamble<think>Think.</think>4", "Think.", "4"),  # before <think>: dropped
    ("deepseek_r1", "Still thinking", "Still thinking", None),  # no </think>: all reasoning
    ("deepseek_r1", "</think>4", None, "4"),
    ("deepseek_r1", "Done.</think>", "Done.", None),
    ("deepseek_r1", "Ünïcode</think>ok", "Ünïcode", "ok"),
    ("deepseek_r1", "a\n\nb</think>\n\nc", "a\n\nb", "\n\nc"),
    ("deepseek_r1", "x</think>y</think>z", "x", "y</think>z"),
    ("deepseek_r1", "<think>", None, None),
    (
        "openai_gptoss",
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
        "Easy.",
        "4",
    ),
    ("openai_gptoss", "<|channel|>final<|message|>4<|return|>", None, "4"),
    (
        "openai_gptoss",
        "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done",
        "One.\nTwo.",
        "Done",
    ),
    ("openai_gptoss", "<|channel|>analysis<|message|>Cut sho", "Cut sho", None),
    (
        "gpt_oss",
        "<|channel|>analysis<|message|>日本<|end|><|start|>assistant<|channel|>final<|message|>はい",
        "日本",
        "はい",
    ),
    ("openai_gptoss", "no harmony here", None, "no harmony here"),
    (
        "openai_gptoss",
        "<|channel|>analysis<|message|>Call f.<|end|><|start|>assistant<|channel|>commentary to=functions.f "
        '<|constrain|>json<|message|>{"n": 1}<|call|>',
        "Call f.",
        None,
    ),
    ("openai_gptoss", "<|channel|>commentary<|message|>Preamble.<|end|>", None, "Preamble."),
    (
        "openai_gptoss",
        "<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>x",
        None,
        "x",
    ),
    (
        "openai_gptoss",
        "<|channel|>final<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b",
        None,
        "a\nb",
    ),
]


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), REASONING)
def test_each_reasoning_parser_splits_the_thinking(
    name: str, text: str, reasoning: str | None, content: str | None
) -> None:
    tool = "openai" if name in ("openai_gptoss", "gpt_oss") else "hermes"
    reply = parse(text, tool, name)
    assert (reply.reasoning, reply.content) == (reasoning, content)


def test_reasoning_then_calls_from_the_rest() -> None:
    text = (
        "<think>The user wants weather.</think>\n\n<tool_call>\n<function=f>\n"
        "<parameter=n>\n2\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    reply = parse(text, "qwen3_coder", "qwen3", tools=TOOLS)
    assert (reply.reasoning, reply.content, reply.calls) == (
        "The user wants weather.",
        None,
        [("f", {"n": 2})],
    )
    harmony = (
        "<|channel|>analysis<|message|>Call f.<|end|><|start|>assistant<|channel|>commentary to=functions.f "
        '<|constrain|>json<|message|>{"n": 1}<|call|>'
    )
    reply = parse(harmony, "openai", "openai_gptoss", tools=TOOLS)
    assert (reply.reasoning, reply.content, reply.calls) == ("Call f.", None, [("f", {"n": 1})])


def test_unknown_names_are_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown tool parser 'qwen4'.*hermes.*qwen3_coder"):
        reply_parser("qwen4")
    with pytest.raises(ValueError, match=r"unknown reasoning parser 'r2'.*deepseek_r1.*qwen3"):
        parse("x", reasoning_parser="r2")
    with pytest.raises(ValueError, match="unknown tool parser"):
        agl.serving.PolicyServer(ScriptedEngine(["x"], tokenizer="bytes"), tool_parser="nope")


TEMPLATES = [  # snippets of the real templates, with the markers detect reads
    (
        '{%- if tools %}<tools>{{ tool | tojson }}</tools>\n<tool_call>\n{"name": ...}</tool_call>',
        ("hermes", None),
    ),
    (
        "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}<parameter=...>{%- if enable_thinking %}"
        "<think>\\n",
        ("qwen3_coder", "qwen3"),
    ),
    (
        "{%- if tools %}<tool_call>{{ tool_call | tojson }}</tool_call>{{ '<think>\\n\\n</think>' }}",
        ("hermes", "qwen3"),
    ),
    (
        "[gMASK]<sop>{{ '<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key>"
        "<arg_value>{{ v }}</arg_value><think>",
        ("glm45", "qwen3"),
    ),
    ('{{- "<|python_tag|>" }}{"name": "...", "parameters": ...}<|eot_id|>', ("llama3_json", None)),
    (
        'Respond in the format {"name": function name, "parameters": dictionary of argument '
        "name and its value}",
        ("llama3_json", None),
    ),
    (
        "{{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}{{- '[TOOL_CALLS]' }}",
        ("mistral", None),
    ),
    (
        "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tc.name + '<｜tool▁sep｜>'}}"
        "{% if thinking %}<think>",
        ("deepseek_v31", "qwen3"),
    ),
    ("{{'<｜Assistant｜><think>\\n'}}<｜tool▁calls▁begin｜>", ("deepseek_v31", "deepseek_r1")),
    (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.{{ name }}:{{ i }}<think>",
        ("kimi_k2", "qwen3"),
    ),
    ("{{- '<|start|>assistant<|channel|>analysis<|message|>' }}to=functions.", ("openai", "openai_gptoss")),
    (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}",
        ("hermes", None),
    ),
    ("{%- if enable_thinking %}<think>{% endif %}", ("hermes", "qwen3")),
    (None, ("hermes", None)),
]


@pytest.mark.parametrize(("template", "picked"), TEMPLATES)
def test_detect_reads_the_family_from_the_chat_template(template: str | None, picked: tuple) -> None:
    assert detect(template) == picked


def test_detect_reads_every_template_of_a_dict() -> None:
    assert detect({"default": "{{ m.content }}", "tool_use": "<tool_call>"}) == ("hermes", None)
    assert detect({"default": "[TOOL_CALLS]"}) == ("mistral", None)


def test_auto_names_its_pick_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="agentlightning_lite.serving.parsers"):
        parser = parsers.auto_parser("{{ tools }}<tool_call>\n<function=x><think>")
    assert (parser.name, parser.reasoning_parser, parser.picked) == ("qwen3_coder", "qwen3", "auto")
    assert "tool parser 'qwen3_coder', reasoning parser 'qwen3'" in caplog.text
    assert "from the chat template's markers" in caplog.text
    named = parsers.auto_parser("{{ tools }}<tool_call>", tool_parser="pythonic", reasoning_parser=None)
    assert (named.name, named.reasoning_parser, named.picked) == ("pythonic", None, "named")


def test_auto_reads_hermes_where_the_server_writes_its_own_tool_prompt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A template that renders no ``tools`` gets the server's tool prompt (``<tool_call>`` blocks): ``auto``
    reads those, whatever call markers the template shows, and says why; a named parser is kept, warned."""
    template = "{% for m in messages %}{{ m.content }}{% endfor %}[TOOL_CALLS][THINK]"
    assert detect(template) == ("mistral", "mistral")  # the markers alone
    with caplog.at_level("INFO", logger="agentlightning_lite.serving.parsers"):
        parser = parsers.auto_parser(template)
    assert (parser.name, parser.reasoning_parser, parser.picked) == ("hermes", "mistral", "auto")
    assert "renders no tools" in caplog.text and "point to 'mistral'" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    caplog.clear()
    with caplog.at_level("INFO", logger="agentlightning_lite.serving.parsers"):
        named = parsers.auto_parser(template, tool_parser="mistral")
    assert (named.name, named.reasoning_parser) == ("mistral", "mistral")
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "renders no tools" in warning.getMessage() and "'mistral'" in warning.getMessage()
    caplog.clear()
    with caplog.at_level("INFO", logger="agentlightning_lite.serving.parsers"):
        parsers.auto_parser(template, tool_parser="hermes")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # hermes is what is asked for


def test_the_default_for_smollm2_stays_the_hermes_reading(smol_tokenizer: Any) -> None:
    server = agl.serving.PolicyServer(ScriptedEngine(["x"], tokenizer=smol_tokenizer))
    assert (server.reply_parser.name, server.reply_parser.reasoning_parser) == ("hermes", None)
    assert server.reply_parser.special_tokens is False


def _client(llm: agl.serving.LLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)


def test_a_qwen3_coder_server_returns_parsed_calls_and_records_the_parser(serve: Any, store: Any) -> None:
    reply = (
        "<tool_call>\n<function=f>\n<parameter=n>\n4\n</parameter>\n<parameter=s>\nParís\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    engine = ScriptedEngine([reply], tokenizer="bytes")
    server = serve(engine, store, tool_parser="qwen3_coder", reasoning_parser=None)
    ro = store.start_rollout("t", mode="train")
    llm = server.llm(ro.rollout_id)
    out = _client(llm).chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": "go"}], tools=TOOLS
    )
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == [
        ("f", '{"n": 4, "s": "París"}')
    ]
    (span,) = [s for s in store.spans(ro.rollout_id) if s.kind == "llm"]
    assert (span.attributes["tool_parser"], span.attributes["reasoning_parser"]) == ("qwen3_coder", None)
    assert span.response_token_ids == [*engine.encode(reply), engine.tokenizer.eos_token_id]


def test_a_qwen3_reasoning_server_answers_reasoning_content(serve: Any, store: Any) -> None:
    engine = ScriptedEngine(["<think>2+2 is 4.</think>\n\nThe answer is 4."], tokenizer="bytes")
    server = serve(engine, store, tool_parser="hermes", reasoning_parser="qwen3")
    ro = store.start_rollout("t", mode="train")
    llm = server.llm(ro.rollout_id)
    out = _client(llm).chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": "2+2?"}]
    )
    msg = out.choices[0].message
    assert msg.content == "The answer is 4."
    assert msg.model_extra["reasoning_content"] == "2+2 is 4."
    (span,) = [s for s in store.spans(ro.rollout_id) if s.kind == "llm"]
    assert span.output == {
        "role": "assistant",
        "content": "The answer is 4.",
        "reasoning_content": "2+2 is 4.",
    }
    assert span.attributes["reasoning_parser"] == "qwen3"
    assert engine.decode(span.response_token_ids) == "<think>2+2 is 4.</think>\n\nThe answer is 4."
    stream = _client(llm).chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": "2+2?"}], stream=True
    )
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert [
        d.model_extra.get("reasoning_content") for d in deltas if d.model_extra.get("reasoning_content")
    ] == ["2+2 is 4."]
    assert "".join(d.content or "" for d in deltas) == "The answer is 4."


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_responses_and_messages_answer_the_reasoning_as_their_own_items(serve: Any, store: Any) -> None:
    pytest.importorskip("anthropic")
    engine = ScriptedEngine(["<think>Plan: greet.</think>\n\nHello!"], tokenizer="bytes")
    server = serve(engine, store, tool_parser="hermes", reasoning_parser="qwen3")
    llm = server.llm(store.start_rollout("t", mode="train").rollout_id)
    resp = _client(llm).responses.create(model=llm.model, input="hi")
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == "Plan: greet." and resp.output_text == "Hello!"
    events = list(_client(llm).responses.create(model=llm.model, input="hi", stream=True))
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    client: Any = llm.anthropic_client(max_retries=0)
    msg = client.messages.create(model=llm.model, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in msg.content] == [
        ("thinking", "Plan: greet."),
        ("text", "Hello!"),
    ]
    with client.messages.stream(
        model=llm.model, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[
        0
    ].thinking == "Plan: greet."


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("[THINK]Add them.[/THINK]The sum is 4.", "Add them.", "The sum is 4."),
        ("The sum is 4.", None, "The sum is 4."),  # no [THINK]: all answer
        ("[THINK]Still adding", "Still adding", None),  # cut short while thinking
        ("Well.[THINK]Add.[/THINK] 4", "Add.", "Well. 4"),  # text before [THINK] stays answer
    ],
)
def test_mistral_reasoning_splits_think_tokens(text: str, reasoning: str | None, content: str | None) -> None:
    reply = parse(text, "mistral", "mistral")
    assert (reply.reasoning, reply.content) == (reasoning, content)


def test_mistral_reads_a_call_with_its_call_id_and_makes_nine_character_ids() -> None:
    reply = parse('[TOOL_CALLS]get_weather[CALL_ID]Kp3x9QaZ1[ARGS]{"city": "Paris"}</s>', "mistral")
    assert reply.calls == [("get_weather", {"city": "Paris"})]
    ids = {c["id"] for c in parse("[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{}", "mistral").tool_calls}
    assert len(ids) == 2 and all(len(i) == 9 and i.isalnum() for i in ids)
    assert parse("[THINK]x[/THINK]", "mistral", "mistral").calls == []
