"""Real tool chat templates (vLLM's ``examples/``, see ``templates/SOURCES.md``) through the server's
rendering and parsing: a conversation with tools, an earlier call and its result renders with all
three; ``detect`` picks the family's parsers; a call as the template writes it parses back."""

# ruff: noqa: RUF001, RUF003  (DeepSeek's markers are written with full-width bars)
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from agentlightning_lite.serving import parsers
from agentlightning_lite.serving.chat_format import prepare_messages, render_chat

TEMPLATES = Path(__file__).parent / "templates"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city."},
                    "days": {"type": "integer", "description": "How many days ahead."},
                },
                "required": ["city"],
            },
        },
    }
]
ARGS = {"city": "Paris", "days": 2}
CALL_ID = "call0abc123"  # Mistral's templates want ids of 9 characters or more
CALL = {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}
USER = {"role": "user", "content": "How will the weather be in the capital of France in two days?"}
RESULT = "Sunny, 24 degrees Celsius"
CONVERSATION = [
    USER,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": RESULT},
]


@dataclass(frozen=True)
class Family:
    template: str  # file under templates/
    tool_parser: str  # what detect() picks (docs/models.md)
    reasoning_parser: str | None
    reply_parser: str  # the parser of the family (pythonic is named, not detected)
    turn_start: str  # where the assistant's turn begins (the end of the generation prompt)
    eos: str  # the end-of-turn token: generation stops there
    bos: str = ""
    resume: str = ""  # what a prompt ending with a tool result ends with (default: turn_start)
    args: dict[str, Any] = field(default_factory=lambda: dict(ARGS))  # of the call parsed back


FAMILIES = [
    Family("hermes.jinja", "hermes", None, "hermes", "<|im_start|>assistant\n", "<|im_end|>"),
    Family("qwen3coder.jinja", "qwen3_coder", None, "qwen3_coder", "<|im_start|>assistant\n", "<|im_end|>"),
    Family(
        "llama3.1_json.jinja",
        "llama3_json",
        None,
        "llama3_json",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|>",
        "<|begin_of_text|>",
    ),
    Family(
        "llama3.2_pythonic.jinja",
        "hermes",  # no marker of its own: auto falls back to hermes; name --tool-call-parser pythonic
        None,
        "pythonic",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|>",
        "<|begin_of_text|>",
        # the template writes a string argument bare (city=Paris: not a Python literal, which no
        # pythonic parser reads), so the call parsed back has a number only
        args={"days": 2},
    ),
    # Mistral and DeepSeek V3.1 have the model go on right after a tool result (no new turn header)
    Family("mistral_parallel.jinja", "mistral", None, "mistral", "[/INST]", "</s>", "<s>", "[/TOOL_RESULTS]"),
    Family(
        "deepseekv31.jinja",
        "deepseek_v31",
        "qwen3",  # V3.1 thinks when asked to (the template reads `thinking`)
        "deepseek_v31",
        "</think>",  # the generation prompt is "<｜Assistant｜>    </think>" (the template's spaces)
        "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>",
        "<｜tool▁output▁end｜>",
    ),
]
IDS = [f.template.removesuffix(".jinja") for f in FAMILIES]


def tokenizer(family: Family) -> PreTrainedTokenizerFast:
    """A Hugging Face tokenizer carrying the family's chat template (a one-word vocabulary: only the
    template's rendering is under test)."""
    backend = Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=(TEMPLATES / family.template).read_text(encoding="utf-8"),
        bos_token=family.bos or None,
        eos_token=family.eos,
        unk_token="<unk>",
    )


def test_every_template_has_its_source_recorded() -> None:
    sources = (TEMPLATES / "SOURCES.md").read_text(encoding="utf-8")
    files = sorted(f.template for f in FAMILIES)  # the models' own templates: test_model_templates.py
    for name in files:
        row = next(line for line in sources.splitlines() if f"`{name}`" in line)
        assert "vllm-project/vllm" in row and "Apache-2.0" in row
        assert any(len(cell.strip(" `")) == 40 for cell in row.split("|")), row  # the commit


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_detect_picks_the_family_parsers(family: Family) -> None:
    template = (TEMPLATES / family.template).read_text(encoding="utf-8")
    assert parsers.detect(template) == (family.tool_parser, family.reasoning_parser)


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_the_prompt_carries_the_tools_the_earlier_call_and_its_result(family: Family) -> None:
    prompt = render_chat(tokenizer(family), CONVERSATION, tools=TOOLS)
    assert prompt.lstrip().startswith(family.bos) and prompt.endswith(family.resume or family.turn_start)
    assert "get_weather" in prompt and "How many days ahead." in prompt  # the tool, as offered
    history = prompt[prompt.index(USER["content"]) :]
    assert "Paris" in history and "days" in history  # the earlier call's arguments
    assert history.index("get_weather") < history.index(RESULT)  # the call, then its result
    assert prompt.count("get_weather") >= 2  # offered, then called


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_a_call_as_the_template_writes_it_parses_back(family: Family) -> None:
    tok = tokenizer(family)
    generation_prompt = render_chat(tok, [USER], tools=TOOLS)
    assert generation_prompt.endswith(family.turn_start)
    call = {**CALL, "function": {"name": "get_weather", "arguments": json.dumps(family.args)}}
    history = prepare_messages(
        [USER, {"role": "assistant", "content": None, "tool_calls": [call]}], TOOLS, native_tools=True
    )
    called = tok.apply_chat_template(
        history,
        tools=TOOLS,
        tokenize=False,
        add_generation_prompt=False,
    )
    assert isinstance(called, str)
    if not family.resume:  # Mistral moves its system text; DeepSeek spaces its generation prompt
        assert called.startswith(generation_prompt)
    turn = called[called.rindex(family.turn_start) + len(family.turn_start) :]
    reply = turn.split(family.eos)[0]  # the engine stops at the end-of-turn token
    assert "get_weather" in reply
    parser = parsers.reply_parser(family.reply_parser, family.reasoning_parser)
    parsed = parser.parse(reply, TOOLS)
    assert parsed.calls == [("get_weather", family.args)], reply
    assert not parsed.tool_parse_failed
    assert not (parsed.content or "").strip(), reply
