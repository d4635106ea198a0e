"""Checkpoints a killed run can resume from: adapter, optimiser, value head, RNG, data position, step.

Everything is written with safetensors or JSON, or ``torch.save`` of plain tensors loaded back with
``weights_only=True``: nothing is unpickled. A checkpoint directory appears atomically (written to a
temporary name, then renamed), so a run killed while saving leaves the previous one intact.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..store.base import Store
    from .policies import Policy

__all__ = [
    "latest_checkpoint",
    "load_checkpoint",
    "policy_states",
    "resume_latest",
    "rng_state",
    "save_adapter",
    "save_checkpoint",
    "save_policies",
    "set_rng_state",
]

logger = logging.getLogger(__name__)

_PREFIX = "step-"


def rng_state() -> dict[str, Any]:
    """Python's and torch's random states (numpy's too when installed), JSON/tensor friendly."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        np_state = np.random.get_state()
        assert isinstance(np_state, tuple)  # the global RandomState is an MT19937: the legacy tuple
        kind, keys, pos, has_gauss, cached = np_state
        state["numpy"] = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    except ImportError:  # pragma: no cover
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def save_adapter(model: Any, adapter: str, path: str | os.PathLike[str]) -> Path:
    """Write one adapter of a multi-adapter peft model as a standalone peft adapter directory
    (``adapter_config.json`` + ``adapter_model.safetensors``), loadable with ``PeftModel.from_pretrained``.
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(model, adapter_name=adapter, save_embedding_layers=False)
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in state.items()}, str(out / "adapter_model.safetensors")
    )
    model.peft_config[adapter].save_pretrained(str(out))
    return out


def _save_policy(
    path: Path, model: Any, adapter: str | None, optimizer: Any, value_head: torch.nn.Module | None
) -> None:
    if adapter is None:
        model.save_pretrained(str(path / "adapter"), safe_serialization=True)
    else:
        save_adapter(model, adapter, path / "adapter")
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    if value_head is not None:
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in value_head.state_dict().items()},
            str(path / "value_head.safetensors"),
        )


def save_checkpoint(
    directory: str | os.PathLike[str],
    step: int,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    trainer_state: dict[str, Any],
    value_head: torch.nn.Module | None = None,
    keep: int | None = 3,
    policies: dict[str, tuple[torch.optim.Optimizer, torch.nn.Module | None]] | None = None,
) -> Path:
    """Write ``directory/step-N`` (adapter, optimiser, value head, RNG, state); keep the last ``keep``.

    With ``policies`` (adapter name -> its optimiser and value head: one adapter per agent), each
    adapter is written to ``step-N/policies/<name>/`` with its own optimiser and value head instead.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{step:06d}"
    tmp = root / f".tmp-{_PREFIX}{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if policies is None:
        _save_policy(tmp, model, None, optimizer, value_head)
    else:
        for name, (opt, head) in policies.items():
            (tmp / "policies" / name).mkdir(parents=True)
            _save_policy(tmp / "policies" / name, model, name, opt, head)
    rng = rng_state()
    tensors = {k: rng[k] for k in ("torch", "cuda") if k in rng}  # tensors (loaded weights_only)
    torch.save(tensors, tmp / "rng_torch.pt")
    meta = {**trainer_state, "step": step, "rng": {k: rng[k] for k in ("python", "numpy") if k in rng}}
    (tmp / "trainer_state.json").write_text(json.dumps(meta))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    if keep is not None:
        for old in sorted(root.glob(f"{_PREFIX}*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The newest complete ``step-N`` directory, or ``None``."""
    root = Path(directory)
    if not root.is_dir():
        return None
    done = [p for p in sorted(root.glob(f"{_PREFIX}*")) if (p / "trainer_state.json").is_file()]
    return done[-1] if done else None


def _load_policy(
    path: Path, model: Any, adapter: str | None, optimizer: Any, value_head: torch.nn.Module | None
) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(path / "adapter" / "adapter_model.safetensors"))
    if adapter is None:
        set_peft_model_state_dict(model, weights)
    else:
        set_peft_model_state_dict(model, weights, adapter_name=adapter)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    if value_head is not None and (path / "value_head.safetensors").is_file():
        value_head.load_state_dict(load_file(str(path / "value_head.safetensors")))


def load_checkpoint(
    path: str | os.PathLike[str],
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    value_head: torch.nn.Module | None = None,
    policies: dict[str, tuple[torch.optim.Optimizer, torch.nn.Module | None]] | None = None,
) -> dict[str, Any]:
    """Load adapter weights, optimiser, value head and RNG from ``path``; return the trainer state.

    With ``policies`` (as for :func:`save_checkpoint`), every adapter's own files are loaded.
    """
    path = Path(path)
    if policies is None:
        _load_policy(path, model, None, optimizer, value_head)
    else:
        missing = [n for n in policies if not (path / "policies" / n).is_dir()]
        if missing:
            raise FileNotFoundError(f"checkpoint {path} has no adapter for policies {missing}")
        for name, (opt, head) in policies.items():
            _load_policy(path / "policies" / name, model, name, opt, head)
    state = json.loads((path / "trainer_state.json").read_text())
    rng = dict(state.pop("rng", {}))
    rng.update(torch.load(path / "rng_torch.pt", weights_only=True))
    set_rng_state(rng)
    return state


# -- the trainer's policies -------------------------------------------------------------------
def policy_states(policies: Sequence[Policy]) -> dict[str, tuple[torch.optim.Optimizer, Any]] | None:
    """Adapter -> (optimiser, value head) of runs with one adapter per agent (``None``: one shared)."""
    states = {p.adapter: (p.optimizer, p.value_head) for p in policies if p.adapter is not None}
    return states or None


def save_policies(
    model: Any, policies: Sequence[Policy], path: str | os.PathLike[str] | None, output_dir: Path
) -> Path:
    """Save the trained adapter(s) in peft format: the shared one to ``path`` (default
    ``output_dir/adapter``), or each agent's to ``path/<agent>`` (default ``output_dir/adapters``)."""
    if policy_states(policies) is None:
        out = Path(path) if path is not None else output_dir / "adapter"
        model.save_pretrained(str(out), safe_serialization=True)
        return out
    root = Path(path) if path is not None else output_dir / "adapters"
    for pol in policies:
        assert pol.adapter is not None
        save_adapter(model, pol.adapter, root / pol.adapter)
    return root


def resume_latest(
    store: Store,
    directory: Path,
    model: Any,
    policies: Sequence[Policy],
    apply: Callable[[Callable[[Any], None]], None],
) -> dict[str, Any] | None:
    """Resume a run: mark the rollouts a dead process left ``running`` as failed, then load the newest
    checkpoint in ``directory`` into ``model`` and the policies' optimisers through ``apply`` (the
    weight hand-over, so the engine serves it). Returns its trainer state, or ``None`` without one."""
    from ..store.recovery import INTERRUPTED, recover_interrupted

    interrupted = recover_interrupted(store)
    if interrupted:
        logger.warning(
            "marked %d rollout(s) left running by a process that died as failed (%s)",
            len(interrupted),
            INTERRUPTED,
        )
    ckpt = latest_checkpoint(directory)
    if ckpt is None:
        logger.warning("resume=True but no checkpoint in %s: starting fresh", directory)
        return None
    state: dict[str, Any] = {}
    single = policies[0] if len(policies) == 1 else None
    optimizer = single.optimizer if single is not None else None
    head = single.value_head if single is not None else None

    def restore(_model: Any) -> None:
        state.update(load_checkpoint(ckpt, model, optimizer, head, policies=policy_states(policies)))

    apply(restore)
    logger.info("resumed from %s (step %d)", ckpt, state["step"])
    return state
