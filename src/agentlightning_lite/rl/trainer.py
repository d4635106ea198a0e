"""``agl.Trainer``: run the agent, turn its runs into transitions, update the LoRA policy, repeat.

One step: take ``batch_size`` tasks; run each ``group_size`` times through the user's agent,
concurrently, every rollout talking to the policy through its own ``server.llm(rollout_id)``;
build transitions from the store (credit + AIR + agent selection); compute advantages (GRPO or
PPO); update the adapter in place under the engine's lock, so the next rollouts sample from the
new policy; log, evaluate every ``eval_every`` steps, checkpoint every ``save_every`` steps.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..air import AIRRule, as_rules
from ..credit import CreditRule
from ..store.base import Store
from ..store.recovery import INTERRUPTED, recover_interrupted
from ..store.sqlite import SQLiteStore
from ..serving.engines.contract import InPlaceEngine, MultiAdapterEngine, ServingEngine, TrainableEngine
from ..tracer import Tracer
from ..transitions import transitions
from ._memory import peak_rss_mib, release_host_memory, rss_mib
from .batching import Sample, collate, forward_logprobs
from .checkpoint import latest_checkpoint, load_checkpoint, save_adapter, save_checkpoint
from .grpo import GRPO, aggregate, kl_penalty, policy_loss
from .lora import LoRA, check_4bit_available
from .metrics import MetricsLogger, plot_reward_curve
from .policy_gradient import PolicyGradient
from .ppo import PPO, ValueHead
from .rollouts import RolloutResult, RolloutSpec, run_rollouts
from .sft import SFT, sft_update
from .trajectory import merge_trajectories

__all__ = ["Trainer"]

logger = logging.getLogger("agentlightning_lite.trainer")


@dataclass
class _Policy:
    """One trained adapter: the agents it serves, its optimiser and (PPO) value head."""

    name: str  # the policy's name in metrics: the agent that owns the adapter ("default": single policy)
    adapter: str | None  # the peft adapter it trains (None: the model's only adapter, left active)
    agents: list[str] | None  # whose calls train it (None: every agent's)
    optimizer: torch.optim.Optimizer
    value_head: ValueHead | None


@dataclass
class _PolicyPlan:
    """What ``policies=`` asks for: adapters to train, frozen adapters to load, agent -> adapter."""

    trained: dict[str, LoRA]  # adapter name -> settings
    owners: dict[str, str]  # adapter name -> the agent (policy) that owns it
    frozen: dict[str, str]  # adapter name -> saved adapter directory
    routes: dict[str, str | None]  # agent -> adapter name (None: the base model)


def _adapter_name(agent: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", agent) or "_"


def _plan_policies(policies: Mapping[str, Any]) -> _PolicyPlan:
    """Check ``policies=`` and turn it into adapters and routes (clear errors for what cannot work)."""
    if not isinstance(policies, Mapping) or not policies:
        raise ValueError("policies must map agent names to agl.LoRA(...) (e.g. {'writer': agl.LoRA(r=16)})")
    plan = _PolicyPlan({}, {}, {}, {})
    names: dict[str, str] = {}

    def adapter_of(agent: str) -> str:
        name = _adapter_name(agent)
        if names.setdefault(name, agent) != agent:
            raise ValueError(f"agents {names[name]!r} and {agent!r} map to the same adapter name {name!r}")
        return name

    for agent, spec in policies.items():
        if not isinstance(agent, str) or not agent:
            raise ValueError(f"policies keys are agent names (non-empty strings), got {agent!r}")
        if isinstance(spec, LoRA):
            name = adapter_of(agent)
            plan.trained[name], plan.owners[name], plan.routes[agent] = spec, agent, name
    for agent, spec in policies.items():
        if isinstance(spec, LoRA):
            continue
        if spec is None:
            plan.routes[agent] = None
        elif isinstance(spec, str) and spec in policies:
            if not isinstance(policies[spec], LoRA):
                raise ValueError(
                    f"policies[{agent!r}] = {spec!r} shares agent {spec!r}'s adapter, but {spec!r} has no "
                    "agl.LoRA(...) of its own to share"
                )
            plan.routes[agent] = _adapter_name(spec)
        elif isinstance(spec, (str, os.PathLike)):
            path = os.fspath(spec)
            if not os.path.isfile(os.path.join(path, "adapter_config.json")):
                raise ValueError(
                    f"policies[{agent!r}] = {spec!r} is neither another agent of policies nor a directory "
                    "holding a saved peft adapter (adapter_config.json)"
                )
            name = adapter_of(agent)
            plan.frozen[name], plan.routes[agent] = path, name
        else:
            raise TypeError(
                f"policies[{agent!r}] must be agl.LoRA(...), another agent's name, a saved adapter's "
                f"directory or None, got {type(spec).__name__}"
            )
    if not plan.trained:
        raise ValueError("policies names no agl.LoRA(...): there is nothing to train")
    if len({lo.load_in_4bit for lo in plan.trained.values()}) > 1:
        raise ValueError("every policy shares one base model: load_in_4bit must be the same for all of them")
    return plan


def _progress(total: int, desc: str, initial: int = 0) -> Any:
    try:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, initial=initial, dynamic_ncols=True, leave=True)
    except ImportError:  # pragma: no cover
        return None


class Trainer:
    """Train an existing agent's policy model with reinforcement learning on LoRA weights.

    Args:
        model: the policy: a name from ``agl.models`` (``"smollm2-135m"``, embedded), a Hugging
            Face id or local path.
        algorithm: ``agl.GRPO(...)`` (default), ``agl.PPO(...)`` or ``agl.SFT(...)`` (supervised
            fine-tuning on the recorded calls; ``fit(..., algorithm=...)`` switches from then on).
        lora: ``agl.LoRA(...)`` adapter settings (``load_in_4bit=True`` for QLoRA on a GPU).
        engine: ``"auto"`` (vLLM on a GPU when installed, else transformers), ``"hf"``,
            ``"vllm"``, or an engine instance (``agl.engines.HFEngine(...)``).
        engine_options: keyword arguments for the engine built from a name, e.g.
            ``{"num_threads": 1}`` for ``"hf"`` on a busy CPU, or ``{"gpu_memory_utilization": 0.4,
            "max_model_len": 4096}`` for ``"vllm"`` (default there: 0.45 of the GPU, leaving the
            rest to the training copy of the model).
        store: where rollouts and spans go (default: ``SQLiteStore(output_dir/"runs.db")``).
        agents: train only these agents' LLM calls; the others' stay frozen (not trained).
        policies: one LoRA adapter per agent, on one shared base model, trained together:
            ``{"writer": agl.LoRA(r=16), "rewriter": agl.LoRA(r=8)}``. A value is ``agl.LoRA(...)``
            (the agent's own trained adapter), another agent's name (share that agent's adapter:
            ``{"planner": agl.LoRA(), "executor": "planner"}``), a directory holding a saved peft
            adapter (served frozen) or ``None`` (the base model, frozen). Agents not named are
            served by the base model and not trained. Each trained adapter has its own optimiser,
            GRPO groups (per task and per policy), metrics (``<agent>/train/loss``...), checkpoint
            files and saved adapter (``output_dir/adapters/<agent>``). The PolicyServer serves each
            call with its agent's adapter (the agent named in the URL, ``llm.for_agent(name)``, or
            the ``X-Agl-Agent`` header) and records it in the span's ``adapter`` attribute. Not
            combined with ``lora=`` or ``agents=``.
        credit: credit rule over an episode's calls (default ``credit.FinalReward()``).
        air: automatic intermediate reward rules (``air.ToolStatus(...)``, ``air.Rule(...)``): one
            rule or a list of them.
        output_dir: metrics, reward curve, checkpoints, the final adapter.
        batch_size: tasks per step (each run ``algorithm.group_size`` times).
        concurrency: rollouts run at once (threads); default: a whole step's rollouts
            (``batch_size * group_size``), so that the engine decodes a step's first turns as
            one batch (the trainer announces them with ``engine.expect(n)``).
        rollout_timeout: seconds a rollout may take before it is marked ``timeout``; its engine
            requests are then cancelled and an ``async`` agent is cancelled. A sync agent's thread
            cannot be stopped: it is left running as a daemon thread (see ``rollouts.hung_threads``).
        failed_reward: what a failed or timed-out rollout counts for: ``"drop"`` (left out of the
            update) or a number (its calls are trained with that reward).
        success_threshold: a rollout succeeds when its reward is at least this.
        eval_every, save_every: steps between evaluations / checkpoints (0 = never).
        max_seq_len: samples with a longer prompt + response are skipped (counted in the metrics).
        old_logprobs: importance-ratio denominator: ``"engine"`` (the logprobs the engine
            sampled with), ``"recompute"`` (a no-grad forward pass of the training model), or
            ``"auto"``: the engine's when they agree with a recomputation of the first micro-batch
            within ``logprob_tolerance`` (mean absolute difference per token; the other micro-batches
            are then not recomputed), else every micro-batch is recomputed. The mismatch is logged.
        seed: seeds data order, sampling seeds and torch.
        loggers: ``"auto"``, or a list of ``"tensorboard"``, ``"wandb"``, ``"mlflow"``.
        runners: where rollouts run: ``None`` (threads of this process, the default), or
            ``agl.RemoteRunners(host=, port=, api_key=)`` (runner processes anywhere, started with
            ``agl-lite runner``; ``fit``'s agent is then a label, or what ``agl.RayRunners`` ships
            to its actors).
        max_staleness: drop samples made by weights more than this many updates older than the
            policy being trained (``None`` keeps all; each LLM span records its ``weights_version``).
            With ``old_logprobs="engine"`` the samples kept are importance-corrected against the
            weights that made them.
        transitions: ``"call"`` (default): each LLM call is its own training sample, with its whole
            prompt. ``"trajectory"``: the calls of an episode whose prompts extend the previous
            call's prompt + response token ids are merged into one sequence (one forward pass per
            episode instead of one per call); only the generated tokens are trained and each keeps
            its own call's reward and advantage. A call whose prompt does not extend the previous
            one stays a separate sample (``trajectory/prefix_mismatches`` in the metrics).
        max_failed_steps: ``fit`` stops with a ``RuntimeError`` carrying the first rollout's error
            once this many steps in a row had no rollout that succeeded (every one failed or timed
            out): an agent that cannot run (a missing package, a wrong URL) is reported at once
            instead of training on nothing. ``None`` never stops. A step where some rollouts
            succeed resets the count.
        gradient_checkpointing: recompute each decoder layer's activations in the backward pass
            instead of keeping them (transformers' gradient checkpointing, non-reentrant, so it
            works with peft's frozen base): activation memory of the update falls from one set per
            layer to about one layer's, for roughly one more forward pass of time. Generation is
            unaffected (the engine runs the model in eval mode, where checkpointing is off).

    On CUDA the update runs under bf16 autocast (when ``torch.cuda.is_bf16_supported()``), the
    HF engine serves bf16 weights, and the CUDA allocator's cached blocks are returned between a
    step's generation and its update (the KV caches of the rollouts are no longer needed).

    >>> import agentlightning_lite as agl
    >>> def agent(task, llm):  # any function (task, llm) -> reward, or an agl.LitAgent
    ...     client = llm.openai_client()
    ...     reply = client.chat.completions.create(model=llm.model, max_tokens=8,
    ...         messages=[{"role": "user", "content": task["question"]}]).choices[0].message.content
    ...     return float(task["answer"] in reply)
    >>> trainer = agl.Trainer(model="smollm2-135m", algorithm=agl.GRPO(group_size=4),
    ...                       lora=agl.LoRA(r=8), output_dir="runs/demo")  # doctest: +SKIP
    >>> trainer.fit(agent, [{"question": "2+2=?", "answer": "4"}], steps=2)  # doctest: +SKIP

    Two agents, each with its own adapter (a third, unnamed, stays on the base model):

    >>> def two_agents(task, llm):
    ...     draft = llm.for_agent("writer").openai_client().chat.completions.create(
    ...         model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    ...     ...  # the rewriter's call goes through llm.for_agent("rewriter")
    >>> trainer = agl.Trainer(model="smollm2-135m", output_dir="runs/two",
    ...     policies={"writer": agl.LoRA(r=16), "rewriter": agl.LoRA(r=8)})  # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any = "smollm2-135m",
        algorithm: GRPO | PPO | SFT | None = None,
        lora: LoRA | None = None,
        engine: str | ServingEngine = "auto",
        engine_options: dict[str, Any] | None = None,
        store: Store | None = None,
        agents: Sequence[str] | None = None,
        credit: CreditRule | None = None,
        air: AIRRule | Sequence[AIRRule] | None = None,
        output_dir: str | os.PathLike[str] = "runs/agl",
        batch_size: int = 8,
        concurrency: int | None = None,
        rollout_timeout: float | None = 300.0,
        failed_reward: str | float = "drop",
        success_threshold: float = 1.0,
        eval_every: int = 0,
        save_every: int = 0,
        keep_checkpoints: int | None = 3,
        max_seq_len: int = 2048,
        old_logprobs: str = "auto",
        logprob_tolerance: float = 1e-3,
        seed: int = 0,
        loggers: str | list[str] = "auto",
        server_options: dict[str, Any] | None = None,
        runners: Any = None,
        max_staleness: int | None = None,
        transitions: str = "call",
        policies: Mapping[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        max_failed_steps: int | None = 1,
    ) -> None:
        if transitions not in ("call", "trajectory"):
            raise ValueError(f"transitions must be 'call' or 'trajectory', got {transitions!r}")
        self.transitions_mode = transitions
        self._plan: _PolicyPlan | None = None
        if policies is not None:
            if agents is not None:
                raise ValueError(
                    "give policies= or agents=, not both: policies= already says which agents are trained "
                    "(an agent it does not name is frozen)"
                )
            if lora is not None:
                raise ValueError(
                    "with policies=, each agent's LoRA settings go in policies (e.g. policies={'writer': "
                    "agl.LoRA(r=16)}); lora= is the single shared policy's"
                )
            self._plan = _plan_policies(policies)
            lora = next(iter(self._plan.trained.values()))
        self.algorithm = algorithm if algorithm is not None else GRPO()
        _check_algorithm(self.algorithm)
        if failed_reward != "drop" and not isinstance(failed_reward, (int, float)):
            raise ValueError(f"failed_reward must be 'drop' or a number, got {failed_reward!r}")
        if old_logprobs not in ("auto", "engine", "recompute"):
            raise ValueError("old_logprobs must be 'auto', 'engine' or 'recompute'")
        self.model_name = model
        self.lora = lora if lora is not None else LoRA()
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.store = store if store is not None else SQLiteStore(self.output_dir / "runs.db")
        self.tracer = Tracer(self.store)
        self.agents = list(agents) if agents is not None else None
        self.credit = credit
        self.air = as_rules(air)
        self.batch_size = batch_size
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency or batch_size * self.algorithm.group_size
        self.rollout_timeout = rollout_timeout
        self.failed_reward = failed_reward
        self.success_threshold = success_threshold
        self.eval_every = eval_every
        self.save_every = save_every
        self.keep_checkpoints = keep_checkpoints
        self.max_seq_len = max_seq_len
        self.old_logprobs = old_logprobs
        self.logprob_tolerance = logprob_tolerance
        self.seed = seed
        self.server_options = dict(server_options or {})
        if runners is not None and not callable(getattr(runners, "run", None)):
            raise TypeError(f"runners must be agl.RemoteRunners(...) or agl.RayRunners(...), got {runners!r}")
        self.runners = runners
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.max_staleness = max_staleness
        if max_failed_steps is not None and (
            type(max_failed_steps) is not int or max_failed_steps < 1  # bool is no count
        ):
            raise ValueError(f"max_failed_steps must be an integer >= 1 or None, got {max_failed_steps!r}")
        self.max_failed_steps = max_failed_steps
        self._failed_steps = 0  # consecutive steps in which no rollout succeeded
        self._first_failure: tuple[str, str | None] | None = None  # (status, error) of the first rollout
        self.step = 0
        self._epoch = 0
        self._cursor = 0
        random.seed(seed)
        torch.manual_seed(seed)
        self._owns_engine = isinstance(engine, str)
        self.engine_options = dict(engine_options or {})
        self._hf_copy: Any = None  # the training copy of the model when the engine cannot train in place
        self.engine = self._make_engine(engine, model)
        self.policy = self._training_model()
        self.device = next(self.policy.parameters()).device
        # the update computes in the engine's precision (HFEngine(autocast=...)), else bf16 on CUDA
        self.autocast = self.engine.autocast_dtype if isinstance(self.engine, InPlaceEngine) else None
        if self.autocast is None and self.device.type == "cuda" and torch.cuda.is_bf16_supported():
            self.autocast = torch.bfloat16
        self.gradient_checkpointing = bool(gradient_checkpointing)
        if self.gradient_checkpointing:
            _enable_gradient_checkpointing(self.policy)
        self.value_head: ValueHead | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._policies: list[_Policy] = []
        self._agent_policy: dict[str, str] = {}  # trained agent -> policy name
        if self._plan is None:
            params = [p for p in self.policy.parameters() if p.requires_grad]
            self.optimizer, self.value_head = self._make_optimizer(params)
            self._policies.append(_Policy("default", None, self.agents, self.optimizer, self.value_head))
        else:
            for adapter, owner in self._plan.owners.items():
                params = _adapter_params(self.policy, adapter)
                if not params:
                    raise RuntimeError(f"the training model has no weights for adapter {adapter!r}")
                opt, head = self._make_optimizer(params)
                agents_of = [a for a, n in self._plan.routes.items() if n == adapter]
                self._policies.append(_Policy(owner, adapter, agents_of, opt, head))
                self._agent_policy.update(dict.fromkeys(agents_of, owner))
        self.metrics = MetricsLogger(self.output_dir, loggers)
        self._server: Any = None

    # -- set-up ---------------------------------------------------------------------------
    @property
    def policies(self) -> dict[str, list[str] | None]:
        """The trained policies: name -> the agents whose calls train it (``None``: every agent).

        >>> trainer.policies  # doctest: +SKIP
        {'writer': ['writer'], 'rewriter': ['rewriter']}
        """
        return {p.name: p.agents for p in self._policies}

    def _make_optimizer(self, params: list[torch.nn.Parameter]) -> tuple[torch.optim.Optimizer, Any]:
        groups: list[dict[str, Any]] = [{"params": params, "lr": self.algorithm.lr}]
        head = None
        if isinstance(self.algorithm, PolicyGradient) and self.algorithm.needs_values:
            head = ValueHead(int(self.policy.config.hidden_size)).to(self.device)
            groups.append({"params": list(head.parameters()), "lr": self.algorithm.value_head_lr()})
        return torch.optim.AdamW(groups, weight_decay=self.algorithm.weight_decay), head

    def _adapter_specs(self) -> dict[str, Any]:
        plan = self._plan
        assert plan is not None
        return {**plan.trained, **plan.frozen}

    def _make_engine(self, engine: str | ServingEngine, model: Any) -> ServingEngine:
        from ..serving import engines as eng

        if self.lora.load_in_4bit:
            check_4bit_available()
        if self._plan is not None:
            return self._make_multi_engine(engine, model)
        if not isinstance(engine, str):
            return engine
        if engine == "auto":
            engine = "vllm" if torch.cuda.is_available() and _has_vllm() else "hf"
        if engine == "hf":
            options = {"seed": self.seed, "max_batch_size": max(16, self.concurrency), **self.engine_options}
            return eng.HFEngine(model, lora=self.lora, **options)
        if engine == "vllm":
            # vLLM serves; a transformers copy trains and hands its adapter over after each step.
            # vLLM starts from that copy's fresh adapter, so both begin from the same weights.
            self._hf_copy = eng.HFEngine(model, lora=self.lora, seed=self.seed)
            init = self.output_dir / "adapter-init"
            self._hf_copy.model.save_pretrained(str(init))
            options = {
                "max_lora_rank": max(16, self.lora.r),
                "gpu_memory_utilization": 0.45,
                "adapter_dir": str(self.output_dir / "adapters"),
                **self.engine_options,
            }
            return eng.VLLMEngine(model, lora=str(init), **options)
        raise ValueError(f"engine must be 'auto', 'hf', 'vllm' or an engine instance, got {engine!r}")

    def _make_multi_engine(self, engine: str | ServingEngine, model: Any) -> ServingEngine:
        """An engine serving one adapter per policy, routed by agent (agents not named: base model)."""
        from ..serving import engines as eng

        plan = self._plan
        assert plan is not None
        if not isinstance(engine, str):
            if not isinstance(engine, MultiAdapterEngine):
                raise TypeError(
                    f"policies= needs an engine that serves several adapters; {type(engine).__name__} "
                    "cannot (pass engine='hf', engine='vllm' or an agl.engines.HFEngine)"
                )
            for name, spec in self._adapter_specs().items():
                engine.add_adapter(name, spec)
            engine.set_routes(plan.routes, default=None)
            return engine
        if engine == "auto":
            engine = "vllm" if torch.cuda.is_available() and _has_vllm() else "hf"
        if engine == "hf":
            options = {"seed": self.seed, "max_batch_size": max(16, self.concurrency), **self.engine_options}
            return eng.HFEngine(model, adapters=self._adapter_specs(), routes=plan.routes, **options)
        if engine == "vllm":
            self._hf_copy = eng.HFEngine(model, adapters=self._adapter_specs(), seed=self.seed)
            inits = {}
            for name in plan.trained:
                inits[name] = str(
                    save_adapter(self._hf_copy.model, name, self.output_dir / "adapter-init" / name)
                )
            options = {
                "max_lora_rank": max(16, *(lo.r for lo in plan.trained.values())),
                "gpu_memory_utilization": 0.45,
                "adapter_dir": str(self.output_dir / "adapters-served"),
                **self.engine_options,
            }
            return eng.VLLMEngine(model, adapters={**inits, **plan.frozen}, routes=plan.routes, **options)
        raise ValueError(f"engine must be 'auto', 'hf', 'vllm' or an engine instance, got {engine!r}")

    def _training_model(self) -> Any:
        """The peft model the optimiser updates: the HF engine's own module, or a separate copy."""
        model = self.engine.model if isinstance(self.engine, InPlaceEngine) else None
        if model is not None and hasattr(model, "peft_config") and isinstance(model, torch.nn.Module):
            return model  # train in place: the engine serves the updated adapter at once
        from ..serving import engines as eng

        # an engine that cannot train in place (vLLM): a transformers copy whose adapter is pushed to it
        copy = self._hf_copy
        if copy is None:
            if self._plan is not None:
                copy = eng.HFEngine(self.model_name, adapters=self._adapter_specs(), seed=self.seed)
            else:
                copy = eng.HFEngine(self.model_name, lora=self.lora, seed=self.seed)
        return copy.model

    # -- the loop -------------------------------------------------------------------------
    def fit(
        self,
        agent: Callable[..., Any],
        train_dataset: Sequence[Any],
        val_dataset: Sequence[Any] | None = None,
        steps: int | None = None,
        epochs: int = 1,
        resume: bool = False,
        algorithm: GRPO | PPO | SFT | None = None,
    ) -> dict[str, Any]:
        """Train ``agent`` on ``train_dataset`` until step ``steps`` (default: ``epochs`` passes).

        ``agent`` is a function ``(task, llm) -> float | None`` (sync or async) or an
        ``agl.LitAgent``. With ``resume=True`` the newest checkpoint in ``output_dir`` is loaded
        (adapter, optimiser, RNG, data position, step) and training continues from there; rollouts
        that a process which died left ``running`` in the store are first marked ``failed`` with
        error ``"interrupted"`` (see :func:`agentlightning_lite.store.recovery.recover_interrupted`).
        Returns the final metrics (with the last validation scores when ``val_dataset`` is given).

        ``algorithm`` switches the trainer to another algorithm from here on (a fresh optimiser
        on the same adapter): ``fit(agent, tasks, algorithm=agl.SFT(teacher=engine))`` for a
        supervised warm start, then ``fit(agent, tasks, steps=trainer.step + 8, algorithm=agl.GRPO())``
        (the step count is the trainer's, across calls: ``steps`` is the step to stop at).
        """
        if len(train_dataset) == 0:
            raise ValueError("train_dataset is empty")
        if algorithm is not None:
            self.use_algorithm(algorithm)
        per_epoch = math.ceil(len(train_dataset) / self.batch_size)
        total = steps if steps is not None else per_epoch * epochs
        if resume:
            interrupted = recover_interrupted(self.store)
            if interrupted:
                logger.warning(
                    "marked %d rollout(s) left running by a process that died as failed (%s)",
                    len(interrupted),
                    INTERRUPTED,
                )
            ckpt = latest_checkpoint(self.output_dir / "checkpoints")
            if ckpt is None:
                logger.warning(
                    "resume=True but no checkpoint in %s: starting fresh", self.output_dir / "checkpoints"
                )
            else:
                state: dict[str, Any] = {}

                def restore(_model: Any) -> None:
                    state.update(
                        load_checkpoint(
                            ckpt, self.policy, self.optimizer, self.value_head, policies=self._policy_states()
                        )
                    )

                if self._trains_in_place():  # the engine loads it under its lock and bumps its version
                    self._trainable_engine().update_weights(restore)
                else:
                    restore(self.policy)
                    self._push_weights()
                self.step, self._epoch, self._cursor = state["step"], state["epoch"], state["cursor"]
                logger.info("resumed from %s (step %d)", ckpt, self.step)
        last: dict[str, Any] = {}
        bar = _progress(total, "training", initial=min(self.step, total))
        try:
            with self._serving():
                while self.step < total:
                    tasks = self._next_batch(train_dataset)
                    last = self.train_step(agent, tasks)
                    if val_dataset is not None and self.eval_every and self.step % self.eval_every == 0:
                        last.update(self._validate(agent, val_dataset))
                    self.metrics.log(self.step, last)
                    self._check_failed_steps()
                    if self.save_every and self.step % self.save_every == 0:
                        self.save_checkpoint()
                    if bar is not None:
                        bar.update(1)
                        loss = last.get("train/loss")
                        bar.set_postfix(
                            reward=f"{last.get('train/reward_mean', float('nan')):.3f}",
                            loss="skipped (no reward spread)" if loss is None else f"{loss:.4f}",
                        )
                if val_dataset is not None and not (self.eval_every and self.step % self.eval_every == 0):
                    final_val = self._validate(agent, val_dataset)
                    last.update(final_val)
                    self.metrics.log(self.step, final_val)
        finally:
            if bar is not None:
                bar.close()
            self.plot()
        return last

    def _next_batch(self, dataset: Sequence[Any]) -> list[tuple[int, Any]]:
        """The next ``batch_size`` (index, task) pairs of a seeded per-epoch shuffle."""
        out = []
        while len(out) < self.batch_size:
            order = list(range(len(dataset)))
            random.Random(self.seed * 100_003 + self._epoch).shuffle(order)
            if self._cursor >= len(order):
                self._epoch, self._cursor = self._epoch + 1, 0
                continue
            i = order[self._cursor]
            self._cursor += 1
            out.append((i, dataset[i]))
        return out

    def train_step(self, agent: Callable[..., Any], tasks: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        """One step on the given ``(index, task)`` pairs; returns its metrics."""
        with self._serving():
            t0 = time.perf_counter()
            group_size = self.algorithm.group_size
            specs = [
                RolloutSpec(task, "train", {"step": self.step, "task_index": idx, "sample": k})
                for idx, task in tasks
                for k in range(group_size)
            ]
            teacher = getattr(self.algorithm, "teacher", None)
            if teacher is not None:  # SFT: the teacher plays the policy; its calls are recorded alike
                from ..serving import PolicyServer

                with PolicyServer(teacher, self.store, **self.server_options) as server:
                    results = self._run(agent, specs, llm_for=server.llm)
            else:
                results = self._run(agent, specs)
            t_roll = time.perf_counter() - t0
            samples, sample_stats = self._samples(results)
            _release_cuda_cache(self.device)  # the rollouts' KV caches: give their blocks back first
            t1 = time.perf_counter()
            update_stats = self._update(samples) if samples else {"train/skipped_update": 1.0}
            t_update = time.perf_counter() - t1
            release_host_memory()  # the update's freed activations: back to the OS, not kept in the heap
        self.step += 1
        if results and not any(r.status == "succeeded" for r in results):
            self._failed_steps += 1
            first = results[0]
            self._first_failure = (first.status, first.error)
        elif results:
            self._failed_steps = 0
        rewards = [r.reward for r in results if r.status == "succeeded" and r.reward is not None]
        out: dict[str, Any] = {
            "train/reward_mean": statistics.fmean(rewards) if rewards else float("nan"),
            "train/success_rate": self._success(results),
            "train/rollouts": float(len(results)),
            "train/failed_rollouts": float(sum(r.status == "failed" for r in results)),
            "train/timeout_rollouts": float(sum(r.status == "timeout" for r in results)),
            "time/rollouts_s": t_roll,
            "time/update_s": t_update,
            "engine/version": float(self.engine.version),
            **_memory_stats(),
            **sample_stats,
            **update_stats,
        }
        return out

    def _check_failed_steps(self) -> None:
        """Stop ``fit`` once ``max_failed_steps`` steps in a row had no successful rollout."""
        limit = self.max_failed_steps
        if limit is None or self._failed_steps < limit or self._first_failure is None:
            return
        status, error = self._first_failure
        n = self._failed_steps
        first = self.step - n + 1
        steps = f"step {self.step}" if n == 1 else f"{n} steps in a row (steps {first}-{self.step})"
        raise RuntimeError(
            f"every rollout of {steps} failed or timed out, so there is nothing to train on "
            f"(max_failed_steps={limit}; None never stops). The last step's first rollout ended "
            f"{status!r} with: {error or 'no error recorded'}"
        )

    def evaluate(self, agent: Callable[..., Any], dataset: Sequence[Any]) -> dict[str, float]:
        """Run ``agent`` once per task in ``mode="val"``: mean reward, success rate, failures.

        >>> trainer.evaluate(agent, val_tasks)  # doctest: +SKIP
        {'mean_reward': 0.31, 'success_rate': 0.31, 'n': 50, 'failed': 0}
        """
        with self._serving():
            specs = [
                RolloutSpec(task, "val", {"step": self.step, "task_index": i})
                for i, task in enumerate(dataset)
            ]
            results = self._run(agent, specs, desc="evaluating")
        release_host_memory()
        rewards = [self._reward_of(r) for r in results]
        scored = [x for x in rewards if x is not None]
        return {
            "mean_reward": statistics.fmean(scored) if scored else float("nan"),
            "success_rate": self._success(results),
            "n": len(results),
            "failed": sum(r.status != "succeeded" for r in results),
        }

    def _validate(self, agent: Callable[..., Any], dataset: Sequence[Any]) -> dict[str, float]:
        res = self.evaluate(agent, dataset)
        return {"val/reward_mean": res["mean_reward"], "val/success_rate": res["success_rate"]}

    # -- rollouts -------------------------------------------------------------------------
    def _serving(self) -> Any:
        trainer = self

        class _Ctx:
            def __enter__(self) -> None:
                self.owner = trainer._server is None
                if self.owner and trainer.runners is not None:
                    trainer._server = trainer.runners.serve(
                        trainer.engine, trainer.store, trainer.rollout_timeout, trainer.server_options
                    )
                elif self.owner:
                    from ..serving import PolicyServer

                    trainer._server = PolicyServer(
                        trainer.engine, trainer.store, **trainer.server_options
                    ).start()

            def __exit__(self, *exc: object) -> None:
                if self.owner and trainer._server is not None:
                    if trainer.runners is not None:
                        trainer.runners.stop()  # workers the trainer started stop before the server
                    trainer._server.stop()
                    trainer._server = None

        return _Ctx()

    def _run(
        self,
        agent: Callable[..., Any],
        specs: list[RolloutSpec],
        desc: str = "",
        llm_for: Callable[[str], Any] | None = None,
    ) -> list[RolloutResult]:
        bar = _progress(len(specs), desc) if desc else None
        # the agents start together: let a batching engine wait for their first requests
        if llm_for is None:
            self.engine.expect(min(len(specs), self.concurrency))
        if self.runners is not None:
            try:
                return self._run_remote(agent, specs, bar)
            finally:
                if bar is not None:
                    bar.close()
        try:
            return run_rollouts(
                agent,
                specs,
                self.tracer,
                llm_for or (lambda rid: self._server.llm(rid)),
                concurrency=self.concurrency,
                timeout=self.rollout_timeout,
                on_done=(lambda _r: bar.update(1)) if bar is not None else None,
                on_timeout=lambda rid: self._server.cancel_rollout(rid),
            )
        finally:
            if bar is not None:
                bar.close()

    def _run_remote(self, agent: Any, specs: list[RolloutSpec], bar: Any) -> list[RolloutResult]:
        """Queue the rollouts for the remote runners; one result per spec, in order."""
        self.runners.start_workers(agent)
        jobs = self.runners.run(
            [(s.task, s.mode, s.metadata) for s in specs],
            on_done=(lambda _j: bar.update(1)) if bar is not None else None,
        )
        now = time.monotonic()
        return [
            RolloutResult(
                j.rollout_id or "",
                s,
                j.status or "failed",
                j.reward,
                j.error,
                (j.finished_at or now) - (j.started_at or j.queued_at),
            )
            for s, j in zip(specs, jobs, strict=True)
        ]

    def _reward_of(self, r: RolloutResult) -> float | None:
        if r.status == "succeeded":
            return r.reward
        return None if self.failed_reward == "drop" else float(self.failed_reward)

    def _success(self, results: Sequence[RolloutResult]) -> float:
        if not results:
            return float("nan")
        ok = sum(
            1 for r in results if r.status == "succeeded" and (r.reward or 0.0) >= self.success_threshold
        )
        return ok / len(results)

    # -- samples --------------------------------------------------------------------------
    def _samples(self, results: Sequence[RolloutResult]) -> tuple[list[Sample], dict[str, float]]:
        keep: list[RolloutResult] = []
        for r in results:
            if not r.rollout_id:  # never ran (a remote rollout given up before any runner took it)
                continue
            min_reward = getattr(self.algorithm, "min_reward", None)
            if min_reward is not None and (r.reward is None or r.reward < min_reward):
                continue  # SFT trains on good episodes only
            if r.status == "succeeded" and r.reward is not None:
                keep.append(r)
            elif r.status != "succeeded" and self.failed_reward != "drop":
                self.store.set_reward(r.rollout_id, float(self.failed_reward))
                keep.append(r)
        by_id = {r.rollout_id: r for r in keep}
        ts = transitions(
            self.store,
            rollout_ids=list(by_id),
            agents=self.agents if self._plan is None else list(self._agent_policy),
            credit=self.credit,
            air=self.air,
            require_tokens=True,
        )
        samples: list[Sample] = []
        too_long = stale = 0
        current = int(self.engine.version)
        for t in ts:
            assert t.prompt_token_ids is not None and t.response_token_ids is not None
            if not t.response_token_ids or t.reward is None:
                continue
            made_by = t.metadata.get("weights_version")
            if (
                self.max_staleness is not None
                and made_by is not None
                and current - made_by > self.max_staleness
            ):
                stale += 1  # off-policy beyond the limit: made by weights too old
                continue
            if len(t.prompt_token_ids) + len(t.response_token_ids) > self.max_seq_len:
                too_long += 1
                continue
            r = by_id[t.rollout_id]
            params = t.metadata.get("params") or {}
            samples.append(
                Sample(
                    prompt_ids=t.prompt_token_ids,
                    response_ids=t.response_token_ids,
                    engine_logprobs=t.response_logprobs,
                    reward=float(t.reward),
                    group=r.spec.metadata.get("task_index"),
                    temperature=float(params.get("temperature", 1.0) or 1.0),
                    rollout_id=t.rollout_id,
                    index=t.index,
                    agent=t.agent,
                    meta={"policy": self._agent_policy.get(t.agent or "", "default")},
                )
            )
        stats = {
            "train/samples": float(len(samples)),
            "train/samples_too_long": float(too_long),
            "train/samples_stale": float(stale),
            "train/calls_per_rollout": len(ts) / max(len(keep), 1),
        }
        return samples, stats

    # -- the update -----------------------------------------------------------------------
    def _update(self, samples: list[Sample]) -> dict[str, float]:
        """Update every policy on its own agents' samples: its own advantages, gradient and step."""
        if self._plan is None:
            return self._update_policy(self._policies[0], samples)
        stats: dict[str, float] = {}
        skipped = 0
        for pol in self._policies:
            mine = [s for s in samples if s.meta.get("policy") == pol.name]
            st = self._update_policy(pol, mine) if mine else {"train/skipped_update": 1.0}
            skipped += int(st.get("train/skipped_update", 0.0) == 1.0)
            stats.update({f"{pol.name}/{k}": v for k, v in st.items()})
            stats[f"{pol.name}/train/samples"] = float(len(mine))
        for key in ("train/loss", "train/grad_norm", "train/pg_loss", "train/response_tokens"):
            vals = [stats[f"{p.name}/{key}"] for p in self._policies if f"{p.name}/{key}" in stats]
            if vals:
                stats[key] = sum(vals) if key == "train/response_tokens" else statistics.fmean(vals)
        if skipped == len(self._policies):
            stats["train/skipped_update"] = 1.0
        return stats

    def _update_policy(self, policy: _Policy, samples: list[Sample]) -> dict[str, float]:
        algo = self.algorithm
        stats: dict[str, float] = {}
        if isinstance(algo, SFT):
            return self._sft_update(policy, samples)
        stats.update(algo.advantages(samples))  # each call's advantage (GRPO: within its group)
        if stats.get("train/skipped_update"):
            return stats  # e.g. every GRPO group had zero spread: no gradient
        if self.transitions_mode == "trajectory":  # after the per-call advantages: each call keeps its own
            samples, tstats = merge_trajectories(samples)
            stats.update(tstats)
        result: dict[str, float] = {}

        def step(model: Any) -> None:
            if policy.adapter is not None and model.active_adapter != policy.adapter:
                model.set_adapter(policy.adapter)  # the one adapter that learns (and gets gradients)
            result.update(self._optimise(model, samples, policy))

        if self._trains_in_place():
            self._trainable_engine().update_weights(step)  # under the engine's lock: no generation mid-update
        else:
            step(self.policy)
            self._push_weights(policy)
        stats.update(result)
        return stats

    def _sft_update(self, policy: _Policy, samples: list[Sample]) -> dict[str, float]:
        algo = self.algorithm
        assert isinstance(algo, SFT)
        if self.transitions_mode == "trajectory":
            samples, stats = merge_trajectories(samples)
        else:
            stats = {}

        def step(model: Any) -> None:
            if policy.adapter is not None and model.active_adapter != policy.adapter:
                model.set_adapter(policy.adapter)
            seed = self.seed * 1_000_003 + self.step
            stats.update(
                sft_update(model, policy.optimizer, samples, algo, self._pad_id(), seed, self.autocast)
            )

        if self._trains_in_place():
            self._trainable_engine().update_weights(step)
        else:
            step(self.policy)
            self._push_weights(policy)
        return stats

    def use_algorithm(self, algorithm: GRPO | PPO | SFT) -> None:
        """Train with ``algorithm`` from now on: same adapter(s), a fresh optimiser for each.

        >>> trainer.use_algorithm(agl.GRPO(group_size=8))  # doctest: +SKIP
        """
        _check_algorithm(algorithm)
        self.algorithm = algorithm
        for pol in self._policies:
            if pol.adapter is None:
                params = [p for p in self.policy.parameters() if p.requires_grad]
            else:
                params = _adapter_params(self.policy, pol.adapter)
            pol.optimizer, pol.value_head = self._make_optimizer(params)
        if self._plan is None:
            self.optimizer, self.value_head = self._policies[0].optimizer, self._policies[0].value_head

    def _trains_in_place(self) -> bool:
        return isinstance(self.engine, InPlaceEngine) and self.engine.model is self.policy

    def _push_weights(self, policy: _Policy | None = None) -> None:
        """Hand the adapter(s) to an engine that does not share the training model (vLLM)."""
        from peft import get_peft_model_state_dict

        engine = self._trainable_engine()
        if self._plan is None:
            engine.update_weights(get_peft_model_state_dict(self.policy))
            return
        for pol in [policy] if policy is not None else self._policies:
            state = get_peft_model_state_dict(self.policy, adapter_name=pol.adapter)
            engine.update_weights(state, adapter=pol.adapter)

    def _trainable_engine(self) -> TrainableEngine:
        if not isinstance(self.engine, TrainableEngine):
            raise TypeError(f"{type(self.engine).__name__} takes no new weights (it has no update_weights)")
        return self.engine

    def _pad_id(self) -> int:
        return int(self.engine.pad_token_id or 0) if isinstance(self.engine, InPlaceEngine) else 0

    def _optimise(self, model: Any, samples: list[Sample], policy: _Policy | None = None) -> dict[str, float]:
        algo = self.algorithm
        optimizer = policy.optimizer if policy is not None else self.optimizer
        value_head = policy.value_head if policy is not None else self.value_head
        assert optimizer is not None
        micro = algo.micro_batch_size
        mini = algo.mini_batch_size or len(samples)
        chunks = _micro_batches(samples, micro, algo.micro_batch_tokens)
        batches = [collate(c, self._pad_id()).to(self.device) for c in chunks]

        # 1. reference quantities, no gradient: old logprobs, reference logprobs, old values.
        # The engine's logprobs are the behaviour policy's; a no-grad forward pass checks them. In
        # "auto" mode, once the first micro-batch agrees within tolerance the rest are not recomputed
        # (same weights, same numerics), which saves a forward pass per sample.
        model.eval()
        old_lp: list[torch.Tensor] = []
        ref, old_v = [], []
        mismatch_sum, mismatch_n, mismatch_max = 0.0, 0, 0.0
        agree: bool | None = None  # unknown until a micro-batch has been checked
        with torch.no_grad():
            for c, b in zip(chunks, batches, strict=True):
                eng = None
                engine_lps = [s.token_engine_logprobs() for s in c]
                if all(lps is not None for lps in engine_lps):
                    eng = torch.zeros(b.response_mask.shape)  # filled on the host, copied once
                    for i, lps in enumerate(engine_lps):
                        eng[i, : len(lps)] = torch.tensor(lps)  # type: ignore[arg-type]
                    eng = eng.to(self.device)
                trust = eng is not None and (self.old_logprobs == "engine" or agree is True)
                needs_values = algo.needs_values
                lp = v = None
                if not trust or needs_values:
                    lp, v = forward_logprobs(model, b, value_head, self.autocast)
                if eng is not None and lp is not None:
                    diff = (eng - lp).abs() * b.response_mask
                    mismatch_sum += float(diff.sum())
                    mismatch_n += int(b.response_mask.sum())
                    mismatch_max = max(mismatch_max, float(diff.max()))
                    if self.old_logprobs == "auto" and agree is None:
                        agree = mismatch_sum / max(mismatch_n, 1) <= self.logprob_tolerance
                use_eng = eng is not None and (self.old_logprobs == "engine" or agree is True)
                old_lp.append(eng if use_eng else lp)  # type: ignore[arg-type]
                old_v.append(v)
                if algo.kl_coef > 0:
                    with model.disable_adapter():
                        ref.append(forward_logprobs(model, b, None, self.autocast)[0])
        mean_mismatch = mismatch_sum / mismatch_n if mismatch_n else float("nan")
        use_engine = self.old_logprobs == "engine" or agree is True

        # 2. advantages per token: the algorithm's own (GRPO: each call's; PPO: GAE on the old values)
        merged = self.transitions_mode == "trajectory"
        advs, rets = algo.token_advantages(chunks, batches, old_v, merged)

        # 3. optimise: epochs x mini-batches, gradient accumulation over micro-batches
        model.train()
        if value_head is not None:
            value_head.train()
        clip_high = algo.clip_high if algo.clip_high is not None else algo.clip
        params = [p for g in optimizer.param_groups for p in g["params"]]
        logs: dict[str, list[float]] = {}
        per_mini = max(1, math.ceil(mini / micro))
        order = list(range(len(chunks)))
        for _epoch in range(algo.epochs):
            for start in range(0, len(order), per_mini):
                group = order[start : start + per_mini]
                # each micro batch weighs its share of the mini batch, as one big batch would
                masks = [batches[j].response_mask for j in group]
                weights = algo.loss_weights([chunks[j] for j in group], masks)
                optimizer.zero_grad(set_to_none=True)
                for j, (weight, tok_w) in zip(group, weights, strict=True):
                    b = batches[j]
                    segs = b.segment_ids if merged else None
                    lp, v = forward_logprobs(model, b, value_head, self.autocast)
                    pg, pstats = policy_loss(lp, old_lp[j], advs[j], b.response_mask, algo.clip, clip_high)
                    tok_loss = pg
                    if algo.kl_coef > 0:
                        kl = kl_penalty(lp, ref[j], algo.kl_estimator)
                        tok_loss = tok_loss + algo.kl_coef * kl
                        logs.setdefault("train/kl", []).append(
                            float((kl.detach() * b.response_mask).sum() / b.response_mask.sum())
                        )
                    if algo.needs_values:
                        vl = algo.value_loss(v, old_v[j], rets[j])  # type: ignore[arg-type]
                        tok_loss = tok_loss + algo.value_coef * vl
                        logs.setdefault("ppo/value_loss", []).append(
                            float((vl.detach() * b.response_mask).sum() / b.response_mask.sum())
                        )
                    agg = (algo.loss_agg, algo.max_response_tokens, segs, tok_w)
                    loss = aggregate(tok_loss, b.response_mask, *agg) * weight
                    if not torch.isfinite(loss):
                        raise FloatingPointError(f"non-finite loss at step {self.step}: {float(loss)}")
                    loss.backward()
                    logs.setdefault("train/loss", []).append(float(loss.detach()) / max(weight, 1e-12))
                    logs.setdefault("train/pg_loss", []).append(
                        float(aggregate(pg.detach(), b.response_mask, *agg))
                    )
                    logs.setdefault("train/clip_frac", []).append(float(pstats["clip_frac"]))
                grad_norm = torch.nn.utils.clip_grad_norm_(params, algo.max_grad_norm)
                logs.setdefault("train/grad_norm", []).append(float(grad_norm))
                optimizer.step()
        model.eval()
        out = {k: statistics.fmean(v) for k, v in logs.items()}
        out["train/logprob_mismatch_mean"] = mean_mismatch
        out["train/logprob_mismatch_max"] = mismatch_max
        out["train/ratio_from_engine_logprobs"] = 1.0 if use_engine else 0.0
        out["train/response_tokens"] = float(sum(sum(s.token_mask()) for s in samples))
        out["train/sequences"] = float(len(samples))
        out["train/sequence_tokens"] = float(sum(len(s.prompt_ids) + len(s.response_ids) for s in samples))
        return out

    # -- saving ---------------------------------------------------------------------------
    def _policy_states(self) -> dict[str, tuple[torch.optim.Optimizer, Any]] | None:
        if self._plan is None:
            return None
        return {p.adapter: (p.optimizer, p.value_head) for p in self._policies if p.adapter is not None}

    def save_checkpoint(self) -> Path:
        """Write a resumable checkpoint to ``output_dir/checkpoints/step-N`` (with one adapter per
        agent: each adapter, optimiser and value head under ``step-N/policies/<agent>/``)."""
        return save_checkpoint(
            self.output_dir / "checkpoints",
            self.step,
            self.policy,
            self.optimizer,
            {"epoch": self._epoch, "cursor": self._cursor, "seed": self.seed},
            self.value_head,
            keep=self.keep_checkpoints,
            policies=self._policy_states(),
        )

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Save the trained adapter (peft format, safetensors) to ``path`` (default ``output_dir/adapter``).

        With ``policies=``, each trained adapter goes to its own directory ``path/<agent>``
        (default ``output_dir/adapters/<agent>``). Load one later with
        ``agl.engines.HFEngine(model, lora=path)`` or ``peft.PeftModel.from_pretrained``.
        """
        if self._plan is not None:
            root = Path(path) if path is not None else self.output_dir / "adapters"
            for pol in self._policies:
                assert pol.adapter is not None
                save_adapter(self.policy, pol.adapter, root / pol.adapter)
            return root
        out = Path(path) if path is not None else self.output_dir / "adapter"
        self.policy.save_pretrained(str(out), safe_serialization=True)
        return out

    def plot(self) -> Path | None:
        """Draw ``output_dir/reward_curve.png`` from the logged metrics."""
        return plot_reward_curve(
            self.metrics.rows(), self.output_dir / "reward_curve.png", title=str(self.model_name)
        )

    def close(self) -> None:
        """Stop the server, close the store, the loggers and the engine (if the trainer made it)."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.metrics.close()
        if self._owns_engine:
            self.engine.close()
        self.store.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_algorithm(algorithm: Any) -> None:
    if not isinstance(algorithm, (GRPO, PPO, SFT)):
        raise TypeError(
            f"algorithm must be agl.GRPO(...), agl.PPO(...) or agl.SFT(...), got {type(algorithm).__name__}"
        )


def _micro_batches(samples: list[Sample], most: int, max_tokens: int) -> list[list[Sample]]:
    """Split samples (in order) so each chunk has at most ``most`` samples and, padded, ``max_tokens``."""
    chunks: list[list[Sample]] = []
    cur: list[Sample] = []
    p_max = r_max = 0
    for s in samples:
        p, r = max(p_max, len(s.prompt_ids)), max(r_max, len(s.response_ids))
        if cur and (len(cur) >= most or (len(cur) + 1) * (p + r) > max_tokens):
            chunks.append(cur)
            cur, p, r = [], len(s.prompt_ids), len(s.response_ids)
        cur.append(s)
        p_max, r_max = p, r
    if cur:
        chunks.append(cur)
    return chunks


def _adapter_params(model: Any, adapter: str) -> list[torch.nn.Parameter]:
    """The weights of one peft adapter (``...lora_A.<adapter>.weight``...), whatever is active."""
    out = []
    for name, p in model.named_parameters():
        parts = name.split(".")
        if any(parts[i].startswith("lora_") and parts[i + 1] == adapter for i in range(len(parts) - 1)):
            out.append(p)
    return out


def _enable_gradient_checkpointing(model: Any) -> None:
    """Turn on transformers' gradient checkpointing under a peft model, non-reentrant: the reentrant
    variant needs an input that requires grad, which a frozen embedding of a LoRA model is not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(base).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x names it so
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _is_checkpointing(model: Any) -> bool:
    """Whether gradient (activation) checkpointing is on in ``model`` (a peft model or not)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(base), name):
            return bool(getattr(base, name))
    return False


def _memory_stats() -> dict[str, float]:
    """The process's resident size now (after the step's memory was released) and its peak so far."""
    now = rss_mib()
    return {"memory/peak_rss_mib": round(peak_rss_mib(), 1)} | (
        {} if now is None else {"memory/rss_mib": round(now, 1)}
    )


def _release_cuda_cache(device: torch.device) -> None:
    """Return the CUDA caching allocator's free blocks (no-op elsewhere): after generation, the KV
    caches' blocks are of many sizes; giving them back lets the update allocate large contiguous ones."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True
