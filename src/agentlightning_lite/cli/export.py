"""``agl-lite export``: a trained adapter as a PEFT folder, or merged into its base model.

``CHECKPOINT`` is any of: a checkpoint (``output_dir/checkpoints/step-N``), the ``checkpoints``
folder or the run's ``output_dir`` (the newest checkpoint in it, else its saved ``adapter``), or a
PEFT adapter folder. Without ``--merged``, ``OUT`` is a PEFT adapter folder
(``adapter_config.json`` + ``adapter_model.safetensors``) that ``PeftModel.from_pretrained`` and
``vllm serve --enable-lora --lora-modules NAME=OUT`` load. With ``--merged``, ``OUT`` is a full
model folder (safetensors weights, config, generation config, tokenizer) with the adapter merged
into the base weights, which ``AutoModelForCausalLM.from_pretrained(OUT)`` loads offline. Both get
a ``README.md`` model card with the run's figures from its ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from ._common import EXIT_USAGE, CLIError

_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a trained adapter as a PEFT folder, or merged into a full model (--merged)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="a checkpoint, checkpoints folder, run folder or adapter"
    )
    p.add_argument("out", metavar="OUT", help="the folder to write (must not exist, or be empty)")
    p.add_argument("--merged", action="store_true", help="merge the adapter into the base model's weights")
    p.add_argument(
        "--model",
        default=None,
        help="the base model (name, Hugging Face id or path; default: the adapter's base_model_name_or_path)",
    )
    p.add_argument("--policy", default=None, help="which adapter of a multi-agent checkpoint (policies/NAME)")
    p.add_argument("--force", action="store_true", help="write into OUT even when it holds files")


# -- finding the adapter ----------------------------------------------------------------------------
def _is_adapter(path: Path) -> bool:
    return all((path / f).is_file() for f in _ADAPTER_FILES)


def find_adapter(path: str | Path, policy: str | None = None) -> tuple[Path, Path | None]:
    """The adapter folder that ``path`` names, and the run folder it came from (``None`` if unknown)."""
    p = Path(path)
    if not p.exists():
        raise CLIError(f"no such file or folder: {p}", EXIT_USAGE)
    if _is_adapter(p):
        run = p.parent if p.name == "adapter" else None
        if p.parent.name == "adapters":  # output_dir/adapters/<agent>
            run = p.parent.parent
        return p, run
    if (p / "trainer_state.json").is_file():  # a checkpoint: output_dir/checkpoints/step-N
        run = p.parent.parent if p.parent.name == "checkpoints" else None
        return _in_checkpoint(p, policy), run
    if (p / "checkpoints").is_dir() or (p / "adapter").is_dir() or (p / "adapters").is_dir():
        from ..rl.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(p / "checkpoints") if (p / "checkpoints").is_dir() else None
        if ckpt is not None:
            return _in_checkpoint(ckpt, policy), p
        if _is_adapter(p / "adapter") and policy is None:
            return p / "adapter", p
        if (p / "adapters").is_dir():
            return _pick(p / "adapters", policy, lambda d: d), p
        raise CLIError(f"{p} holds no checkpoint and no saved adapter", EXIT_USAGE)
    if p.name == "checkpoints":
        from ..rl.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(p)
        if ckpt is None:
            raise CLIError(f"{p} holds no complete checkpoint", EXIT_USAGE)
        return _in_checkpoint(ckpt, policy), p.parent
    raise CLIError(
        f"{p} is not a checkpoint, a run folder or a PEFT adapter folder (no {' / '.join(_ADAPTER_FILES)})",
        EXIT_USAGE,
    )


def _in_checkpoint(ckpt: Path, policy: str | None) -> Path:
    if (ckpt / "policies").is_dir():
        return _pick(ckpt / "policies", policy, lambda d: d / "adapter")
    if policy is not None:
        raise CLIError(f"{ckpt} holds one adapter, not one per policy: leave out --policy", EXIT_USAGE)
    if not _is_adapter(ckpt / "adapter"):
        raise CLIError(f"{ckpt} has no adapter/ folder with {' and '.join(_ADAPTER_FILES)}", EXIT_USAGE)
    return ckpt / "adapter"


def _pick(root: Path, policy: str | None, inner: Any) -> Path:
    names = sorted(d.name for d in root.iterdir() if d.is_dir() and _is_adapter(inner(d)))
    if policy is None:
        if len(names) == 1:
            return Path(inner(root / names[0]))
        raise CLIError(f"{root} holds the adapters {names}: choose one with --policy NAME", EXIT_USAGE)
    if policy not in names:
        raise CLIError(f"{root} has no adapter {policy!r} (it has {names})", EXIT_USAGE)
    return Path(inner(root / policy))


def _base_model(adapter: Path, override: str | None, required: bool) -> str | None:
    if override:
        return override
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    base = cfg.get("base_model_name_or_path")
    if not base:
        if required:
            raise CLIError(f"{adapter}/adapter_config.json names no base model: pass --model", EXIT_USAGE)
        return None
    folder = Path(base)
    if folder.is_dir() and not (folder / "config.json").exists():
        ggufs = sorted(folder.glob("*.gguf"))
        if len(ggufs) == 1:  # a GGUF model (smollm2-135m): transformers loads it from the file
            return str(ggufs[0])
    return str(base)


def _known_hf_id(base: str | None) -> str | None:
    """The Hugging Face id of a model the SDK knows (``smollm2-135m``: its GGUF file or the directory it
    was converted to): what vLLM serves as the base."""
    if base is None:
        return None
    from ..models import known_model

    spec = known_model(base)
    return spec.hf_id if spec is not None else None


# -- the model card -----------------------------------------------------------------------------------
def _figures(run: Path | None) -> dict[str, Any]:
    if run is None or not (run / "metrics.jsonl").is_file():
        return {}
    rows = []
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line the trainer was still writing
        if isinstance(row, dict):
            rows.append(row)
    out: dict[str, Any] = {"run": str(run), "steps": len({r.get("step") for r in rows if "step" in r})}
    for key in ("train/reward_mean", "val/reward_mean", "val/success_rate", "train/loss", "train/kl"):
        vals = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if vals:
            out[key] = {"first": vals[0], "last": vals[-1]}
            if key.startswith("val/"):
                out[key]["best"] = max(vals, key=lambda v: v[1])
    return out


def _step_line(adapter: Path) -> list[str]:
    """``- trained for N steps`` when the adapter comes from a checkpoint (its trainer_state.json)."""
    for folder in (adapter.parent, adapter.parent.parent.parent):  # step-N/adapter, step-N/policies/X/adapter
        state = folder / "trainer_state.json"
        if state.is_file():
            try:
                return [f"- checkpoint after step {int(json.loads(state.read_text())['step'])}"]
            except (ValueError, KeyError, TypeError):
                return []
    return []


def _card(base: str | None, merged: bool, adapter: Path, figures: dict[str, Any]) -> str:
    lines = [
        "---",
        *([f"base_model: {json.dumps(base)}"] if base else []),
        f"library_name: {'transformers' if merged else 'peft'}",
        "tags: [agentlightning-lite, reinforcement-learning, lora]",
        "---",
        "",
        f"# {'Merged model' if merged else 'LoRA adapter'} trained with agentlightning-lite",
        "",
        f"- base model: `{base}`" if base else "- base model: not recorded (the model the run trained)",
        f"- adapter: `{adapter}`" + (" (merged into the base weights)" if merged else ""),
        *_step_line(adapter),
        f"- exported: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        "",
    ]
    if figures:
        lines += [f"## The run ({figures['run']}, {figures['steps']} logged steps)", ""]
        lines += ["| metric | first (step) | last (step) | best (step) |", "| --- | --- | --- | --- |"]
        for key, v in figures.items():
            if not isinstance(v, dict):
                continue
            cell = lambda x: f"{x[1]:.4g} ({x[0]})" if x else "-"  # noqa: E731
            lines.append(f"| {key} | {cell(v['first'])} | {cell(v['last'])} | {cell(v.get('best'))} |")
        lines.append("")
    else:
        lines += ["No metrics.jsonl was found beside the checkpoint: no figures.", ""]
    if merged:
        lines += [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "model = AutoModelForCausalLM.from_pretrained('OUT')",
            "tokenizer = AutoTokenizer.from_pretrained('OUT')",
            "```",
        ]
    else:
        lines += ["Serve it with vLLM: `vllm serve BASE --enable-lora --lora-modules agent=OUT`."]
    return "\n".join(lines) + "\n"


# -- the command ----------------------------------------------------------------------------------------
def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not force)):
        raise CLIError(f"{out} exists and is not an empty folder (pass --force to write into it)", EXIT_USAGE)
    out.mkdir(parents=True, exist_ok=True)


def export_adapter(adapter: Path, out: Path, base: str | None = None) -> Path:
    """Copy a PEFT adapter folder to ``out`` (recording ``base`` as its base model when given)."""
    for name in _ADAPTER_FILES:
        shutil.copyfile(adapter / name, out / name)
    if base is not None:
        cfg = json.loads((out / "adapter_config.json").read_text())
        cfg["base_model_name_or_path"] = base
        (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return out


def export_merged(adapter: Path, out: Path, base: str) -> Path:
    """Load ``base``, apply the adapter, merge it into the weights and save the full model to ``out``."""
    from peft import PeftModel

    from ..models import forget_gguf_quantizer, load_model, load_tokenizer

    model = load_model(base, device="cpu")
    model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    forget_gguf_quantizer(model)
    model.save_pretrained(str(out), safe_serialization=True)
    gen = getattr(model, "generation_config", None)
    if gen is not None and not (out / "generation_config.json").exists():
        gen.save_pretrained(str(out))
    tok = load_tokenizer(base)
    if not hasattr(tok, "save_pretrained"):
        raise CLIError(f"the tokenizer of {base} cannot be saved (not a transformers tokenizer)")
    tok.save_pretrained(str(out))
    return out


def export(args: argparse.Namespace) -> int:
    """Run ``agl-lite export``."""
    adapter, run = find_adapter(args.checkpoint, args.policy)
    out = Path(args.out)
    _prepare_out(out, args.force)
    base = _base_model(adapter, args.model, required=args.merged)
    if args.merged:
        assert base is not None
        print(f"agl-lite: merging {adapter} into {base}...", file=sys.stderr, flush=True)
        export_merged(adapter, out, base)
    else:
        export_adapter(adapter, out, args.model or _known_hf_id(base))
    (out / "README.md").write_text(_card(base, args.merged, adapter, _figures(run)))
    what = "merged model" if args.merged else "PEFT adapter"
    print(f"agl-lite: wrote the {what} to {out}", file=sys.stderr, flush=True)
    return 0
