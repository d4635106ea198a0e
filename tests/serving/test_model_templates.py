# ruff: noqa: RUF001  (DeepSeek's markers are written with full-width bars)
"""The chat templates the models themselves ship (``templates/SOURCES.md``) through the server's rendering
and parsing: a conversation with tools, an earlier call and its result renders; ``detect`` picks the
family's parsers; a call as the template writes it for an earlier turn parses back; and what each
template does that a trainer should know (docs/models.md, "Real templates tested")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from agentlightning_lite.serving import parsers
from agentlightning_lite.serving.chat_format import (
    ChatFormatError,
    prepare_messages,
    render_chat,
    template_supports_tools,
)

from ._families import (
    ARGS,
    BY_NAME,
    CALL,
    CONVERSATION,
    FAMILIES,
    RESULT,
    TEMPLATES,
    TOOLS,
    USER,
    ModelFamily,
)

IDS = [f.name for f in FAMILIES]


def tokenizer(family: ModelFamily) -> PreTrainedTokenizerFast:
    """A tokenizer carrying the family's template (a one-word vocabulary: only the rendering is tested)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
        chat_template=family.text(),
        bos_token=family.bos or None,
        eos_token=family.eos,
        unk_token="<unk>",
    )


def written_call(family: ModelFamily, call: dict | None = None, **template: object) -> str:
    """The assistant turn the template writes for an earlier call (as the server renders history),
    up to the token that ends a reply."""
    tok = tokenizer(family)
    generation_prompt = render_chat(tok, [USER], tools=TOOLS)
    assert generation_prompt.endswith(family.turn_start)
    history = prepare_messages(
        [USER, {"role": "assistant", "content": None, "tool_calls": [call or CALL]}],
        TOOLS,
        native_tools=family.native,
    )
    called = tok.apply_chat_template(
        history,
        tools=TOOLS if family.native else None,
        tokenize=False,
        add_generation_prompt=False,
        **template,
    )
    assert isinstance(called, str) and called.startswith(generation_prompt), called
    return called[len(generation_prompt) :].split(family.eos)[0]


def test_every_model_template_has_its_source_recorded() -> None:
    sources = (TEMPLATES / "SOURCES.md").read_text(encoding="utf-8")
    for family in FAMILIES:
        (row,) = [line for line in sources.splitlines() if line.startswith(f"| `{family.template}`")]
        assert "llama.cpp" in row and f"models/templates/{family.template}" in row, row
        assert any(len(cell.strip(" `")) == 40 for cell in row.split("|")), row  # the commit
        assert any(lic in row for lic in ("Apache-2.0", "MIT", "Llama 3.1 Community License")), row


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_detect_picks_the_family_parsers(family: ModelFamily) -> None:
    assert parsers.detect(family.text()) == (family.tool_parser, family.reasoning_parser)


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_the_prompt_carries_the_tools_the_earlier_call_and_its_result(family: ModelFamily) -> None:
    tok = tokenizer(family)
    assert template_supports_tools(tok) == family.native
    prompt = render_chat(tok, CONVERSATION, tools=TOOLS)
    assert prompt.startswith(family.bos) and prompt.endswith(family.resume or family.turn_start), prompt[-80:]
    assert "get_weather" in prompt and "How many days ahead." in prompt  # the tool, as offered
    history = prompt[prompt.index(USER["content"]) :]
    assert "Paris" in history and "days" in history  # the earlier call's arguments
    assert history.index("get_weather") < history.index(RESULT)  # the call, then its result


@pytest.mark.parametrize(
    "family", [f for f in FAMILIES if f.native], ids=[f.name for f in FAMILIES if f.native]
)
def test_a_call_as_the_template_writes_it_parses_back(family: ModelFamily) -> None:
    reply = written_call(family)
    parsed = parsers.reply_parser(family.tool_parser, family.reasoning_parser).parse(reply, TOOLS)
    assert parsed.calls == [("get_weather", ARGS)], reply
    assert not parsed.tool_parse_failed and not (parsed.content or "").strip(), reply


@pytest.mark.parametrize("name", ["qwen3", "glm-4.6", "ministral-3-reasoning", "gpt-oss"])
@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_the_thinking_of_an_earlier_turn_sent_back_is_in_the_next_prompt(name: str, key: str) -> None:
    """An assistant message's thinking sent back (``reasoning_content``, as the server answers it and the
    OpenAI client keeps it; ``reasoning``, newer vLLM's name) reaches the template, which writes it for
    the turns after the last user message (the tool loop): the next prompt starts with the previous
    prompt + reply. Without it the thinking is gone and trajectory mode splits there."""
    family = BY_NAME[name]
    turn = {"role": "assistant", "content": None, "tool_calls": [CALL], key: "The tool knows."}
    prompt = render_chat(tokenizer(family), [USER, turn, CONVERSATION[2]], tools=TOOLS)
    assert "The tool knows." in prompt and "get_weather" in prompt
    assert prompt.index("The tool knows.") < prompt.index(RESULT)
    without = {k: v for k, v in turn.items() if k != key}
    assert "The tool knows." not in render_chat(
        tokenizer(family), [USER, without, CONVERSATION[2]], tools=TOOLS
    )


def test_a_thinking_reply_is_a_prefix_of_the_next_qwen3_prompt_when_its_thinking_comes_back() -> None:
    family = BY_NAME["qwen3"]
    tok = tokenizer(family)
    first = render_chat(tok, [USER], tools=TOOLS)
    reply = family.reply.removesuffix(family.eos)
    parsed = parsers.reply_parser("hermes", "qwen3").parse(reply, TOOLS)
    turn = {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls}
    result = {"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"], "content": RESULT}
    back = render_chat(tok, [USER, {**turn, "reasoning_content": parsed.reasoning}, result], tools=TOOLS)
    assert back.startswith(first + reply + family.eos)
    assert not render_chat(tok, [USER, turn, result], tools=TOOLS).startswith(first + reply)


def test_a_thinking_turn_of_an_earlier_user_message_is_dropped_by_qwen3() -> None:
    """Qwen3 keeps thinking only after the last user message: a later question drops it, as the model
    was trained (the prompt is then not an extension of the earlier one, whatever the agent sends)."""
    family = BY_NAME["qwen3"]
    turn = {"role": "assistant", "content": "Sunny.", "reasoning_content": "The tool knows."}
    later = {"role": "user", "content": "And in Rome?"}
    assert "The tool knows." not in render_chat(tokenizer(family), [USER, turn, later], tools=TOOLS)


def test_qwen3_writes_an_empty_think_block_on_the_last_turn_only() -> None:
    """Qwen3's template closes an empty thinking block on the final assistant turn, and on no earlier one
    without thinking: the same reply renders differently as last message and as history."""
    family = BY_NAME["qwen3"]
    last = written_call(family)
    assert last.startswith("<think>\n\n</think>\n\n<tool_call>")
    prompt = render_chat(tokenizer(family), CONVERSATION, tools=TOOLS)
    assert "<think>" not in prompt and "<|im_start|>assistant\n<tool_call>" in prompt


def test_llama31_takes_one_call_per_turn_and_sends_results_as_json_text() -> None:
    family = BY_NAME["llama3.1"]
    two = {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "Kp3x9QaZ2"}]}
    with pytest.raises(ChatFormatError, match="single tool-calls"):
        render_chat(tokenizer(family), [USER, two], tools=TOOLS)
    prompt = render_chat(tokenizer(family), CONVERSATION, tools=TOOLS)
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"Sunny, 24 degrees Celsius"<|eot_id|>' in prompt
    # the tools are in the first user message, not the system prompt
    assert prompt.index("get_weather") > prompt.index("<|start_header_id|>user")
    assert written_call(family) == json.dumps({"name": "get_weather", "parameters": ARGS})  # no python_tag


def test_mistral_small_takes_only_nine_character_call_ids_which_the_mistral_parser_makes() -> None:
    family = BY_NAME["mistral-small-3.2"]
    openai_style = {**CALL, "id": "call_0123456789abcdef01234567"}
    with pytest.raises(ChatFormatError, match="length 9"):
        render_chat(
            tokenizer(family), [USER, {"role": "assistant", "tool_calls": [openai_style]}], tools=TOOLS
        )
    parsed = parsers.reply_parser("mistral").parse(f"[TOOL_CALLS]get_weather[ARGS]{json.dumps(ARGS)}", TOOLS)
    served = parsed.tool_calls[0]
    assert len(served["id"]) == 9 and served["id"].isalnum()
    history = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [served]},
        {"role": "tool", "tool_call_id": served["id"], "content": RESULT},
    ]
    prompt = render_chat(tokenizer(family), history, tools=TOOLS)
    assert f"[TOOL_CALLS]get_weather[CALL_ID]{served['id']}[ARGS]" in prompt
    assert prompt.endswith(f"[TOOL_RESULTS]{served['id']}[TOOL_CONTENT]{RESULT}[/TOOL_RESULTS]")


def test_ministral_reasoning_describes_its_think_tokens_and_writes_calls_without_ids() -> None:
    family = BY_NAME["ministral-3-reasoning"]
    prompt = render_chat(tokenizer(family), CONVERSATION, tools=TOOLS)
    assert prompt.startswith("<s>[SYSTEM_PROMPT]") and "[THINK]Your thoughts" in prompt  # its default system
    assert (
        f"[TOOL_CALLS]get_weather[ARGS]{json.dumps(ARGS)}</s>[TOOL_RESULTS]{RESULT}[/TOOL_RESULTS]" in prompt
    )
    reply = parsers.parse(
        f"[THINK]The tool knows.[/THINK][TOOL_CALLS]get_weather[ARGS]{json.dumps(ARGS)}", "mistral", "mistral"
    )
    assert (reply.reasoning, reply.content, reply.calls) == ("The tool knows.", None, [("get_weather", ARGS)])


def test_deepseek_v31_renders_no_tools_so_the_server_describes_them_and_auto_reads_hermes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DeepSeek-V3.1's own template never reads ``tools`` (its model card has the caller describe them in
    the system prompt): the server puts its own tool prompt (asking for ``<tool_call>`` blocks) in the
    system message and writes earlier calls that way, so ``auto`` reads replies with ``hermes`` (its
    markers alone point to ``deepseek_v31``) and says why; a named ``deepseek_v31`` is kept, with a
    warning. The template's own call form needs the arguments as JSON text."""
    family = BY_NAME["deepseek-v3.1"]
    tok = tokenizer(family)
    assert not template_supports_tools(tok) and family.served_tool_parser == "hermes"
    prompt = render_chat(tok, CONVERSATION, tools=TOOLS)
    assert "<tool_call>" in prompt and "tool▁calls▁begin" not in prompt
    hermes_form = written_call(family)
    with caplog.at_level("INFO", logger="agentlightning_lite.serving.parsers"):
        auto = parsers.auto_parser(family.text())
    assert (auto.name, auto.reasoning_parser) == ("hermes", "qwen3")
    assert "renders no tools" in caplog.text and "point to 'deepseek_v31'" in caplog.text
    assert auto.parse(hermes_form, TOOLS).calls == [("get_weather", ARGS)]
    assert auto.parse(f"<think>The tool knows.</think>{hermes_form}", TOOLS).reasoning == "The tool knows."
    caplog.clear()
    with caplog.at_level("WARNING", logger="agentlightning_lite.serving.parsers"):
        named = parsers.auto_parser(family.text(), tool_parser="deepseek_v31")
    assert named.name == "deepseek_v31" and "renders no tools" in caplog.text
    assert named.parse(hermes_form, TOOLS).calls == []  # what the warning is about
    tok = tokenizer(family)
    as_object = {**CALL, "function": {"name": "get_weather", "arguments": ARGS}}
    with pytest.raises(TypeError, match="concatenate"):
        tok.apply_chat_template(
            [USER, {"role": "assistant", "content": "", "tool_calls": [as_object]}], tokenize=False
        )
    own = tok.apply_chat_template(
        [USER, {"role": "assistant", "content": "", "tool_calls": [CALL]}], tokenize=False
    )
    assert isinstance(own, str)
    reply = own[own.rindex("<｜Assistant｜></think>") + len(family.turn_start) :].split(family.eos)[0]
    assert reply.startswith("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>")
    assert parsers.reply_parser("deepseek_v31", "qwen3").parse(reply, TOOLS).calls == [("get_weather", ARGS)]


def test_kimi_k2_needs_arguments_as_an_object() -> None:
    """Kimi K2's template writes ``arguments | tojson``: the server passes them as an object (written as
    JSON once); given as JSON text they are written encoded twice, and the call would not parse back."""
    family = BY_NAME["kimi-k2"]
    end = f"<|tool_call_argument_begin|>{json.dumps(ARGS)}<|tool_call_end|><|tool_calls_section_end|>"
    assert written_call(family).endswith(end)
    turn = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    raw = tokenizer(family).apply_chat_template([USER, turn], tokenize=False)
    assert isinstance(raw, str) and json.dumps(json.dumps(ARGS)) in raw
    twice = raw[raw.rindex("<|im_middle|>") + len("<|im_middle|>") :].split(family.eos)[0]
    assert parsers.reply_parser("kimi_k2").parse(twice, TOOLS).calls == []


def test_gpt_oss_writes_history_calls_in_another_header_order_than_the_model() -> None:
    """gpt-oss's template writes an earlier call as ``assistant to=functions.NAME<|channel|>commentary
    json``; the model writes ``<|channel|>commentary to=functions.NAME <|constrain|>json``: both parse to
    the same call, but the rendered history is not the tokens the model generated."""
    family = BY_NAME["gpt-oss"]
    history = written_call(family)
    assert history == f" to=functions.get_weather<|channel|>commentary json<|message|>{json.dumps(ARGS)}"
    generated = (
        f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{json.dumps(ARGS)}"
    )
    for text in (history, generated):
        assert parsers.reply_parser("openai", "openai_gptoss").parse(text, TOOLS).calls == [
            ("get_weather", ARGS)
        ]
    prompt = render_chat(tokenizer(family), CONVERSATION, tools=TOOLS)
    assert (
        f'<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{RESULT}"<|end|>'
        in prompt
    )


@pytest.mark.parametrize(
    ("name", "closed"),
    [
        ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        ("glm-4.6", "<|assistant|>\n<think></think>"),
    ],
)
def test_thinking_turned_off_closes_an_empty_think_block_in_the_prompt(name: str, closed: str) -> None:
    """``chat_template_kwargs={"enable_thinking": False}`` makes the template close an empty thinking block
    at the end of the prompt; the reply is then the answer alone, which ``qwen3`` reads as all answer."""
    family = BY_NAME[name]
    prompt = render_chat(tokenizer(family), [USER], tools=TOOLS, enable_thinking=False)
    assert prompt.endswith(closed)
    assert not render_chat(tokenizer(family), [USER], tools=TOOLS).endswith(closed)
    reply = parsers.reply_parser(family.tool_parser, "qwen3").parse("It will be sunny.", TOOLS)
    assert (reply.reasoning, reply.content) == (None, "It will be sunny.")


def _prompts(store: Any, rollout_id: str) -> list[str]:
    return [s.attributes["prompt_text"] for s in store.spans(rollout_id) if s.kind == "llm"]


@pytest.mark.slow  # three dialects through a server and their real clients (the clients load slowly)
def test_every_dialect_sends_the_thinking_back_to_the_qwen3_template(serve: Any, store: Any) -> None:
    """The thinking a reply wrote comes back as each client returns it: the Chat Completions message
    object (``reasoning_content``, which the OpenAI client keeps as an extra field), the Responses
    ``reasoning`` output item, the Messages ``thinking`` block; each reaches Qwen3's template, which
    writes it for the turn of the current tool loop."""
    from agentlightning_lite.serving.engines import ScriptedEngine

    from ._families import tokenizer as family_tokenizer

    family = BY_NAME["qwen3"]
    reply = family.reply.removesuffix(family.eos)
    server = serve(ScriptedEngine([reply], tokenizer=family_tokenizer(family)), store)
    assert (server.reply_parser.name, server.reply_parser.reasoning_parser) == ("hermes", "qwen3")
    thought = "<think>\nThe tool knows.\n</think>"

    ro = store.start_rollout("t", mode="train")
    llm = server.llm(ro.rollout_id)
    client = llm.openai_client(max_retries=0)
    message = client.chat.completions.create(model=llm.model, messages=[USER], tools=TOOLS).choices[0].message
    (call,) = message.tool_calls or []
    history: list[Any] = [USER, message, {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    client.chat.completions.create(model=llm.model, messages=history, tools=TOOLS)
    first, second = _prompts(store, ro.rollout_id)
    assert second.startswith(first + reply) and thought in second

    ro = store.start_rollout("t", mode="train")
    llm = server.llm(ro.rollout_id)
    client = llm.openai_client(max_retries=0)
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    resp = client.responses.create(model=llm.model, input=[USER], tools=tools)  # type: ignore[list-item]
    assert [item.type for item in resp.output] == ["reasoning", "function_call"]
    fc = resp.output[1]
    items = [USER, *resp.output, {"type": "function_call_output", "call_id": fc.call_id, "output": RESULT}]  # type: ignore[union-attr]
    client.responses.create(model=llm.model, input=items, tools=tools)  # type: ignore[arg-type]
    first, second = _prompts(store, ro.rollout_id)
    assert thought in second and second.startswith(first + "<think>")

    anthropic = pytest.importorskip("anthropic")
    assert anthropic
    ro = store.start_rollout("t", mode="train")
    llm = server.llm(ro.rollout_id)
    claude: Any = llm.anthropic_client(max_retries=0)
    anthropic_tools = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
    msg = claude.messages.create(model=llm.model, max_tokens=256, messages=[USER], tools=anthropic_tools)
    assert [b.type for b in msg.content] == ["thinking", "tool_use"]
    result = {"type": "tool_result", "tool_use_id": msg.content[1].id, "content": RESULT}
    claude.messages.create(
        model=llm.model,
        max_tokens=256,
        tools=anthropic_tools,
        messages=[USER, {"role": "assistant", "content": msg.content}, {"role": "user", "content": [result]}],
    )
    first, second = _prompts(store, ro.rollout_id)
    assert thought in second and second.startswith(first + "<think>")


def test_thinking_that_is_not_text_is_a_clear_error() -> None:
    turn = {"role": "assistant", "content": "Sunny.", "reasoning_content": ["not", "text"]}
    with pytest.raises(ChatFormatError, match=r"messages\[1\]\.reasoning_content must be a string"):
        prepare_messages([USER, turn])


@pytest.mark.parametrize("tool_parser", ["hermes", "qwen3_coder", "glm45"])
def test_markers_that_are_special_tokens_survive_the_decode(serve: Any, store: Any, tool_parser: str) -> None:
    """A tokenizer that marks ``<tool_call>`` and ``<think>`` (and GLM's argument tags) special: the
    plain decode drops them, so the server reads the reply decoded with those markers and no other special
    token; the agent gets the call and the thinking, and no stray special token in its content."""
    import dataclasses

    from agentlightning_lite.serving.engines import ScriptedEngine

    from ._families import tokenizer as family_tokenizer

    markers = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<arg_key>", "</arg_key>", "<arg_value>",
               "</arg_value>")  # fmt: skip
    family = dataclasses.replace(BY_NAME["qwen3"], special=("<|im_start|>", "<|im_end|>", *markers), plain=())
    tok = family_tokenizer(family)
    assert (
        tok.decode(
            tok.encode("<think>x</think><tool_call>", add_special_tokens=False), skip_special_tokens=True
        )
        == "x"
    )
    call = {
        "hermes": f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': ARGS})}\n</tool_call>",
        "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
    }[tool_parser]
    replies = [f"<think>The tool knows.</think>\n\n{call}", "<think>Done.</think>\n\nSunny.<|im_start|>"]
    engine = ScriptedEngine(replies, tokenizer=tok)
    server = serve(engine, store, tool_parser=tool_parser, reasoning_parser="qwen3")
    kept = {"hermes": markers[:4], "qwen3_coder": markers[:4], "glm45": markers}[tool_parser]
    assert server.reply_markers == {tok.convert_tokens_to_ids(t): t for t in kept}
    ro = store.start_rollout("t", mode="train")
    llm = server.llm(ro.rollout_id)
    client = llm.openai_client(max_retries=0)
    first = client.chat.completions.create(model=llm.model, messages=[USER], tools=TOOLS).choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in first.tool_calls or []] == [
        ("get_weather", ARGS)
    ]
    assert first.content is None and (first.model_extra or {}).get("reasoning_content") == "The tool knows."
    second = client.chat.completions.create(model=llm.model, messages=[USER], tools=TOOLS).choices[0].message
    assert second.content == "Sunny." and (second.model_extra or {}).get("reasoning_content") == "Done."
    stream = client.chat.completions.create(model=llm.model, messages=[USER], tools=TOOLS, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]  # the scripted replies cycle: the call again
    assert [
        c.function.name for d in deltas for c in d.tool_calls or [] if c.function and c.function.name
    ] == ["get_weather"]
    assert not "".join(d.content or "" for d in deltas)
    spans = [s for s in store.spans(ro.rollout_id) if s.kind == "llm"]
    assert tok.decode(spans[1].response_token_ids).endswith(
        "Sunny.<|im_start|><|im_end|>"
    )  # the tokens stay whole
    assert not any(s.attributes.get("tool_parse_failed") for s in spans)


def test_a_plain_decode_is_kept_where_the_markers_are_text(serve: Any, store: Any) -> None:
    from agentlightning_lite.serving.engines import ScriptedEngine

    from ._families import tokenizer as family_tokenizer

    server = serve(ScriptedEngine(["x"], tokenizer=family_tokenizer(BY_NAME["qwen3"])), store)
    assert server.reply_markers == {}  # Qwen3's own tokenizer: <tool_call> and <think> are not special
