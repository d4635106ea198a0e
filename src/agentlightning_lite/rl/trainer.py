"""``agl.Trainer``: run the agent, turn its runs into samples, update the LoRA policy, repeat.

A step is a :class:`~.session.Rollouts` session (serve the policy, run ``batch_size`` tasks
``group_size`` times each through the agent, make the samples) and a :class:`~.learner.Learner`
(update each policy as the algorithm says, hand the new weights to the engine). Between steps the
trainer logs, evaluates every ``eval_every`` steps and checkpoints every ``save_every`` steps.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._progress import progress
from ..air import AIRRule, as_rules
from ..credit import CreditRule
from ..lora_settings import LoRA
from ..prompts import load_prompts
from ..serving.engines.contract import ServingEngine
from ..store.base import Store
from ..store.sqlite import SQLiteStore
from ..tracer import Tracer
from . import config as cfg
from ._memory import release_host_memory
from ._runtime import release_cuda_cache, show_step
from .algorithm import Algorithm, WeightUpdate, rollout_only
from .async_rollouts import AsyncBatches
from .distributed import DataParallel
from .doctor import Watch
from .evaluation import FailedSteps, evaluation_summary, step_metrics, validation_metrics
from .grpo import GRPO
from .learner import Learner, check_algorithm
from .metrics import MetricsLogger, plot_reward_curve
from .policies import plan_for
from .preflight import estimate, fit_timeout
from .session import RolloutBatch, Rollouts
from .sources import RolloutSource
from .step_batches import BatchSource, SyncBatches
from .timing import Timer

__all__ = ["Trainer"]

logger = logging.getLogger(__name__)


class Trainer:
    """Train an existing agent's policy model with reinforcement learning on LoRA weights.

    Args:
        model: a name from ``agl.models`` (``"smollm2-135m"``, embedded), a Hugging Face id or a path.
        algorithm: ``agl.GRPO(...)`` (default), ``agl.PPO(...)``, ``agl.SFT(...)`` (supervised, on the
            recorded calls), or ``agl.APO(...)``: ``fit`` then optimises the prompts (docs/apo.md).
        prompts: fixed prompts of every rollout (``agl.prompt`` reads them): a ``prompts.json`` or a dict.
        lora: ``agl.LoRA(...)`` adapter settings (``load_in_4bit=True`` for QLoRA on a GPU).
        engine: ``"auto"`` (vLLM on a GPU when installed, else transformers), ``"hf"``, ``"vllm"``, or
            an engine instance; ``engine_options``: keyword arguments of the engine built from a name
            (``{"num_threads": 1}`` for ``"hf"``, ``{"gpu_memory_utilization": 0.4}`` for ``"vllm"``).
        store: where rollouts and spans go (default: ``SQLiteStore(output_dir/"runs.db")``).
        agents: train only these agents' LLM calls; the others' stay frozen.
        policies: one LoRA adapter per agent on one base model, trained together:
            ``{"writer": agl.LoRA(r=16), "rewriter": "writer", "checker": None}`` (an agent's own
            ``agl.LoRA``, another agent's name to share its adapter, a saved adapter's directory
            served frozen, or ``None``: the base model); each has its own optimiser, metrics
            (``<agent>/train/loss``), checkpoints and saved adapter (docs/training.md). Not with
            ``lora=`` or ``agents=``.
        credit, air: the credit rule (default ``credit.FinalReward()``) and AIR rule(s) of the samples.
        output_dir: metrics, reward curve, checkpoints, the final adapter.
        batch_size: tasks per step (each run ``algorithm.group_size`` times); ``seed``: data order,
            sampling seeds and torch.
        runners: where rollouts run: ``None`` (threads of this process), ``agl.RemoteRunners(...)``,
            ``agl.RayRunners(...)``, any :class:`~.sources.RolloutSource`.
        rollout_config, sample_config, update_config, checkpoint_config, logging_config: the knobs in
            groups, each default written once (:mod:`agentlightning_lite.rl.config`); read and set
            them there (``trainer.rollout_config.timeout``). A keyword of the old one-by-one style
            (``rollout_timeout=60``) raises a ``TypeError`` that names its group.

    ``trainer.rollouts`` (:class:`~.session.Rollouts`) and ``trainer.learner``
    (:class:`~.learner.Learner`) are the two halves of a step. Each step's metrics time its phases
    (``timing/rollouts``, ``timing/samples``, ``timing/old_logprobs``, ``timing/ref_logprobs``,
    ``timing/advantages``, ``timing/update``, ``timing/weights``, in seconds).

    >>> import agentlightning_lite as agl
    >>> def agent(task, llm):  # any function (task, llm) -> reward, or an agl.LitAgent
    ...     client = llm.openai_client()
    ...     reply = client.chat.completions.create(model=llm.model, max_tokens=8,
    ...         messages=[{"role": "user", "content": task["question"]}]).choices[0].message.content
    ...     return float(task["answer"] in reply)
    >>> trainer = agl.Trainer(model="smollm2-135m", algorithm=agl.GRPO(group_size=4),
    ...                       lora=agl.LoRA(r=8), output_dir="runs/demo")  # doctest: +SKIP
    >>> trainer.fit(agent, [{"question": "2+2=?", "answer": "4"}], steps=2)  # doctest: +SKIP
    """

    @cfg.reject_moved_keywords  # Trainer(rollout_timeout=...): a TypeError naming its group
    def __init__(
        self,
        model: Any = "smollm2-135m",
        algorithm: Algorithm | None = None,
        lora: LoRA | None = None,
        engine: str | ServingEngine = "auto",
        engine_options: dict[str, Any] | None = None,
        store: Store | None = None,
        agents: Sequence[str] | None = None,
        credit: CreditRule | None = None,
        air: AIRRule | Sequence[AIRRule] | None = None,
        output_dir: str | os.PathLike[str] = "runs/agl",
        batch_size: int = 8,
        seed: int = 0,
        server_options: dict[str, Any] | None = None,
        runners: RolloutSource | None = None,
        policies: Mapping[str, Any] | None = None,
        prompts: str | os.PathLike[str] | Mapping[str, str] | None = None,
        rollout_config: cfg.RolloutConfig | None = None,
        sample_config: cfg.SampleConfig | None = None,
        update_config: cfg.UpdateConfig | None = None,
        checkpoint_config: cfg.CheckpointConfig | None = None,
        logging_config: cfg.LoggingConfig | None = None,
    ) -> None:
        groups = cfg.resolve(locals())  # one config object per group
        plan = plan_for(policies, lora, agents)
        self.lora, self.agents = plan.lora, plan.trained_agents()
        self._rollout_only = rollout_only(algorithm)  # agl.APO: fit optimises the prompts instead
        weighted = algorithm is not None and self._rollout_only is None
        weight_algorithm = check_algorithm(algorithm if weighted else GRPO())
        rollouts: cfg.RolloutConfig = groups["rollout_config"]  # default concurrency: a whole step's
        self.rollout_config = rollouts.or_concurrency(batch_size * weight_algorithm.group_size)
        self.sample_config: cfg.SampleConfig = groups["sample_config"]
        self.update_config: cfg.UpdateConfig = groups["update_config"]
        self.checkpoint_config: cfg.CheckpointConfig = groups["checkpoint_config"]
        self.logging_config: cfg.LoggingConfig = groups["logging_config"]
        if runners is not None and not isinstance(runners, RolloutSource):
            raise TypeError(f"runners must be agl.RemoteRunners(...) or agl.RayRunners(...), got {runners!r}")
        self.model_name, self.output_dir = model, Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.store = store if store is not None else SQLiteStore(self.output_dir / "runs.db")
        self.tracer = Tracer(self.store)
        self.credit, self.air = credit, as_rules(air)
        self.batch_size, self.seed, self.runners = batch_size, seed, runners
        self.server_options = dict(server_options or {})
        self._failed = FailedSteps()
        self._decode_step_s: dict[int, float] = {}  # the engine's decoding step time by batch width
        self.step, self.data_position = 0, (0, 0)  # data position: (epoch, index in its shuffle)
        random.seed(seed), torch.manual_seed(seed)
        # -- the learner: engine, training model, policies ---------------------------------------
        self._owns_engine, self.engine_options = isinstance(engine, str), dict(engine_options or {})
        self.learner = learner = Learner.build(
            engine, model, plan, weight_algorithm, self.update_config, self.sample_config,
            seed=seed, concurrency=self.rollout_config.concurrency or 1, engine_options=self.engine_options,
            output_dir=self.output_dir,
        )  # fmt: skip
        self.engine, self.policy, self.device = learner.weights.engine, learner.model, learner.device
        self.autocast, self.gradient_checkpointing = learner.autocast, learner.gradient_checkpointing
        self.metrics = MetricsLogger(self.output_dir, self.logging_config.loggers)
        # -- the rollouts: where they run, how they become samples -------------------------------
        self.rollouts = Rollouts(
            self.engine, self.store, self.tracer, self.rollout_config, self.sample_config,
            source=runners, server_options=self.server_options, prompts=load_prompts(prompts),
            credit=credit, air=self.air, agents=self.agents, agent_policy=plan.agent_policy(),
        )  # fmt: skip

    @property
    def algorithm(self) -> WeightUpdate:
        """The algorithm that updates the weights (``agl.GRPO`` by default)."""
        return self.learner.algorithm

    @property
    def prompts(self) -> dict[str, str]:
        """The fixed prompts every rollout reads (``agl.prompt``); ``agl.APO`` sets its best ones."""
        return self.rollouts.prompts

    @prompts.setter
    def prompts(self, value: Mapping[str, str]) -> None:
        self.rollouts.prompts = dict(value)

    @property
    def policies(self) -> dict[str, list[str] | None]:
        """The trained policies: name -> the agents whose calls train it (``None``: every agent).

        >>> trainer.policies  # doctest: +SKIP
        {'writer': ['writer'], 'rewriter': ['rewriter']}
        """
        return {p.name: p.agents for p in self.learner.policies}

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimiser of a run with one policy (``None`` with several: each has its own)."""
        return self.learner.optimizer

    @property
    def value_head(self) -> Any:
        """The PPO value head of a run with one policy (``None`` otherwise)."""
        return self.learner.value_head

    def use_algorithm(self, algorithm: Algorithm) -> None:
        """Train with ``algorithm`` from now on: same adapter(s), a fresh optimiser for each; an
        algorithm that only rolls out (``agl.APO``) makes ``fit`` optimise the prompts instead.

        >>> trainer.use_algorithm(agl.GRPO(group_size=8))  # doctest: +SKIP
        """
        self._rollout_only = rollout_only(algorithm)  # fit then optimises the prompts, not the weights
        if self._rollout_only is None:
            self.learner.use_algorithm(check_algorithm(algorithm))

    # -- the loop -------------------------------------------------------------------------
    def fit(
        self,
        agent: Callable[..., Any],
        train_dataset: Sequence[Any],
        val_dataset: Sequence[Any] | None = None,
        steps: int | None = None,
        epochs: int = 1,
        resume: bool = False,
        algorithm: Algorithm | None = None,
    ) -> dict[str, Any]:
        """Train ``agent`` on ``train_dataset`` until step ``steps`` (default: ``epochs`` passes): roll
        out, make samples, learn (and hand the weights over), log, evaluate, checkpoint.

        ``agent`` is a function ``(task, llm) -> float | None`` (sync or async) or an ``agl.LitAgent``.
        ``resume=True`` loads the newest checkpoint in ``output_dir`` (adapter, optimiser, RNG, data
        position, step) and continues. ``algorithm`` switches to another algorithm from here on (a
        fresh optimiser, same adapter): ``fit(agent, tasks, algorithm=agl.SFT(teacher=engine))``, then
        ``fit(agent, tasks, steps=trainer.step + 8, algorithm=agl.GRPO())`` (``steps`` is the step to
        stop at). Returns the final metrics (with the last validation scores when ``val_dataset`` is given).
        """
        if len(train_dataset) == 0:
            raise ValueError("train_dataset is empty")
        if algorithm is not None:
            self.use_algorithm(algorithm)
        if self._rollout_only is not None:  # prompt optimisation: see agl.APO
            return self._rollout_only.run(self, agent, train_dataset, val_dataset, resume=resume)
        total = steps if steps is not None else math.ceil(len(train_dataset) / self.batch_size) * epochs
        dp = DataParallel.start(self.learner, self._resume if resume else None)
        if dp is not None and not dp.is_main:  # a rank other than 0: its share of each step's update
            followed, self.step = dp.follow(self.learner, self.step, total), max(self.step, total)
            return followed
        self._fit_timeout(agent, self.batch_size * getattr(self.algorithm, "group_size", 1))
        last: dict[str, Any] = {}
        bar = progress(total, "training", initial=min(self.step, total))
        evaluated = lambda: bool((n := self.logging_config.eval_every) and self.step % n == 0)  # noqa: E731
        validate = lambda: validation_metrics(self.evaluate(agent, val_dataset or []))  # noqa: E731
        watch = Watch()  # why the reward is flat: each finding logged once, when it first shows

        def end_step(metrics: dict[str, Any]) -> None:
            """After a step: validate, log, check the run so far, stop after too many failed steps,
            checkpoint, show progress."""
            if val_dataset is not None and evaluated():
                metrics.update(validate())
            self.metrics.log(self.step, metrics)
            for f in watch.step({"step": self.step, **metrics}):
                logger.warning(
                    "step %d: [%s] %s: %s; try: %s", self.step, f.code, f.message, f.figure, f.advice
                )
            self._failed.check(self.rollout_config.max_failed_steps, self.step)
            if (save := self.checkpoint_config.save_every) and self.step % save == 0:
                self.save_checkpoint()
            show_step(bar, metrics)

        try:
            with self.rollouts.serving(), self._batch_source(agent, train_dataset, total) as batches:
                while self.step < total:  # the one loop: whichever source, the same update and metrics
                    timer = Timer(self.device)
                    got = batches.next(self.step, timer)
                    last = self._update(got.batch, timer, got.metrics)
                    self.data_position = got.position
                    batches.done(self.step - 1, last)
                    end_step(last)
                if val_dataset is not None and not evaluated():
                    last.update(final := validate())
                    self.metrics.log(self.step, final)
            if watch.rows:  # the findings once more, together (agl-lite doctor OUTPUT_DIR says the same)
                found, lines = watch.summary()
                logger.log(logging.WARNING if found else logging.INFO, "%s", "\n".join(lines))
        finally:
            if bar is not None:
                bar.close()
            self.plot()
        return last

    def _batch_source(self, agent: Callable[..., Any], dataset: Sequence[Any], total: int) -> BatchSource:
        """Where ``fit``'s batches come from: rolled out at each step, or ahead (``async_rollouts``)."""
        args = (self.rollouts, agent, dataset, self.batch_size, self.seed, self.data_position, self.algorithm)
        if not self.rollout_config.async_rollouts:
            return SyncBatches(*args)
        return AsyncBatches(
            *args, first_step=self.step, last_step=total, max_staleness=self.sample_config.max_staleness,
            learner=self.learner, handover=self.rollout_config.handover,
        )  # fmt: skip

    def train_step(self, agent: Callable[..., Any], tasks: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        """One step on the given ``(index, task)`` pairs: roll out, make samples, learn (which hands
        the new weights over); returns its metrics."""
        timer = Timer(self.device)
        return self._update(self.rollouts.step(agent, tasks, self.step, self.algorithm, timer), timer)

    def _update(
        self, batch: RolloutBatch, timer: Timer, extra: Mapping[str, float] | None = None
    ) -> dict[str, Any]:
        """Learn from a step's batch (which hands the new weights over), count the step; its metrics."""
        release_cuda_cache(self.device)  # the rollouts' KV caches: give their blocks back first
        with timer.phase("learn"):
            update_stats = self.learner.learn(batch.samples, self.step, timer)
        release_host_memory()  # the update's freed activations: back to the OS, not kept in the heap
        self.step += 1
        self._failed.record(batch.results)
        metrics = step_metrics(batch, update_stats, timer, self.rollout_config, self.engine.version)
        return {**metrics, **(extra or {})}

    def evaluate(self, agent: Callable[..., Any], dataset: Sequence[Any]) -> dict[str, float]:
        """Run ``agent`` once per task in ``mode="val"``: mean reward, success rate, failures.

        >>> trainer.evaluate(agent, val_tasks)  # doctest: +SKIP
        {'mean_reward': 0.31, 'success_rate': 0.31, 'n': 50, 'failed': 0}
        """
        self._fit_timeout(agent, len(dataset))
        results = self.rollouts.evaluate(agent, dataset, self.step)
        release_host_memory()
        return evaluation_summary(results, self.rollout_config)

    def _fit_timeout(self, agent: Callable[..., Any], rollouts: int) -> None:
        """Before ``rollouts`` rollouts of ``agent``: size ``RolloutConfig(timeout="auto")`` to the engine,
        or warn that a set timeout is short (:mod:`.preflight`; the engine is timed once)."""
        at_once = min(rollouts, self.rollout_config.concurrency or rollouts)
        engine = self.algorithm.rollout_engine() or self.engine  # SFT(teacher=...): the teacher plays
        fit_timeout(self.rollout_config, estimate(engine, agent, at_once, self._decode_step_s))

    def _resume(self) -> None:
        """Load the newest checkpoint (through the engine, which bumps its version) and its data position."""
        state = self.learner.resume(self.output_dir / "checkpoints", self.store)
        if state is not None:
            self.step, self.data_position = state["step"], (state["epoch"], state["cursor"])

    def save_checkpoint(self) -> Path:
        """Write a resumable checkpoint to ``output_dir/checkpoints/step-N`` (with one adapter per
        agent: each adapter, optimiser and value head under ``step-N/policies/<agent>/``)."""
        (epoch, cursor), directory = self.data_position, self.output_dir / "checkpoints"
        state = {"epoch": epoch, "cursor": cursor, "seed": self.seed}
        return self.learner.save_checkpoint(directory, self.step, state, self.checkpoint_config.keep)

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Save the trained adapter (peft format, safetensors) to ``path`` (default ``output_dir/adapter``).

        With ``policies=``, each trained adapter goes to its own directory ``path/<agent>``
        (default ``output_dir/adapters/<agent>``). Load one later with
        ``agl.engines.HFEngine(model, lora=path)`` or ``peft.PeftModel.from_pretrained``.
        """
        return self.learner.save(path, self.output_dir)

    def plot(self) -> Path | None:
        """Draw ``output_dir/reward_curve.png`` from the logged metrics."""
        return plot_reward_curve(
            self.metrics.rows(), self.output_dir / "reward_curve.png", str(self.model_name)
        )

    def close(self) -> None:
        """Stop the server, close the store, the loggers and the engine (if the trainer made it)."""
        self.rollouts.stop()
        self.metrics.close()
        if self._owns_engine:
            self.engine.close()
        self.store.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
