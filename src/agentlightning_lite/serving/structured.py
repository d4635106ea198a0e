"""Structured outputs: the OpenAI ``response_format`` of a request, and its grammar for constrained decoding.

``{"type": "json_object"}`` asks for any JSON object; ``{"type": "json_schema", "json_schema":
{"name": ..., "schema": {...}, "strict": ...}}`` for JSON that validates against ``schema``;
``{"type": "text"}`` (or nothing) for free text. The HF engine enforces a format while decoding:
each step it samples only tokens that keep the reply a prefix of a valid document, with masks from
`llguidance <https://github.com/guidance-ai/llguidance>`_ (a JSON-schema-to-grammar compiler and
token-mask engine; the ``serve`` extra installs it). vLLM enforces it with its own structured outputs.

>>> fmt = parse_response_format({"type": "json_schema", "json_schema": {"name": "answer",
...     "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}})
>>> fmt.type, fmt.name
('json_schema', 'answer')
>>> parse_response_format({"type": "text"}) is None
True
>>> parse_response_format({"type": "yaml"})
Traceback (most recent call last):
...
agentlightning_lite.serving.structured.ResponseFormatError: 'response_format.type' must be 'text', \
'json_object' or 'json_schema', got 'yaml'
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError

__all__ = [
    "ResponseFormat",
    "ResponseFormatError",
    "check_grammar",
    "grammar",
    "ll_tokenizer",
    "parse_response_format",
    "text_fits",
    "tool_names",
]

INSTALL_HINT = "constrained decoding needs llguidance: pip install llguidance (part of the 'serve' extra)"


class ResponseFormatError(InvalidRequestError):
    """A ``response_format`` that is malformed or that the engine cannot honour (answered with a 400
    whose ``param`` is ``"response_format"``)."""


@dataclass(frozen=True)
class ResponseFormat:
    """A checked ``response_format``: ``type`` is ``"json_object"`` or ``"json_schema"`` (with ``schema``)."""

    type: str
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool | None = None

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema the reply must satisfy (``{"type": "object"}`` for ``json_object``)."""
        return self.schema if self.schema is not None else {"type": "object"}

    def record(self) -> dict[str, Any]:
        """What the ``llm`` span keeps in ``attributes["response_format"]``."""
        out: dict[str, Any] = {"type": self.type}
        if self.type == "json_schema":
            out.update(name=self.name, strict=self.strict, schema=self.schema)
        return out

    def key(self) -> str:
        """The format as a string (a cache key; the schema's key order is kept: it orders the properties)."""
        return json.dumps(self.record(), separators=(",", ":"))


def _bad(message: str) -> ResponseFormatError:
    return ResponseFormatError(message)


def parse_response_format(value: Any) -> ResponseFormat | None:
    """Read an OpenAI ``response_format``; ``None`` for free text. Raises :class:`ResponseFormatError`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad(f"'response_format' must be an object, got {type(value).__name__}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind != "json_schema":
        raise _bad(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise _bad("'response_format.json_schema' must be an object with a 'schema'")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise _bad("'response_format.json_schema.schema' must be a JSON schema object")
    name, strict = spec.get("name"), spec.get("strict")
    if name is not None and not isinstance(name, str):
        raise _bad("'response_format.json_schema.name' must be a string")
    if strict is not None and not isinstance(strict, bool):
        raise _bad("'response_format.json_schema.strict' must be a boolean")
    return ResponseFormat("json_schema", schema=schema, name=name, strict=strict)


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise ResponseFormatError(INSTALL_HINT) from exc
    return llguidance


def tool_names(tools: Sequence[dict[str, Any]] | None) -> list[str]:
    """The function names of OpenAI ``tools`` (as the chat route offers them).

    >>> tool_names([{"type": "function", "function": {"name": "calc"}}])
    ['calc']
    """
    return [t["function"]["name"] for t in tools or () if isinstance(t.get("function"), dict)]


def _tool_call_schema(tool_names: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"enum": list(tool_names)}, "arguments": {"type": "object"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


@functools.lru_cache(maxsize=256)
def _grammar(key: str, tool_names: tuple[str, ...], flexible: bool) -> str:
    ll = _llguidance()
    schema = dict(json.loads(key).get("schema") or {"type": "object"})
    # compact JSON while generating (no run-away whitespace); any whitespace when checking a text
    options = {"whitespace_flexible": flexible}
    if not tool_names:
        text = ll.LLMatcher.grammar_from_json_schema(schema, defaults=options)
    else:  # the reply is the document, or tool calls in the <tool_call> blocks the chat prompt asks for
        guided = {**schema, "x-guidance": {**schema.get("x-guidance", {}), **options}}
        call = {**_tool_call_schema(tool_names), "x-guidance": options}
        sep = '"\\n"' if not flexible else "/[ \\t\\r\\n]*/"
        lark = (
            "start: final | calls\n"
            f"final: %json {json.dumps(guided)}\n"
            f"calls: call ({sep} call)*\n"
            f'call: "<tool_call>" {sep} %json {json.dumps(call)} {sep} "</tool_call>"\n'
        )
        text = ll.LLMatcher.grammar_from_lark(lark)
    error = ll.LLMatcher.validate_grammar(text)
    if error:
        raise ResponseFormatError(f"'response_format' cannot be enforced: {error}")
    return text


def grammar(fmt: ResponseFormat, tool_names: Sequence[str] = (), flexible: bool = False) -> str:
    """The llguidance grammar of ``fmt`` (with ``tool_names``: the document, or ``<tool_call>`` blocks
    calling those tools). Raises :class:`ResponseFormatError` for a schema llguidance rejects."""
    return _grammar(fmt.key(), tuple(tool_names), flexible)


def check_grammar(fmt: ResponseFormat, tool_names: Sequence[str] = ()) -> None:
    """Raise :class:`ResponseFormatError` unless ``fmt`` compiles to a grammar."""
    grammar(fmt, tool_names)


class _Bytes:
    """A byte-level vocabulary for llguidance: tokens 0-255 are the bytes, then the special tokens."""

    def __init__(self, specials: Sequence[str], eos: int) -> None:
        self.tokens = [bytes([i]) for i in range(256)] + [s.encode() for s in specials]
        self.special_token_ids = list(range(256, 256 + len(specials)))
        self.eos_token_id = eos
        self.bos_token_id = None

    def __call__(self, data: bytes) -> list[int]:
        return list(data)


@functools.lru_cache(maxsize=1)
def _byte_tokenizer() -> Any:
    ll = _llguidance()
    return ll.LLTokenizer(ll.TokenizerWrapper(_Bytes(["<|eos|>"], 256)))


def ll_tokenizer(tokenizer: Any, n_vocab: int, eos_ids: Sequence[int]) -> Any:
    """An ``llguidance.LLTokenizer`` for an engine's tokenizer: a Hugging Face fast tokenizer, or the
    built-in byte tokenizer (:class:`~agentlightning_lite.serving.tokenizer.ByteTokenizer`).

    ``n_vocab`` is the width of the model's logits (masks cover every logit).
    """
    ll = _llguidance()
    from .tokenizer import ByteTokenizer

    eos = sorted(eos_ids) or None
    if isinstance(tokenizer, ByteTokenizer):
        wrapped = _Bytes(tokenizer.special_tokens, tokenizer.eos_token_id)
        return ll.LLTokenizer(ll.TokenizerWrapper(wrapped), n_vocab=n_vocab, eos_token=eos)
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:  # pragma: no cover - the HF engine needs transformers anyway
        PreTrainedTokenizerFast = ()  # type: ignore[assignment,misc]
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ResponseFormatError(
            f"'response_format' needs a fast Hugging Face tokenizer for constrained decoding; this engine "
            f"has a {type(tokenizer).__name__}"
        )
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=eos)


def text_fits(fmt: ResponseFormat, text: str, tool_names: Sequence[str] = ()) -> bool:
    """Whether ``text`` is a complete document of ``fmt`` (any JSON whitespace allowed).

    >>> fmt = ResponseFormat("json_schema", {"type": "object", "properties": {"a": {"enum": [1, 2]}},
    ...                                      "required": ["a"]})
    >>> text_fits(fmt, '{"a": 2}'), text_fits(fmt, '{"a": 3}'), text_fits(fmt, 'a = 2')
    (True, False, False)
    """
    ll = _llguidance()
    matcher = ll.LLMatcher(_byte_tokenizer(), grammar(fmt, tool_names, flexible=True), log_level=0)
    return bool(matcher.consume_tokens(list(text.encode("utf-8"))) and matcher.is_accepting())
