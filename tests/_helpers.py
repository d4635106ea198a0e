"""Builders the tests share: the tiny random-init Llama over the byte tokenizer, and LoRA weight snapshots.

Test modules import them relatively (``from .._helpers import tiny_llama``); the fixtures in
``tests/conftest.py`` (``tiny_llama``, ``tiny_engine``) are built on them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[1] / "src")

#: the byte tokenizer's ids: 256 bytes, then <|im_start|> (256) and <|im_end|> (257, EOS and padding)
BYTE_VOCAB = 258
BYTE_EOS = 257


def tiny_llama(
    *,
    hidden_size: int = 32,
    intermediate_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
    vocab_size: int = BYTE_VOCAB,
    **config: Any,
) -> Any:
    """A random-init ``LlamaForCausalLM`` (seed 0, eval mode) over the byte tokenizer's 258 ids.

    The defaults make a two-layer model of about 40k parameters that builds in milliseconds; any
    ``LlamaConfig`` field can be overridden. The same arguments give the same weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    options: dict[str, Any] = {"pad_token_id": BYTE_EOS, "eos_token_id": BYTE_EOS}
    options.update(config)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        **options,
    )
    return LlamaForCausalLM(cfg).eval()


def lora_weights(model: Any, adapter: str | None = None) -> dict[str, Any]:
    """A detached copy of the LoRA matrices of ``model`` (a PEFT model or a trainer's ``policy``),
    by parameter name; only those of ``adapter`` when given."""
    return {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if "lora_" in n and (adapter is None or f".{adapter}." in n)
    }


@contextmanager
def grads_at_step(optimizer: Any, named: Iterable[tuple[str, Any]]) -> Iterator[dict[str, Any]]:
    """While open: the gradients of the ``named`` parameters as the latest ``optimizer.step()`` saw
    them (an update zeroes them after its step), by name."""
    params = list(named)
    seen: dict[str, Any] = {}
    step = optimizer.step

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.clear()
        seen.update({n: p.grad.detach().clone() for n, p in params if p.grad is not None})
        return step(*args, **kwargs)

    optimizer.step = recording
    try:
        yield seen
    finally:
        del optimizer.step  # the class's own again


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest absolute difference between two snapshots of the same parameters."""
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def leave_after_launch() -> None:
    """End a worker started by a launcher (``WORLD_SIZE`` set) without the interpreter's teardown: after
    its process group is closed, a gloo rank sometimes aborts there ("terminate called without an
    active exception", 2 of 8 runs under load; pytorch/pytorch#179291)."""
    import os

    if "WORLD_SIZE" in os.environ:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def tiny_smol_dir(path: Path, **config: Any) -> Path:
    """A model directory at ``path``: the tiny Llama on SmolLM2's tokenizer (loads by path like a
    hub model: ``HFEngine(str(path))``, ``Trainer(model=str(path))``, ``vllm serve path``); ``config``
    overrides :func:`tiny_llama`'s (``max_position_embeddings=8192``: SmolLM2's context)."""
    from agentlightning_lite.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    options = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.eos_token_id, **config}
    model = tiny_llama(vocab_size=len(tok), **options)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


#: the body of a stand-in ``vllm`` executable that serves ``vllm serve MODEL --port P
#: --served-model-name N ...`` with the HF engine behind a PolicyServer (which speaks the vLLM routes
#: the engines use); with ``$AGL_TEST_LAUNCHES`` set, each start appends a JSON line to that file
FAKE_VLLM_HF = """
if "AGL_TEST_LAUNCHES" in os.environ:
    with open(os.environ["AGL_TEST_LAUNCHES"], "a") as f:
        f.write(json.dumps({{"pid": os.getpid(), "rank": os.environ.get("RANK")}}) + "\\n")
sys.path.insert(0, {root!r})
args = sys.argv[1:]
flags = dict(zip(args[2::2], args[3::2]))
import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import HFEngine
engine = HFEngine(args[1], model_name=flags["--served-model-name"], num_threads=1, seed=0)
PolicyServer(engine, agl.MemoryStore(), port=int(flags["--port"])).serve_forever()
"""


def fake_vllm(tmp_path: Path, body: str | None = None) -> Path:
    """A directory holding a ``vllm`` executable that runs ``body`` (Python; default: serve the model
    with the HF engine, :data:`FAKE_VLLM_HF`) instead of vLLM: put it first on ``PATH``."""
    if body is None:
        body = FAKE_VLLM_HF.format(root=SRC)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport sys, os, json\n{body}\n")
    exe.chmod(0o755)
    return bin_dir


def standin_vllm_trainer(tmp_path: Path, monkeypatch: Any, **options: Any) -> Any:
    """``agl.Trainer(engine="vllm")`` on the tiny Llama over SmolLM2's tokenizer (``tmp_path/tiny-smol``),
    its server a stand-in ``vllm`` (:func:`fake_vllm`) found first on ``PATH``: GRPO groups of 2,
    2 tasks a step, LoRA r=4, a memory store, output in ``tmp_path/run``, no loggers; ``options``
    add to or replace these."""
    import os

    import agentlightning_lite as agl
    from agentlightning_lite.rl.config import LoggingConfig

    monkeypatch.setenv("PATH", f"{fake_vllm(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", SRC)
    settings: dict[str, Any] = {
        "model": str(tiny_smol_dir(tmp_path / "tiny-smol")),
        "engine": "vllm",
        "engine_options": {"max_model_len": 512, "check_version": False, "log_dir": str(tmp_path / "logs")},
        "algorithm": agl.GRPO(group_size=2, lr=5e-2),
        "lora": agl.LoRA(r=4, alpha=8),
        "batch_size": 2,
        "store": agl.MemoryStore(),
        "output_dir": tmp_path / "run",
        "logging_config": LoggingConfig(loggers=[]),
    }
    return agl.Trainer(**(settings | options))
