# ruff: noqa: RUF001  (DeepSeek's markers are written with full-width bars)
"""The model families' own chat templates (``templates/``, see ``templates/SOURCES.md``) and builders for
tiny random-weight models of them: a byte-level tokenizer holding the family's special tokens and chat
template, and a two-layer model of the family's architecture saved as a Hugging Face model directory."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
CALL_ID = "Kp3x9QaZ1"  # 9 letters and digits: the only ids Mistral Small 3.2's template takes
CALL = {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}
USER = {"role": "user", "content": "How will the weather be in the capital of France in two days?"}
RESULT = "Sunny, 24 degrees Celsius"
CONVERSATION = [
    USER,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": RESULT},
]
_JSON_CALL = json.dumps({"name": "get_weather", "arguments": ARGS})
# tiny mixture-of-experts settings (GLM-4.5/4.6, DeepSeek-V3, Kimi K2) and DeepSeek's latent attention
_MOE = {
    "moe_intermediate_size": 16,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
}
_MLA = {**_MOE, "q_lora_rank": None, "kv_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 4,
        "v_head_dim": 8}  # fmt: skip


@dataclass(frozen=True)
class ModelFamily:
    """One family's own chat template and what the server makes of it."""

    name: str
    template: str  # file under templates/
    tool_parser: str  # what detect() picks
    reasoning_parser: str | None
    turn_start: str  # the end of the generation prompt: where the assistant's reply begins
    eos: str  # the token that ends a reply
    bos: str = ""
    resume: str = ""  # what a prompt ending with a tool result ends with (default: turn_start)
    native: bool = True  # the template renders the tools (else the server's tool prompt does)
    special: tuple[str, ...] = ()  # the format's special tokens (added tokens of the tiny tokenizer)
    plain: tuple[str, ...] = ()  # markers that are added tokens but not special (decoded with the text)
    reply: str = ""  # a reply in the family's format: thinking (where it has one) and a call, then eos
    reasoning: str | None = None  # the thinking parsed from ``reply``
    config: str = ""  # the transformers config class of the family's architecture (tiny models)
    config_options: dict[str, Any] = field(default_factory=dict)  # what that architecture needs besides
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    ends: tuple[str, ...] = ()  # more tokens that end a reply (the generation config's eos ids)

    def text(self) -> str:
        return (TEMPLATES / self.template).read_text(encoding="utf-8")

    @property
    def served_tool_parser(self) -> str:
        """What the server reads calls with under ``auto``: the detected parser, or ``hermes`` where the
        template renders no tools (the server's own tool prompt asks for ``<tool_call>`` blocks)."""
        return self.tool_parser if self.native else "hermes"


FAMILIES = [
    ModelFamily(
        "qwen3",
        "Qwen-Qwen3-0.6B.jinja",
        "hermes",
        "qwen3",
        "<|im_start|>assistant\n",
        "<|im_end|>",
        special=("<|im_start|>", "<|im_end|>"),
        plain=("<tool_call>", "</tool_call>", "<think>", "</think>"),  # as in Qwen3's tokenizer
        reply=f"<think>\nThe tool knows.\n</think>\n\n<tool_call>\n{_JSON_CALL}\n</tool_call><|im_end|>",
        reasoning="\nThe tool knows.\n",
        config="Qwen3Config",
        config_options={"head_dim": 8},
    ),
    ModelFamily(
        "qwen3-coder",
        "Qwen3-Coder.jinja",
        "qwen3_coder",
        None,
        "<|im_start|>assistant\n",
        "<|im_end|>",
        special=("<|im_start|>", "<|im_end|>"),
        plain=("<tool_call>", "</tool_call>"),
        reply="<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>",
        config="Qwen3Config",
        config_options={"head_dim": 8},
    ),
    ModelFamily(
        "llama3.1",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "llama3_json",
        None,
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|>",
        "<|begin_of_text|>",
        special=(
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ),
        reply='<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}<|eom_id|>',
        config="LlamaConfig",
        config_options={"head_dim": 8},
        ends=("<|eom_id|>",),
    ),
    ModelFamily(
        "mistral-small-3.2",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "mistral",
        None,
        "[/INST]",
        "</s>",
        "<s>",
        "[/TOOL_RESULTS]",
        special=("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    ),
    ModelFamily(
        "ministral-3-reasoning",
        "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
        "mistral",
        "mistral",
        "[/INST]",
        "</s>",
        "<s>",
        "[/TOOL_RESULTS]",
        special=(
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "[TOOL_CALLS]",
            "[ARGS]",
            "[THINK]",
            "[/THINK]",
        ),
        reply=f"[THINK]The tool knows.[/THINK][TOOL_CALLS]get_weather[ARGS]{json.dumps(ARGS)}</s>",
        reasoning="The tool knows.",
        config="MistralConfig",
        config_options={"head_dim": 8},
    ),
    ModelFamily(
        "deepseek-v3.1",
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "deepseek_v31",
        "qwen3",
        "<｜Assistant｜></think>",
        "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>",
        native=False,  # the template renders no tools: the server describes them itself
        special=(
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>",
        ),
        plain=("<think>", "</think>"),
        # the call as the server's tool prompt asks for it (the template renders no tools)
        reply=f"<tool_call>\n{_JSON_CALL}\n</tool_call><｜end▁of▁sentence｜>",
        config="DeepseekV3Config",
        config_options=_MLA,
        lora_targets=("q_proj", "kv_b_proj"),
    ),
    ModelFamily(
        "glm-4.6",
        "GLM-4.6.jinja",
        "glm45",
        "qwen3",
        "<|assistant|>",
        "<|observation|>",
        "[gMASK]<sop>",
        special=(
            "[gMASK]",
            "<sop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|observation|>",
            "<|endoftext|>",
        ),
        # not special tokens in GLM's tokenizer (vLLM's glm45 parser says so)
        plain=(
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<tool_response>",
            "</tool_response>",
        ),
        reply="<think>The tool knows.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call><|observation|>",
        reasoning="The tool knows.",
        config="Glm4MoeConfig",
        config_options={"head_dim": 8, **_MOE},
        ends=("<|user|>", "<|endoftext|>"),
    ),
    ModelFamily(
        "kimi-k2",
        "moonshotai-Kimi-K2.jinja",
        "kimi_k2",
        None,
        "<|im_assistant|>assistant<|im_middle|>",
        "<|im_end|>",
        special=(
            "<|im_system|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_middle|>",
            "<|im_end|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        ),
        reply="<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        f"{json.dumps(ARGS)}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
        config="DeepseekV3Config",  # Kimi K2's architecture is DeepSeek-V3's
        config_options=_MLA,
        lora_targets=("q_proj", "kv_b_proj"),
    ),
    ModelFamily(
        "gpt-oss",
        "openai-gpt-oss-120b.jinja",
        "openai",
        "openai_gptoss",
        "<|start|>assistant",
        "<|call|>",
        special=(
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|return|>",
            "<|call|>",
        ),
        reply="<|channel|>analysis<|message|>The tool knows.<|end|><|start|>assistant<|channel|>commentary "
        f"to=functions.get_weather <|constrain|>json<|message|>{json.dumps(ARGS)}<|call|>",
        reasoning="The tool knows.",
        config="GptOssConfig",
        config_options={
            "head_dim": 8,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        ends=("<|return|>",),
    ),
]
BY_NAME = {f.name: f for f in FAMILIES}
#: the families built as tiny random-weight models (each architecture is in transformers)
TINY = [f for f in FAMILIES if f.config]


def tokenizer(family: ModelFamily) -> Any:
    """A byte-level tokenizer (every byte a token, no merges) holding the family's markers as added
    tokens (special or not, as the family's tokenizer has them) and its real chat template: any text
    encodes, each marker is one token."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    backend = Tokenizer(BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=family.text(),
        bos_token=family.bos or None,
        eos_token=family.eos,
        pad_token=family.eos,
    )
    tok.add_special_tokens({"additional_special_tokens": [t for t in family.special if t not in vocab]})
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.plain])
    return tok


def tiny_model_dir(family: ModelFamily, path: Path) -> Path:
    """A Hugging Face model directory at ``path``: :func:`tokenizer` and a seeded two-layer model of
    the family's architecture (hidden size 32; four experts where it is a mixture of experts)."""
    import torch
    import transformers

    tok = tokenizer(family)
    eos = tok.convert_tokens_to_ids(family.eos)
    ends = [eos, *(tok.convert_tokens_to_ids(t) for t in family.ends)]
    config = getattr(transformers, family.config)(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=ends if len(ends) > 1 else eos,
        pad_token_id=eos,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=True,
        **family.config_options,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
