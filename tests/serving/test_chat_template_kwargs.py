"""``chat_template_kwargs`` of a Chat Completions body reach the chat template (as vLLM's do)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import httpx
import jinja2

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import ScriptedEngine
from agentlightning_lite.serving.tokenizer import ByteTokenizer

# Qwen3's switch, cut down: the generation prompt gets an empty think block when thinking is off
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


class ThinkingSwitchTokenizer(ByteTokenizer):
    """The byte tokenizer with a jinja chat template that reads ``enable_thinking``."""

    chat_template = TEMPLATE

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> Any:
        text = jinja2.Template(TEMPLATE).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **kwargs
        )
        return self.encode(text) if tokenize else text


def test_chat_template_kwargs_reach_the_template_and_the_span(serve: Callable[..., PolicyServer]) -> None:
    store = agl.MemoryStore()
    server = serve(ScriptedEngine(["4"], tokenizer=ThinkingSwitchTokenizer()), store)
    rollout_id = store.start_rollout("2+2?").rollout_id
    llm = server.llm(rollout_id)
    body = {"model": llm.model, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 4}
    with httpx.Client(base_url=llm.base_url, timeout=30) as http:
        off = http.post("/chat/completions", json=body | {"chat_template_kwargs": {"enable_thinking": False}})
        plain = http.post("/chat/completions", json=body)
        bad = http.post("/chat/completions", json=body | {"chat_template_kwargs": ["enable_thinking"]})
    assert off.status_code == 200 and plain.status_code == 200
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "chat_template_kwargs"
    assert "must be an object" in bad.json()["error"]["message"]
    first, second = [s for s in store.spans(rollout_id) if s.kind == "llm"]
    assert first.attributes["prompt_text"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert first.attributes["params"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert second.attributes["prompt_text"].endswith("<|im_start|>assistant\n")
    assert "chat_template_kwargs" not in second.attributes["params"]
    assert first.prompt_token_ids == server.engine.encode(first.attributes["prompt_text"])
