"""The Tinker training backend: each training model is a peft LoRA adapter on a transformers engine's
module (the ``trainer``), trained by the project's
:class:`~agentlightning_lite.rl.learner.Learner` (one policy per training model: its adapter and its
own AdamW state, all on the one shared base model),
through the learner's primitives ``forward_backward`` / ``forward`` / ``optim_step`` and its losses
(:mod:`agentlightning_lite.rl.losses`). Sampler weights are frozen copies of an adapter, served by the
sampling engine (exact token ids and logprobs): on CPU the transformers engine itself (``engine`` is
``trainer``: it trains in place), on GPU a vLLM server (``VLLMEngine``) that loads each sampler's saved
adapter while the transformers copy trains.

LoRA: rank as the client asks, ``alpha`` 32 (Tinker does not send one), no dropout, on the modules
the client's ``train_attn`` / ``train_mlp`` / ``train_unembed`` name (:func:`lora_targets`). The learner
trains under the trainer's lock, and each optimiser step goes through ``trainer.update_weights`` (which
waits for the replies decoding now and bumps ``trainer.version``): with the engine training in place, a
sample taken after an ``optim_step`` is known to be on the new weights.

>>> backend = PeftBackend(HFEngine("smollm2-135m"), ["smollm2-135m"], "/models/smollm2")  # doctest: +SKIP
>>> backend.create_model("s:train:0", "smollm2-135m", lora_rank=8, seed=0).lora_rank  # doctest: +SKIP
8
"""

from __future__ import annotations

import collections
import itertools
import json
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..lora_settings import LoRA
from ..rl.checkpoint import save_adapter
from ..rl.datum import AdamParams
from ..rl.datum import Datum as LearnerDatum
from ..rl.engine_setup import update_autocast
from ..rl.learner import Learner
from ..rl.losses import LOSS_INPUTS, builtin_token_losses
from ..rl.policies import Policy, adapter_params
from ..rl.sft import SFT
from ..rl.weights import WeightHandOver
from ..serving.engines.contract import BackendError
from .backend import Datum, ForwardBackwardResult, ModelInfo, SampledSequence
from .futures import OpError
from .losses import required_inputs
from .sampling import gen_requests, request_settings, sequences_of

__all__ = ["ATTENTION", "LORA_ALPHA", "MLP", "UNEMBED", "PeftBackend", "lora_targets"]

LORA_ALPHA = 32  #: the LoRA scaling numerator (the update is scaled by alpha / rank)
OPTIMIZER_FILE = "optimizer.pt"
INFO_FILE = "tinker_model.json"
#: how the learner splits a forward_backward batch (the gradient is the whole batch's either way)
MICRO_BATCH_SIZE, MICRO_BATCH_TOKENS = 8, 4096


#: the projections each of Tinker's ``LoraConfig`` flags adapts (Llama-style names, which the served
#: model families share): ``train_attn``, ``train_mlp``, ``train_unembed``
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
UNEMBED = ("lm_head",)


def lora_targets(
    model: Any, train_attn: bool = True, train_mlp: bool = True, train_unembed: bool = True
) -> list[str]:
    """The module names a LoRA adapter takes for Tinker's ``LoraConfig`` flags on ``model`` (an
    :class:`~.futures.OpError` when a flag names modules the model does not have, or none is set).

    >>> import torch
    >>> class Block(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.q_proj, self.up_proj, self.lm_head = (torch.nn.Linear(2, 2) for _ in range(3))
    >>> lora_targets(Block(), train_mlp=False)
    ['q_proj', 'lm_head']
    """
    if not (train_attn or train_mlp or train_unembed):
        raise OpError("lora_config: at least one of train_attn, train_mlp and train_unembed must be true")
    present = {  # linear layers, also once wrapped by a LoRA adapter (a peft layer over a base_layer)
        name.rsplit(".", 1)[-1]
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) or isinstance(getattr(m, "base_layer", None), torch.nn.Linear)
    }
    out: list[str] = []
    for flag, names in (("train_attn", ATTENTION), ("train_mlp", MLP), ("train_unembed", UNEMBED)):
        if not {"train_attn": train_attn, "train_mlp": train_mlp, "train_unembed": train_unembed}[flag]:
            continue
        found = [n for n in names if n in present]
        if not found:
            raise OpError(f"lora_config.{flag}: this model has none of the modules {list(names)}")
        out += found
    return out


@dataclass
class _Model:
    adapter: str
    rank: int
    policy: Policy  # the learner's: the adapter and its optimiser
    targets: tuple[bool, bool, bool] = (True, True, False)  # train_attn, train_mlp, train_unembed


class PeftBackend:
    """A :class:`~.backend.TrainingBackend` over an ``HFEngine`` (its model, peft adapters, sampling),
    trained by a :class:`~agentlightning_lite.rl.learner.Learner` on the engine's own module.

    Args:
        engine: the engine that samples: an ``agl.engines.HFEngine`` (trained in place, unless
            ``trainer`` is given) or an ``agl.engines.VLLMEngine``, which loads each sampler's adapter
            from a directory.
        base_names: the names ``create_model(base_model=...)`` accepts; the first is reported.
        tokenizer_id: what ``get_info`` names as the tokenizer (a local directory loads offline).
        keep_samplers: how many unnamed sampler snapshots stay loaded; older ones are unloaded.
        trainer: the ``HFEngine`` whose module trains (default: ``engine``); with another engine, its
            copy of the same base weights.
        sampler_dir: where unnamed sampler snapshots are written for an engine that loads adapters
            from files (default: a temporary directory, removed on :meth:`close`).
        max_lora_rank: the largest rank the sampling engine serves (vLLM's ``--max-lora-rank``);
            ``None``: any.
    """

    def __init__(
        self,
        engine: Any,
        base_names: list[str],
        tokenizer_id: str,
        keep_samplers: int = 8,
        trainer: Any = None,
        sampler_dir: str | Path | None = None,
        max_lora_rank: int | None = None,
    ) -> None:
        self.engine = engine
        self.max_lora_rank = max_lora_rank
        self.trainer = trainer if trainer is not None else engine
        self.names = list(base_names)
        self.tokenizer_id = tokenizer_id
        self.keep_samplers = int(keep_samplers)
        self._models: dict[str, _Model] = {}
        self._ids = itertools.count()
        self._ephemeral: collections.deque[str] = collections.deque()
        self._retired_dirs: collections.deque[Path] = collections.deque()
        self._snapshot_version: dict[str, int] = {}  # sampler -> the trainer's version it was taken at
        self._lock = threading.Lock()
        self._learner: Learner | None = None
        self._own_sampler_dir = sampler_dir is None and not self.in_place
        self.sampler_dir = (
            None
            if self.in_place
            else Path(sampler_dir or tempfile.mkdtemp(prefix="agl-tinker-samplers-")).absolute()
        )
        engine.set_routes({}, default=None)  # requests that name no adapter get the base model

    @property
    def in_place(self) -> bool:
        """Whether the sampling engine's own module is the one trained (the transformers engine)."""
        return self.trainer is self.engine

    # -- models ---------------------------------------------------------------------------------
    def base_model_names(self) -> list[str]:
        return list(self.names)

    @property
    def learner(self) -> Learner:
        """The learner over the engine's module, with one policy per training model (built with the
        first model: the engine's module becomes a peft model then)."""
        model = self.trainer.model
        if self._learner is None or self._learner.model is not model:
            policies = self._learner.policies if self._learner is not None else []
            device = next(model.parameters()).device
            self._learner = Learner(
                model,
                policies,
                WeightHandOver(self.trainer, model),  # in place on the trainer: its version moves
                SFT(micro_batch_size=MICRO_BATCH_SIZE, micro_batch_tokens=MICRO_BATCH_TOKENS),
                autocast=update_autocast(self.trainer, device),
            )
        return self._learner

    def _model(self, model_id: str) -> _Model:
        model = self._models.get(model_id)
        if model is None:
            raise OpError(f"unknown model id {model_id!r}: create it first (create_model or load_weights)")
        return model

    def create_model(
        self,
        model_id: str,
        base_model: str,
        lora_rank: int,
        seed: int | None,
        *,
        train_attn: bool = True,
        train_mlp: bool = True,
        train_unembed: bool = True,
    ) -> ModelInfo:
        flags = {"train_attn": train_attn, "train_mlp": train_mlp, "train_unembed": train_unembed}
        for flag, value in flags.items():
            if not isinstance(value, bool):
                raise OpError(f"lora_config.{flag} must be true or false, got {value!r}")
        if base_model not in self.names:
            raise OpError(f"base_model {base_model!r} is not served here; this server trains {self.names}")
        if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or not 1 <= lora_rank <= 1024:
            raise OpError(f"lora_config.rank must be an integer in [1, 1024], got {lora_rank!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise OpError(f"lora_config.seed must be an integer, got {seed!r}")
        if model_id in self._models:
            raise OpError(f"model id {model_id!r} already exists")
        limit = self.max_lora_rank
        if limit is not None and lora_rank > limit:
            raise OpError(f"lora_config.rank {lora_rank} is above the {limit} this server's vLLM serves")
        targets = lora_targets(self.trainer.model, train_attn, train_mlp, train_unembed)
        name = f"tinker{next(self._ids)}"
        if seed is not None:
            torch.manual_seed(int(seed) % 2**63)
        lora = LoRA(r=lora_rank, alpha=LORA_ALPHA, target_modules=targets)
        with warnings.catch_warnings():
            # the unembedding's LoRA on a model whose embeddings are tied adapts the output side only,
            # as Tinker's train_unembed means (peft warns about merging such an adapter, which we never do)
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*", category=UserWarning)
            try:
                self.trainer.add_adapter(name, lora, named_only=True)
            except (ValueError, TypeError) as exc:  # peft could not adapt these modules
                raise OpError(f"a LoRA adapter on {targets} cannot be made on this model: {exc}") from None
        params = adapter_params(self.trainer.model, name)
        if not params:
            raise RuntimeError(f"the LoRA adapter {name!r} has no weights on this model")
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        policy = Policy(model_id, name, None, optimizer, None)
        self.learner.add_policy(policy)
        self._models[model_id] = _Model(name, lora_rank, policy, (train_attn, train_mlp, train_unembed))
        return self.info(model_id)

    def info(self, model_id: str) -> ModelInfo:
        model = self._model(model_id)
        attn, mlp, unembed = model.targets
        return ModelInfo(model_id, self.names[0], model.rank, self.tokenizer_id, attn, mlp, unembed)

    # -- training -------------------------------------------------------------------------------
    def _check(self, data: list[Datum], loss_fn: str) -> tuple[str, ...]:
        names = required_inputs(loss_fn)
        if not data:
            raise OpError("forward_backward got no data")
        for i, d in enumerate(data):
            if not d.tokens:
                raise OpError(f"data[{i}] has an empty model_input")
            for name in names:
                values = d.inputs.get(name)
                if values is None:
                    raise OpError(f"data[{i}] has no loss_fn_inputs[{name!r}], which {loss_fn} needs")
                if len(values) != d.length:
                    raise OpError(
                        f"data[{i}].loss_fn_inputs[{name!r}] has {len(values)} values for "
                        f"{d.length} input tokens: one per input position is expected"
                    )
            for name, values in d.inputs.items():
                if name not in names and len(values) != d.length:
                    raise OpError(
                        f"data[{i}].loss_fn_inputs[{name!r}] has {len(values)} values for "
                        f"{d.length} input tokens: one per input position is expected"
                    )
            vocab = self.trainer.vocab_size
            bad = [t for t in (*d.tokens, *d.inputs["target_tokens"]) if t < 0 or (vocab and t >= vocab)]
            if bad:
                raise OpError(f"data[{i}] has token ids outside the vocabulary (size {vocab}): {bad[:5]}")
        return names

    def forward_backward(
        self,
        model_id: str,
        data: list[Datum],
        loss_fn: str,
        loss_fn_config: dict[str, float],
        forward_only: bool = False,
    ) -> ForwardBackwardResult:
        model = self._model(model_id)
        self._check(data, loss_fn)
        try:
            batch = [LearnerDatum(d.tokens, d.inputs) for d in data]
        except ValueError as exc:
            raise OpError(str(exc)) from None
        learner = self.learner
        with self.trainer.lock:  # the learner takes it too (a re-entrant lock): no decoding meanwhile
            for p in model.policy.optimizer.param_groups[0]["params"]:
                p.requires_grad_(True)  # a sampler adapter made active by the engine may have frozen it
            call = learner.forward if forward_only else learner.forward_backward
            try:
                out = call(batch, loss_fn, loss_fn_config, policy=model_id)
            except (ValueError, FloatingPointError) as exc:
                raise OpError(str(exc)) from None
        outputs: list[dict[str, list[float]]] = []
        for d, o in zip(batch, out.loss_fn_outputs, strict=True):
            lp = o["logprobs"]
            inputs = {n: d.loss_fn_inputs[n] for n in LOSS_INPUTS[loss_fn]}
            losses = builtin_token_losses(loss_fn, lp, inputs, loss_fn_config)
            outputs.append({"logprobs": lp.tolist(), "elementwise_loss": losses.tolist()})
        return ForwardBackwardResult(outputs, dict(out.metrics))

    def optim_step(self, model_id: str, adam: AdamParams) -> dict[str, float]:
        self._model(model_id)
        return self.learner.optim_step(adam, policy=model_id)

    # -- saving and loading ---------------------------------------------------------------------
    def save_state(self, model_id: str, directory: Path, optimizer: bool = True) -> None:
        model = self._model(model_id)
        with self.trainer.lock:
            save_adapter(self.trainer.model, model.adapter, directory)
            if optimizer:
                torch.save(model.policy.optimizer.state_dict(), directory / OPTIMIZER_FILE)
        attn, mlp, unembed = model.targets
        info = {
            "base_model": self.names[0],
            "lora_rank": model.rank,
            "train_attn": attn,
            "train_mlp": mlp,
            "train_unembed": unembed,
        }
        (directory / INFO_FILE).write_text(json.dumps(info))

    def saved_info(self, directory: Path) -> dict[str, Any]:
        """What weights saved in ``directory`` were trained with: ``lora_rank`` and the
        ``train_attn`` / ``train_mlp`` / ``train_unembed`` flags (``train_unembed`` false for weights
        saved before the flags were kept)."""
        try:
            info = json.loads((directory / INFO_FILE).read_text())
            out = {"lora_rank": int(info["lora_rank"])}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise OpError(f"{directory} holds no weights saved by this server ({exc})") from exc
        defaults = {"train_attn": True, "train_mlp": True, "train_unembed": False}
        return out | {k: bool(info.get(k, v)) for k, v in defaults.items()}

    def load_state(self, model_id: str, directory: Path, optimizer: bool) -> None:
        model = self._model(model_id)
        if not (directory / "adapter_model.safetensors").is_file():
            raise OpError(f"no saved weights at {directory}")
        saved = self.saved_info(directory)
        targets = tuple(saved[k] for k in ("train_attn", "train_mlp", "train_unembed"))
        if (saved["lora_rank"], targets) != (model.rank, model.targets):
            raise OpError(
                f"the weights at {directory} are a rank-{saved['lora_rank']} adapter with "
                f"train_attn/train_mlp/train_unembed={list(targets)}; model {model_id!r} is rank "
                f"{model.rank} with {list(model.targets)}"
            )
        self.trainer.update_weights(str(directory), adapter=model.adapter)
        if optimizer:
            path = directory / OPTIMIZER_FILE
            if not path.is_file():
                raise OpError(f"the checkpoint at {directory} was saved without its optimiser state")
            model.policy.optimizer.load_state_dict(torch.load(path, weights_only=True))

    def save_for_sampler(self, model_id: str, directory: Path | None) -> str:
        model = self._model(model_id)
        with self._lock:
            name = f"sampler{next(self._ids)}"
            self._snapshot_version[name] = int(self.trainer.version)
        if directory is None:
            if self.in_place:  # a frozen copy of the adapter, on the engine's own module
                with self.engine.lock:
                    state = {k: v.detach().clone() for k, v in self._adapter_state(model.adapter).items()}
                targets = lora_targets(self.engine.model, *model.targets)
                lora = LoRA(r=model.rank, alpha=LORA_ALPHA, target_modules=targets)
                self.engine.add_adapter(name, lora, named_only=True)
                self.engine.update_weights(state, adapter=name)
            else:  # the engine loads adapters from files: a snapshot directory, removed with the sampler
                assert self.sampler_dir is not None
                self.save_state(model_id, self.sampler_dir / name, optimizer=False)
                self._serve(name, self.sampler_dir / name)
            with self._lock:
                self._ephemeral.append(name)
                old = [self._ephemeral.popleft() for _ in range(len(self._ephemeral) - self.keep_samplers)]
            for stale in old:
                self._remove_sampler(stale)
            return name
        self.save_state(model_id, directory, optimizer=False)
        self._serve(name, directory)
        return name

    def _serve(self, sampler: str, directory: Path) -> None:
        """Have the engine serve the adapter saved in ``directory`` as ``sampler``; an engine that
        loads adapters from files (vLLM) loads it now, so a refusal (a rank above the server's
        ``--max-lora-rank``, a directory it cannot read) is this call's error, not a later sample's."""
        self.engine.add_adapter(sampler, str(directory), named_only=True)
        if self.in_place:
            return
        try:
            self.engine.preload_adapter(sampler)
        except BackendError as exc:
            self.engine.remove_adapter(sampler)
            raise OpError(f"the sampling server could not load the snapshot: {exc}") from None

    def _remove_sampler(self, name: str) -> None:
        self.engine.remove_adapter(name)
        self._snapshot_version.pop(name, None)
        if self.sampler_dir is None:
            return
        # its files go once keep_samplers more have been retired after it: a sample admitted before the
        # removal may still have the server (re)load it from there
        with self._lock:
            self._retired_dirs.append(self.sampler_dir / name)
            gone = [self._retired_dirs.popleft() for _ in range(len(self._retired_dirs) - self.keep_samplers)]
        for directory in gone:
            shutil.rmtree(directory, ignore_errors=True)

    def _adapter_state(self, adapter: str) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return dict(
            get_peft_model_state_dict(self.trainer.model, adapter_name=adapter, save_embedding_layers=False)
        )

    def load_sampler(self, directory: Path) -> str:
        if not (directory / "adapter_config.json").is_file():
            raise OpError(f"no sampler weights at {directory}")
        with self._lock:
            name = f"sampler{next(self._ids)}"
        self._serve(name, directory)
        return name

    # -- sampling -------------------------------------------------------------------------------
    def _check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise OpError("the prompt is empty: give at least one token")
        vocab = self.engine.vocab_size
        bad = [t for t in prompt if t < 0 or (vocab and t >= vocab)]
        if bad:
            raise OpError(f"the prompt has token ids outside the vocabulary (size {vocab}): {bad[:5]}")

    def sample(
        self, sampler: str | None, prompt: list[int], params: dict[str, Any], num_samples: int
    ) -> list[SampledSequence]:
        if sampler is not None and sampler not in self.engine.adapters:
            raise OpError(f"the sampler weights {sampler!r} were unloaded (only the newest are kept)")
        self._check_prompt(prompt)
        settings = request_settings(params, self.engine.eos_token_ids, self.engine.max_context)
        futures: list[Any] = []
        try:
            for request in gen_requests(prompt, settings, num_samples, sampler):
                futures.append(self.engine.submit(request))
        except KeyError:  # unloaded between the check above and the submission
            for f in futures:
                self.engine.cancel(f)
            raise OpError(
                f"the sampler weights {sampler!r} were unloaded (only the newest are kept)"
            ) from None
        seqs = sequences_of([f.result() for f in futures])
        if not self.in_place:  # the engine's own version never moves: say which trained weights these are
            version = None if sampler is None else self._snapshot_version.get(sampler)
            for seq in seqs:
                seq.weights_version = version
        return seqs

    def prompt_logprobs(self, sampler: str | None, prompt: list[int]) -> list[float | None]:
        if not prompt:
            return []
        if sampler is not None and sampler not in self.engine.adapters:
            raise OpError(f"the sampler weights {sampler!r} were unloaded (only the newest are kept)")
        self._check_prompt(prompt)
        if not self.in_place:  # the sampling engine scores them (vLLM's prompt_logprobs)
            try:
                return list(self.engine.prompt_logprobs(prompt, adapter=sampler))
            except KeyError:
                raise OpError(
                    f"the sampler weights {sampler!r} were unloaded (only the newest are kept)"
                ) from None
        with self.engine.lock, self.engine.using_adapter(sampler) as m, torch.no_grad():
            device = next(m.parameters()).device
            ids = torch.tensor([prompt], device=device)
            logits = m(input_ids=ids).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
        return [None, *lp.tolist()]

    def weights_version(self) -> int:
        return int(self.trainer.version)

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            if not self.in_place:
                self.trainer.close()
            if self._own_sampler_dir and self.sampler_dir is not None:
                shutil.rmtree(self.sampler_dir, ignore_errors=True)
