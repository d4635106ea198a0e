"""The update side of training: samples in, metrics out, new weights handed to the engine.

A :class:`Learner` owns the training model and its trained adapters (one :class:`~.policies.Policy`
each: optimiser, PPO value head), the old and reference logprobs, micro-batching and the update
(:mod:`.update`), and the hand-over of the new weights to the serving engine (:mod:`.weights`). The
algorithm (:class:`~.algorithm.WeightUpdate`) says what its update does with the samples, given a
:class:`~.algorithm.StepContext` of the step (never the learner); the learner knows nothing of
agents, stores or servers. ``Trainer`` builds one (``trainer.learner``); so does
each data-parallel rank (:meth:`~.distributed.DataParallel.follow` feeds it rank 0's samples).

>>> learner = trainer.learner  # doctest: +SKIP
>>> learner.learn(samples, step=3)["train/loss"]  # doctest: +SKIP
0.0123
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..serving.engines.contract import ServingEngine
from ..store.base import Store
from ._runtime import prepare_update_memory
from .algorithm import StepContext, WeightUpdate
from .batching import Sample
from .checkpoint import policy_states, resume_latest, save_checkpoint, save_policies
from .config import SampleConfig, UpdateConfig
from .distributed import DataParallel, TrainOnly
from .engine_setup import build_engine, training_model, update_autocast
from .policies import Policy, PolicyPlan, adapter_params, build_policies, make_optimizer
from .timing import Timer
from .update import UpdateSettings, optimise, train_policy, update_policies
from .weights import WeightHandOver

__all__ = ["Learner", "check_algorithm"]


def check_algorithm(algorithm: Any) -> WeightUpdate:
    """``algorithm`` when it updates weights (``agl.GRPO``, ``agl.PPO``, ``agl.SFT``); else a TypeError."""
    if not isinstance(algorithm, WeightUpdate) or not algorithm.updates_weights:
        raise TypeError(
            f"algorithm must be agl.GRPO(...), agl.PPO(...) or agl.SFT(...), got {type(algorithm).__name__}"
        )
    return algorithm


class Learner:
    """Update the trained policies of ``model`` on samples with ``algorithm``; hand the weights over.

    Args:
        model: the training model (a peft model holding every trained adapter).
        policies: the trained adapters, each with its optimiser (:func:`~.policies.build_policies`).
        weights: how new weights reach the serving engine (:class:`~.weights.WeightHandOver`).
        algorithm: ``agl.GRPO(...)``, ``agl.PPO(...)`` or ``agl.SFT(...)``.
        update_config, sample_config: how the update computes; whether samples are merged
            trajectories (``sample_config.transitions == "trajectory"``). Shared with the trainer.
        autocast: the dtype the update autocasts to (bf16 on CUDA), or ``None``.
        seed: the run's seed (SFT's shuffles derive from it and the step).
    """

    def __init__(
        self,
        model: Any,
        policies: list[Policy],
        weights: WeightHandOver,
        algorithm: WeightUpdate,
        *,
        update_config: UpdateConfig | None = None,
        sample_config: SampleConfig | None = None,
        autocast: Any = None,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.policies = policies
        self.weights = weights
        self.algorithm = check_algorithm(algorithm)
        self.update_config = update_config if update_config is not None else UpdateConfig()
        self.sample_config = sample_config if sample_config is not None else SampleConfig()
        self.device = next(model.parameters()).device
        self.autocast = autocast
        self.seed = seed
        self.gradient_checkpointing = False  #: whether the update recomputes activations (see ``build``)

    @classmethod
    def build(
        cls,
        engine: str | ServingEngine,
        model: Any,
        plan: PolicyPlan,
        algorithm: WeightUpdate,
        update_config: UpdateConfig,
        sample_config: SampleConfig,
        *,
        seed: int = 0,
        concurrency: int = 1,
        engine_options: dict[str, Any] | None = None,
        output_dir: Path = Path("."),
    ) -> Learner:
        """The serving engine (built from a name, or the one given), the training model with the
        adapters of ``plan``, and the learner over them (``learner.weights.engine`` is the engine)."""
        built, hf_copy = build_engine(
            engine, model, plan, seed=seed, concurrency=concurrency, options=dict(engine_options or {}),
            output_dir=output_dir,
        )  # fmt: skip
        policy = training_model(built, hf_copy, model, plan, seed)
        device = next(policy.parameters()).device
        learner = cls(
            policy,
            build_policies(plan, policy, algorithm, device),
            WeightHandOver(built, policy),
            algorithm,
            update_config=update_config,
            sample_config=sample_config,
            autocast=update_autocast(built, device),
            seed=seed,
        )
        learner.gradient_checkpointing = prepare_update_memory(
            policy, update_config, getattr(algorithm, "micro_batch_tokens", 2048), learner.autocast
        )
        return learner

    # -- what the algorithms read -------------------------------------------------------------
    @property
    def merged(self) -> bool:
        """Whether samples are merged trajectories (one sequence per episode)."""
        return self.sample_config.transitions == "trajectory"

    @property
    def pad_id(self) -> int:
        return self.weights.pad_id

    # -- the update ---------------------------------------------------------------------------
    def learn(
        self, samples: list[Sample], step: int | None = None, timer: Timer | None = None
    ) -> dict[str, float]:
        """Update every policy on its own agents' samples (its own advantages, gradient and step) and
        hand the new weights to the engine; returns the metrics (``train/skipped_update`` without samples).
        ``timer``: the step's (its phases are added to it)."""
        if not samples:
            return {"train/skipped_update": 1.0}
        ctx = self.context(step or 0, timer if timer is not None else Timer(self.device))
        return update_policies(self.policies, samples, partial(self.algorithm.update, ctx))

    def context(self, step: int, timer: Timer) -> StepContext:
        """What the algorithm sees of step ``step``: its settings and this learner's ``train`` and
        ``optimise`` for that step."""

        def train(policy: Policy, update: Callable[[Any], None]) -> None:
            self.train(policy, update, timer)

        def optimise(
            samples: list[Sample], policy: Policy | None = None, model: Any = None
        ) -> dict[str, float]:
            return self.optimise(samples, policy, model, step=step, timer=timer)

        return StepContext(
            step=step, seed=self.seed, timer=timer, merged=self.merged, pad_id=self.pad_id,
            autocast=self.autocast, train=train, optimise=optimise,
        )  # fmt: skip

    def train(self, policy: Policy, update: Callable[[Any], None], timer: Timer | None = None) -> None:
        """Run ``update(model)`` with ``policy``'s adapter active, then hand the weights to the engine
        (``timing/update`` and ``timing/weights`` on ``timer``)."""
        train_policy(policy, self.weights, timer if timer is not None else Timer(self.device), update)

    def optimise(
        self,
        samples: list[Sample],
        policy: Policy | None = None,
        model: Any = None,
        *,
        step: int = 0,
        timer: Timer | None = None,
    ) -> dict[str, float]:
        """The policy-gradient epochs of ``policy`` (default: the only one) on samples whose advantages
        are set, on ``model`` (default: the training model), without handing the weights over
        (``step`` names the step in logs; ``timer`` takes the phases)."""
        pol = policy if policy is not None else self.policies[0]
        settings = UpdateSettings(
            device=self.device,
            autocast=self.autocast,
            pad_id=self.pad_id,
            old_logprobs=self.update_config.old_logprobs,
            logprob_tolerance=self.update_config.logprob_tolerance,
            correction=self.update_config.correction,
            merged=self.merged,
            share_prefix=self.update_config.share_prefix,
            step=step,
            timer=timer if timer is not None else Timer(self.device),
            data_parallel=DataParallel.active(),
        )
        target = model if model is not None else self.model
        return optimise(target, samples, self.algorithm, pol.optimizer, pol.value_head, settings)  # type: ignore[arg-type]

    def use_algorithm(self, algorithm: WeightUpdate) -> None:
        """Update with ``algorithm`` from now on: the same adapters, a fresh optimiser for each."""
        self.algorithm = check_algorithm(algorithm)
        for pol in self.policies:
            params = adapter_params(self.model, pol.adapter)
            pol.optimizer, pol.value_head = make_optimizer(algorithm, params, self.model, self.device)

    def train_only(self) -> None:
        """Train this process's copy but never hand it to a shared engine (a rank other than 0)."""
        self.weights = TrainOnly(self.weights.engine, self.weights.model)

    # -- state --------------------------------------------------------------------------------
    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimiser of a run with one policy (``None`` with several: each has its own)."""
        return self.policies[0].optimizer if len(self.policies) == 1 else None

    @property
    def value_head(self) -> Any:
        """The PPO value head of a run with one policy (``None`` otherwise)."""
        return self.policies[0].value_head if len(self.policies) == 1 else None

    def states(self) -> dict[str, tuple[torch.optim.Optimizer, Any]] | None:
        """Each policy's optimiser and value head by name (``None`` with the one shared policy)."""
        return policy_states(self.policies)

    def resume(self, directory: Path, store: Store) -> dict[str, Any] | None:
        """Load the newest checkpoint under ``directory`` (through the engine, which bumps its
        version); returns its saved state (step, data position) or ``None`` when there is none."""
        apply = partial(self.weights.apply, adapters=[p.adapter for p in self.policies])
        return resume_latest(store, directory, self.model, self.policies, apply)

    def save_checkpoint(self, directory: Path, step: int, state: dict[str, Any], keep: int | None) -> Path:
        """Write a resumable checkpoint ``directory/step-N``: the adapter(s), optimiser(s) and value
        head(s), with ``state`` (the data position) beside them; keep the newest ``keep``."""
        return save_checkpoint(
            directory,
            step,
            self.model,
            self.optimizer,
            state,
            self.value_head,
            keep=keep,
            policies=self.states(),
        )

    def save(self, path: str | os.PathLike[str] | None, output_dir: Path) -> Path:
        """Save the trained adapter(s) in peft format (see ``Trainer.save``)."""
        return save_policies(self.model, self.policies, path, output_dir)
