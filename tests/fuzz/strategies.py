"""Hypothesis strategies shared by the fuzz tests: JSON of every shape, hostile text and numbers."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

#: numbers a client may send: huge, negative, fractional, and the floats JSON cannot hold
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2**31, 2**63, -(2**63) - 1, 1e308, 5e-324]),
)
#: text with lone surrogates, control characters and non-BMP code points
hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec=None, categories=None), max_size=20),
    st.sampled_from(["", "\ud800", "a\udfffb", "\x00", "\u202e", "😀" * 5, "@", "scripted@", "x" * 300]),
)
json_scalars = st.one_of(st.none(), st.booleans(), numbers, hostile_text)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=12,
)


def _message() -> st.SearchStrategy[Any]:
    plausible = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "robot"])},
        optional={
            "content": st.one_of(
                hostile_text,
                st.none(),
                st.lists(
                    st.fixed_dictionaries(
                        {"type": st.sampled_from(["text", "image_url", "x"])}, optional={"text": json_values}
                    ),
                    max_size=3,
                ),
                json_values,
            ),
            "name": json_values,
            "tool_calls": json_values,
            "tool_call_id": json_values,
        },
    )
    return st.one_of(plausible, json_values)


messages = st.one_of(st.lists(_message(), max_size=4), json_values)
tools = st.one_of(
    json_values,
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["function", "other"])},
            optional={
                "function": st.one_of(
                    json_values,
                    st.fixed_dictionaries(
                        {"name": hostile_text},
                        optional={"parameters": json_values, "description": json_values},
                    ),
                )
            },
        ),
        max_size=3,
    ),
)


def field(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A request field: mostly a plausible value, sometimes any JSON at all."""
    return st.one_of(plausible, json_values)


chat_body = st.fixed_dictionaries(
    {},
    optional={
        "model": field(st.sampled_from(["scripted", "scripted@solver", "other", ""])),
        "messages": messages,
        "n": field(st.integers(-2, 20)),
        "temperature": field(numbers),
        "top_p": field(numbers),
        "max_tokens": field(st.integers(-5, 10**10)),
        "max_completion_tokens": field(st.integers(-5, 50)),
        "stop": field(st.one_of(hostile_text, st.lists(hostile_text, max_size=3))),
        "seed": field(numbers),
        "logprobs": field(st.booleans()),
        "top_logprobs": field(st.integers(-3, 30)),
        "stream": field(st.booleans()),
        "stream_options": field(st.fixed_dictionaries({"include_usage": json_values})),
        "tools": tools,
        "tool_choice": field(st.sampled_from(["auto", "none", "required", {"type": "function"}])),
    },
)
completion_body = st.fixed_dictionaries(
    {},
    optional={
        "model": field(st.sampled_from(["scripted", "other"])),
        "prompt": field(
            st.one_of(
                hostile_text,
                st.lists(hostile_text, max_size=3),
                st.lists(st.integers(-5, 2**40), max_size=5),
                st.lists(st.lists(st.integers(-5, 400), max_size=4), max_size=3),
            )
        ),
        "n": field(st.integers(-2, 20)),
        "max_tokens": field(st.integers(-5, 10**10)),
        "logprobs": field(st.integers(-2, 30)),
        "echo": field(st.booleans()),
        "suffix": json_values,
        "best_of": json_values,
        "stream": field(st.booleans()),
        "temperature": field(numbers),
    },
)
