"""``agl.Trainer``: run the agent, turn its runs into transitions, update the LoRA policy, repeat.

One step (:meth:`Trainer.train_step`): take ``batch_size`` tasks; run each ``group_size`` times
through the user's agent (:mod:`.sources`: threads of this process, or remote runners), every rollout
talking to the policy through its own ``server.llm(rollout_id)``; build samples from the store's
transitions (:mod:`.samples`); update each policy (:mod:`.update`: old and reference logprobs,
advantages, the epochs) and hand the new weights to the engine (:mod:`.weights`); log, evaluate every
``eval_every`` steps (:mod:`.evaluation`), checkpoint every ``save_every`` steps (:mod:`.checkpoint`).
The engine and the training model are set up by :mod:`.engine_setup`, the policies by :mod:`.policies`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..air import AIRRule, as_rules
from ..apo import APO, load_prompts, with_prompts
from ..credit import CreditRule
from ..serving.engines.contract import ServingEngine
from ..store.base import Store
from ..store.sqlite import SQLiteStore
from ..tracer import Tracer
from . import config as cfg
from ._memory import release_host_memory
from ._runtime import is_checkpointing as _is_checkpointing  # noqa: F401 (old name)
from ._runtime import memory_stats, prepare_update_memory, progress, release_cuda_cache
from .batching import Sample
from .checkpoint import policy_states, resume_latest, save_checkpoint, save_policies
from .distributed import DataParallel
from .engine_setup import build_engine, training_model, update_autocast
from .evaluation import FailedSteps, evaluation_summary, rollout_metrics
from .grpo import GRPO
from .lora import LoRA
from .metrics import MetricsLogger, plot_reward_curve
from .policies import Policy, adapter_params, build_policies, make_optimizer, plan_for
from .ppo import PPO
from .rollouts import RolloutResult, RolloutSpec
from .samples import build_samples, next_tasks
from .sft import SFT, sft_update
from .sources import InProcessRollouts, RolloutSource, Serving
from .trajectory import merge_trajectories
from .update import Timer, UpdateSettings, optimise, train_policy, update_policies
from .update import micro_batches as _micro_batches  # noqa: F401 (old name)
from .weights import WeightHandOver

__all__ = ["Trainer"]

logger = logging.getLogger(__name__)


class Trainer:
    """Train an existing agent's policy model with reinforcement learning on LoRA weights.

    Args:
        model: the policy: a name from ``agl.models`` (``"smollm2-135m"``, embedded), a Hugging
            Face id or local path.
        algorithm: ``agl.GRPO(...)`` (default), ``agl.PPO(...)`` or ``agl.SFT(...)`` (supervised
            fine-tuning on the recorded calls; ``fit(..., algorithm=...)`` switches from then on), or
            ``agl.APO(...)``: ``fit`` optimises the prompts the agent reads instead (docs/apo.md).
        prompts: fixed prompts of every rollout (``agl.prompt`` reads them): a ``prompts.json`` or a dict.
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
        seed: seeds data order, sampling seeds and torch.
        runners: where rollouts run: ``None`` (threads of this process, the default), or
            ``agl.RemoteRunners(host=, port=, api_key=)`` (runner processes anywhere, started with
            ``agl-lite runner``; ``fit``'s agent is then a label, or what ``agl.RayRunners`` ships
            to its actors).
        concurrency, rollout_timeout, failed_reward, success_threshold, max_failed_steps: how a step's
            rollouts run and what their outcomes count for (:class:`~.config.RolloutConfig`).
        max_seq_len, max_staleness, transitions: which recorded calls become training samples, and
            how (:class:`~.config.SampleConfig`).
        old_logprobs, logprob_tolerance, gradient_checkpointing: how the update computes
            (:class:`~.config.UpdateConfig`).
        save_every, keep_checkpoints: steps between checkpoints, how many are kept
            (:class:`~.config.CheckpointConfig`).
        loggers, eval_every: where metrics go, steps between evaluations (:class:`~.config.LoggingConfig`).

    The knobs come in groups (``agentlightning_lite.rl.config``): ``rollout_config=RolloutConfig(...)``
    (``concurrency``, ``rollout_timeout`` as ``timeout``, ``failed_reward``, ``success_threshold``,
    ``max_failed_steps``), ``sample_config=SampleConfig(...)`` (``max_seq_len``, ``max_staleness``,
    ``transitions``), ``update_config=UpdateConfig(...)`` (``old_logprobs``, ``logprob_tolerance``,
    ``gradient_checkpointing``), ``checkpoint_config=CheckpointConfig(...)`` (``save_every``,
    ``keep_checkpoints`` as ``keep``) and ``logging_config=LoggingConfig(...)`` (``loggers``,
    ``eval_every``): give a group as one object or its knobs one by one, not both. ``runners`` is any
    :class:`~agentlightning_lite.rl.sources.RolloutSource` (``serve``, ``collect``, ``stop``).
    Each step's metrics time its phases: ``timing/rollouts``, ``timing/samples``,
    ``timing/old_logprobs``, ``timing/ref_logprobs``, ``timing/advantages``, ``timing/update``,
    ``timing/weights`` (seconds).

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

    rollout_timeout = cfg.Knob("rollout_config", "timeout")
    failed_reward = cfg.Knob("rollout_config", "failed_reward")
    success_threshold = cfg.Knob("rollout_config", "success_threshold")
    max_failed_steps = cfg.Knob("rollout_config", "max_failed_steps")
    max_seq_len = cfg.Knob("sample_config", "max_seq_len")
    max_staleness = cfg.Knob("sample_config", "max_staleness")
    transitions_mode = cfg.Knob("sample_config", "transitions")
    old_logprobs = cfg.Knob("update_config", "old_logprobs")
    logprob_tolerance = cfg.Knob("update_config", "logprob_tolerance")
    save_every = cfg.Knob("checkpoint_config", "save_every")
    keep_checkpoints = cfg.Knob("checkpoint_config", "keep")
    eval_every = cfg.Knob("logging_config", "eval_every")

    def __init__(
        self,
        model: Any = "smollm2-135m",
        algorithm: GRPO | PPO | SFT | APO | None = None,
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
        runners: RolloutSource | None = None,
        max_staleness: int | None = None,
        transitions: str = "call",
        policies: Mapping[str, Any] | None = None,
        gradient_checkpointing: bool | None = None,
        max_failed_steps: int | None = 1,
        rollout_config: cfg.RolloutConfig | None = None,
        sample_config: cfg.SampleConfig | None = None,
        update_config: cfg.UpdateConfig | None = None,
        checkpoint_config: cfg.CheckpointConfig | None = None,
        logging_config: cfg.LoggingConfig | None = None,
        prompts: str | os.PathLike[str] | Mapping[str, str] | None = None,
    ) -> None:
        groups = cfg.resolve(locals())  # the knobs, one config object per group
        self._plan = plan_for(policies, lora, agents)
        self.lora = self._plan.lora
        self.agents = self._plan.trained_agents()
        self._agent_policy = self._plan.agent_policy()  # trained agent -> policy name (none: "default")
        self.prompts, self._apo = load_prompts(prompts), algorithm if isinstance(algorithm, APO) else None
        self.algorithm = algorithm if algorithm is not None and self._apo is None else GRPO()
        _check_algorithm(self.algorithm)
        # -- the knobs ---------------------------------------------------------------------------
        rollouts: cfg.RolloutConfig = groups["rollout_config"]
        self.rollout_config = dataclasses.replace(
            rollouts, concurrency=rollouts.concurrency or batch_size * self.algorithm.group_size
        )
        self.sample_config: cfg.SampleConfig = groups["sample_config"]
        self.update_config: cfg.UpdateConfig = groups["update_config"]
        self.checkpoint_config: cfg.CheckpointConfig = groups["checkpoint_config"]
        self.logging_config: cfg.LoggingConfig = groups["logging_config"]
        if runners is not None and not isinstance(runners, RolloutSource):
            raise TypeError(f"runners must be agl.RemoteRunners(...) or agl.RayRunners(...), got {runners!r}")
        self.model_name = model
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.store = store if store is not None else SQLiteStore(self.output_dir / "runs.db")
        self.tracer = Tracer(self.store)
        self.credit = credit
        self.air = as_rules(air)
        self.batch_size = batch_size
        self.seed = seed
        self.server_options = server_options = dict(server_options or {})
        self.runners = runners
        self._failed = FailedSteps()
        self.step = 0
        self._epoch = 0
        self._cursor = 0
        random.seed(seed)
        torch.manual_seed(seed)
        # -- the engine, the training model and the policies --------------------------------------
        self._owns_engine = isinstance(engine, str)
        self.engine_options = dict(engine_options or {})
        self.engine, self._hf_copy = build_engine(
            engine,
            model,
            self._plan,
            seed=seed,
            concurrency=self.concurrency,
            options=self.engine_options,
            output_dir=self.output_dir,
        )
        self.policy = training_model(self.engine, self._hf_copy, model, self._plan, seed)
        self._weights = WeightHandOver(self.engine, self.policy)
        self.device = next(self.policy.parameters()).device
        self.autocast = update_autocast(self.engine, self.device)
        self.gradient_checkpointing = prepare_update_memory(self.policy, self.update_config)
        self._policies: list[Policy] = build_policies(self._plan, self.policy, self.algorithm, self.device)
        self.metrics = MetricsLogger(self.output_dir, self.logging_config.loggers)
        # -- where rollouts run ------------------------------------------------------------------
        source = runners if runners is not None else InProcessRollouts(self.tracer, self.rollout_config)
        self._source: RolloutSource = source
        self._serving_state = Serving(source, self.engine, self.store, self.rollout_config, server_options)
        self._timer = Timer(self.device)

    # -- set-up ---------------------------------------------------------------------------
    @property
    def concurrency(self) -> int:
        """Rollouts run at once (default: a whole step's, ``batch_size * group_size``)."""
        return int(self.rollout_config.concurrency or 1)

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        self.rollout_config.concurrency = value

    @property
    def policies(self) -> dict[str, list[str] | None]:
        """The trained policies: name -> the agents whose calls train it (``None``: every agent).

        >>> trainer.policies  # doctest: +SKIP
        {'writer': ['writer'], 'rewriter': ['rewriter']}
        """
        return {p.name: p.agents for p in self._policies}

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimiser of a run with one policy (``None`` with several: each has its own)."""
        return self._policies[0].optimizer if len(self._policies) == 1 else None

    @property
    def value_head(self) -> Any:
        """The PPO value head of a run with one policy (``None`` otherwise)."""
        return self._policies[0].value_head if len(self._policies) == 1 else None

    def use_algorithm(self, algorithm: GRPO | PPO | SFT | APO) -> None:
        """Train with ``algorithm`` from now on: same adapter(s), a fresh optimiser for each.

        >>> trainer.use_algorithm(agl.GRPO(group_size=8))  # doctest: +SKIP
        """
        if isinstance(algorithm, APO):  # fit then optimises the prompts; the weights stay as they are
            self._apo = algorithm
            return
        _check_algorithm(algorithm)
        self.algorithm, self._apo = algorithm, None
        for pol in self._policies:
            params = adapter_params(self.policy, pol.adapter)
            pol.optimizer, pol.value_head = make_optimizer(algorithm, params, self.policy, self.device)

    # -- the loop -------------------------------------------------------------------------
    def fit(
        self,
        agent: Callable[..., Any],
        train_dataset: Sequence[Any],
        val_dataset: Sequence[Any] | None = None,
        steps: int | None = None,
        epochs: int = 1,
        resume: bool = False,
        algorithm: GRPO | PPO | SFT | APO | None = None,
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
        if self._apo is not None:  # prompt optimisation: see agl.APO
            return self._apo.run(self, agent, train_dataset, val_dataset, resume=resume)
        per_epoch = math.ceil(len(train_dataset) / self.batch_size)
        total = steps if steps is not None else per_epoch * epochs
        if (followed := DataParallel.start(self, total, resume)) is not None:  # resume; under torchrun:
            return followed  # a rank other than 0, which only took its share of each step's update
        last: dict[str, Any] = {}
        bar = progress(total, "training", initial=min(self.step, total))

        def evaluated() -> bool:
            return bool(self.eval_every and self.step % self.eval_every == 0)

        try:
            with self._serving():
                while self.step < total:
                    last = self.train_step(agent, self._next_batch(train_dataset))
                    if val_dataset is not None and evaluated():
                        last.update(self._validate(agent, val_dataset))
                    self.metrics.log(self.step, last)
                    self._failed.check(self.max_failed_steps, self.step)
                    if self.save_every and self.step % self.save_every == 0:
                        self.save_checkpoint()
                    if bar is not None:
                        bar.update(1)
                        loss = last.get("train/loss")
                        bar.set_postfix(
                            reward=f"{last.get('train/reward_mean', float('nan')):.3f}",
                            loss="skipped (no reward spread)" if loss is None else f"{loss:.4f}",
                        )
                if val_dataset is not None and not evaluated():
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
        out, self._epoch, self._cursor = next_tasks(
            dataset, self.batch_size, self.seed, self._epoch, self._cursor
        )
        return out

    def train_step(self, agent: Callable[..., Any], tasks: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        """One step on the given ``(index, task)`` pairs; returns its metrics."""
        timer = self._timer = Timer(self.device)
        with self._serving():
            specs = [
                RolloutSpec(task, "train", {"step": self.step, "task_index": idx, "sample": k})
                for idx, task in tasks
                for k in range(self.algorithm.group_size)
            ]
            t0 = time.perf_counter()
            with timer.phase("rollouts"):
                results = self._step_rollouts(agent, specs)
            t_roll = time.perf_counter() - t0
            with timer.phase("samples"):
                samples, sample_stats = self._samples(results)
            release_cuda_cache(self.device)  # the rollouts' KV caches: give their blocks back first
            t1 = time.perf_counter()
            update_stats = self._update(samples) if samples else {"train/skipped_update": 1.0}
            t_update = time.perf_counter() - t1
            release_host_memory()  # the update's freed activations: back to the OS, not kept in the heap
        self.step += 1
        self._failed.record(results)
        return {
            **rollout_metrics(results, self.rollout_config),
            "time/rollouts_s": t_roll,
            "time/update_s": t_update,
            "engine/version": float(self.engine.version),
            **memory_stats(),
            **sample_stats,
            **update_stats,
            **timer.metrics(),
        }

    def _step_rollouts(self, agent: Callable[..., Any], specs: list[RolloutSpec]) -> list[RolloutResult]:
        """A step's rollouts; with ``SFT(teacher=...)`` the teacher plays the policy (its calls are
        recorded alike) when the rollouts run in this process."""
        teacher = getattr(self.algorithm, "teacher", None)
        if teacher is None or not isinstance(self._source, InProcessRollouts):
            return self._run(agent, specs)
        source = InProcessRollouts(self.tracer, self.rollout_config)
        with Serving(source, teacher, self.store, self.rollout_config, self.server_options).session():
            return self._run(agent, specs, source=source)

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
        return evaluation_summary(results, self.rollout_config)

    def _validate(self, agent: Callable[..., Any], dataset: Sequence[Any]) -> dict[str, float]:
        res = self.evaluate(agent, dataset)
        return {"val/reward_mean": res["mean_reward"], "val/success_rate": res["success_rate"]}

    # -- rollouts -------------------------------------------------------------------------
    def _serving(self) -> Any:
        """A context in which the trainer's server runs (started by the outermost, reused inside)."""
        return self._serving_state.session()

    @property
    def _server(self) -> Any:
        return self._serving_state.server

    def _run(
        self, agent: Callable[..., Any], specs: list[RolloutSpec], desc: str = "", source: Any = None
    ) -> list[RolloutResult]:
        """Run the rollouts through the rollout source (``source``: another one, e.g. the teacher's)."""
        bar = progress(len(specs), desc) if desc else None
        specs = [dataclasses.replace(s, metadata=with_prompts(s.metadata, self.prompts)) for s in specs]
        if source is None:  # the agents start together: let a batching engine wait for their first requests
            self.engine.expect(min(len(specs), self.concurrency))
        try:
            return (source or self._source).collect(agent, specs, bar.update if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()

    # -- samples and the update -------------------------------------------------------------
    def _samples(self, results: Sequence[RolloutResult]) -> tuple[list[Sample], dict[str, float]]:
        return DataParallel.shared(build_samples)(  # under torchrun, rank 0's samples go to every rank
            results,
            self.store,
            version=int(self.engine.version),
            failed_reward=self.failed_reward,
            min_reward=getattr(self.algorithm, "min_reward", None),
            agents=self.agents,
            agent_policy=self._agent_policy,
            credit=self.credit,
            air=self.air,
            max_seq_len=self.max_seq_len,
            max_staleness=self.max_staleness,
        )

    def _update(self, samples: list[Sample]) -> dict[str, float]:
        """Update every policy on its own agents' samples: its own advantages, gradient and step."""
        return update_policies(self._policies, samples, self._update_policy)

    def _update_policy(self, policy: Policy, samples: list[Sample]) -> dict[str, float]:
        algo = self.algorithm
        if isinstance(algo, SFT):
            return self._sft_update(policy, samples)
        stats: dict[str, float] = {}
        with self._timer.phase("advantages"):
            stats.update(algo.advantages(samples))  # each call's advantage (GRPO: within its group)
        if stats.get("train/skipped_update"):
            return stats  # e.g. every GRPO group had zero spread: no gradient
        if self.transitions_mode == "trajectory":  # after the per-call advantages: each call keeps its own
            samples, tstats = merge_trajectories(samples)
            stats.update(tstats)
        result: dict[str, float] = {}
        self._train(policy, lambda model: result.update(self._optimise(model, samples, policy)))
        stats.update(result)
        return stats

    def _sft_update(self, policy: Policy, samples: list[Sample]) -> dict[str, float]:
        algo = self.algorithm
        assert isinstance(algo, SFT)
        stats: dict[str, float] = {}
        if self.transitions_mode == "trajectory":
            samples, stats = merge_trajectories(samples)
        seed = self.seed * 1_000_003 + self.step
        pad = self._weights.pad_id
        self._train(
            policy,
            lambda model: stats.update(
                sft_update(model, policy.optimizer, samples, algo, pad, seed, self.autocast)
            ),
        )
        return stats

    def _train(self, policy: Policy, update: Callable[[Any], None]) -> None:
        train_policy(policy, self._weights, self._timer, update)

    def _optimise(self, model: Any, samples: list[Sample], policy: Policy | None = None) -> dict[str, float]:
        """The update of ``policy`` (default: the only one) on samples whose advantages are set."""
        pol = policy if policy is not None else self._policies[0]
        settings = UpdateSettings(
            device=self.device,
            autocast=self.autocast,
            pad_id=self._weights.pad_id,
            old_logprobs=self.old_logprobs,
            logprob_tolerance=self.logprob_tolerance,
            merged=self.transitions_mode == "trajectory",
            step=self.step,
            timer=self._timer,
            data_parallel=DataParallel.active(),
        )
        return optimise(model, samples, self.algorithm, pol.optimizer, pol.value_head, settings)  # type: ignore[arg-type]

    # -- saving ---------------------------------------------------------------------------
    def _policy_states(self) -> dict[str, tuple[torch.optim.Optimizer, Any]] | None:
        return policy_states(self._policies)

    def _resume(self) -> None:
        """Load the newest checkpoint (through the engine, which bumps its version) and its data position."""
        apply = partial(self._weights.apply, adapters=[p.adapter for p in self._policies])
        directory = self.output_dir / "checkpoints"
        state = resume_latest(self.store, directory, self.policy, self._policies, apply)
        if state is not None:
            self.step, self._epoch, self._cursor = state["step"], state["epoch"], state["cursor"]

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
        return save_policies(self.policy, self._policies, path, self.output_dir)

    def plot(self) -> Path | None:
        """Draw ``output_dir/reward_curve.png`` from the logged metrics."""
        path = self.output_dir / "reward_curve.png"
        return plot_reward_curve(self.metrics.rows(), path, title=str(self.model_name))

    def close(self) -> None:
        """Stop the server, close the store, the loggers and the engine (if the trainer made it)."""
        server, self._serving_state.server = self._serving_state.server, None
        if server is not None:
            server.stop()
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
