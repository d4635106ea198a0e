"""The update side of training: samples in, metrics out, new weights handed to the engine.

A :class:`Learner` owns the training model and its trained adapters (one :class:`~.policies.Policy`
each: optimiser, PPO value head), the old and reference logprobs, micro-batching and the update
(:mod:`.update`), and the hand-over of the new weights to the serving engine (:mod:`.weights`). The
algorithm (:class:`~.algorithm.WeightUpdate`) says what its update does with the samples, given a
:class:`~.algorithm.StepContext` of the step (never the learner); the learner knows nothing of
agents, stores or servers. ``Trainer`` builds one (``trainer.learner``); so does
each data-parallel rank (:meth:`~.distributed.DataParallel.follow` feeds it rank 0's samples).

Its optimisation primitives are Tinker's (:mod:`.primitives`): ``forward_backward(batch, loss)``
(gradients accumulate, losses sum over tokens), ``optim_step(adam_params)`` and ``forward(batch)``, on
:class:`~.datum.Datum` batches; GRPO, PPO and SFT run their updates on the same functions.

>>> learner = trainer.learner  # doctest: +SKIP
>>> learner.learn(samples, step=3)["train/loss"]  # doctest: +SKIP
0.0123
>>> out = learner.forward_backward([Datum.from_tokens(ids, weights=w)], "cross_entropy")  # doctest: +SKIP
>>> learner.optim_step(AdamParams(learning_rate=1e-4))["grad_norm"]  # doctest: +SKIP
0.41
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..serving.engines.contract import ServingEngine
from ..store.base import Store
from ._runtime import prepare_update_memory
from .algorithm import StepContext, WeightUpdate
from .batching import Sample, packs
from .checkpoint import policy_states, resume_latest, save_checkpoint, save_policies
from .config import SampleConfig, UpdateConfig
from .datum import AdamParams, Datum, ForwardBackwardOutput
from .distributed import DataParallel, TrainOnly
from .engine_setup import build_engine, training_model, update_autocast
from .policies import Policy, PolicyPlan, adapter_params, build_policies, make_optimizer
from .primitives import LossFn, forward_backward, optim_step
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

    # -- the primitives (Tinker's) ------------------------------------------------------------
    def forward_backward(
        self,
        batch: Sequence[Datum],
        loss: str | LossFn,
        loss_fn_config: Mapping[str, float] | None = None,
        *,
        policy: str | None = None,
    ) -> ForwardBackwardOutput:
        """Add the gradients of ``loss`` on ``batch`` to those of ``policy`` (default: the only one);
        they accumulate until :meth:`optim_step`. ``loss``: ``"cross_entropy"``,
        ``"importance_sampling"``, ``"ppo"`` or ``"cispo"`` (:mod:`.losses`, summed over tokens, with
        ``loss_fn_config`` such as ``{"clip_low_threshold": 0.8}``), or a callable taking a
        :class:`~.primitives.LossBatch`. Returns each datum's ``logprobs`` and ``loss:sum``.

        >>> out = learner.forward_backward([Datum.from_tokens([1, 2, 3], weights=[1, 1])],
        ...                                "cross_entropy")  # doctest: +SKIP
        >>> out.metrics["loss:sum"]  # doctest: +SKIP
        11.04
        """
        pol = self._policy(policy)
        with self._using(pol, train=True):
            return forward_backward(self.model, batch, loss, loss_fn_config, **self._pass_options(pol))

    def forward(
        self,
        batch: Sequence[Datum],
        loss: str | LossFn | None = None,
        loss_fn_config: Mapping[str, float] | None = None,
        *,
        policy: str | None = None,
    ) -> ForwardBackwardOutput:
        """:meth:`forward_backward` without gradients: each datum's ``logprobs`` (and ``loss:sum``
        when a ``loss`` is given), the gradients left as they are.

        >>> out = learner.forward([Datum.from_tokens([1, 2, 3], weights=[1, 1])])  # doctest: +SKIP
        >>> out.loss_fn_outputs[0]["logprobs"]  # doctest: +SKIP
        tensor([-5.5, -5.6])
        """
        pol = self._policy(policy)
        with self._using(pol, train=False), torch.no_grad():
            return forward_backward(
                self.model, batch, loss, loss_fn_config, backward=False, **self._pass_options(pol)
            )

    def optim_step(self, adam_params: AdamParams, *, policy: str | None = None) -> dict[str, float]:
        """One AdamW step of ``policy``'s adapter on the gradients accumulated since the last step,
        with ``adam_params`` (learning rate, betas, eps, weight decay, gradient clipping), then the
        gradients zeroed and the new weights handed to the engine (its version goes up). Returns
        ``grad_norm`` and ``learning_rate``.

        >>> learner.optim_step(AdamParams(learning_rate=1e-4, grad_clip_norm=1.0))  # doctest: +SKIP
        {'grad_norm': 0.41, 'learning_rate': 0.0001}
        """
        if not isinstance(adam_params, AdamParams):
            raise TypeError(f"optim_step takes AdamParams(...), got {type(adam_params).__name__}")
        pol = self._policy(policy)
        out: dict[str, float] = {}

        def step(model: Any) -> None:
            if pol.adapter is not None and model.active_adapter != pol.adapter:
                model.set_adapter(pol.adapter)
            out.update(optim_step(pol.optimizer, adam_params, value_head=pol.value_head))

        self.weights.apply(step, [pol.adapter])
        return out

    def add_policy(self, policy: Policy) -> None:
        """Train ``policy`` too (an adapter added to the model after the learner was built, with its
        own optimiser); its name must be new.

        >>> learner.add_policy(Policy("b", "b", None, torch.optim.AdamW(params), None))  # doctest: +SKIP
        """
        if any(p.name == policy.name for p in self.policies):
            raise ValueError(f"a policy named {policy.name!r} is already trained by this learner")
        self.policies.append(policy)

    def _policy(self, name: str | None) -> Policy:
        """The policy called ``name`` (``None``: the only one)."""
        if name is None:
            if len(self.policies) == 1:
                return self.policies[0]
            raise ValueError(
                f"this learner trains {len(self.policies)} policies: name one with policy= "
                f"({', '.join(p.name for p in self.policies)})"
            )
        for pol in self.policies:
            if pol.name == name:
                return pol
        raise ValueError(
            f"no policy {name!r}; this learner trains {', '.join(p.name for p in self.policies)}"
        )

    @contextmanager
    def _using(self, pol: Policy, train: bool) -> Iterator[None]:
        """``pol``'s adapter active, in train or eval mode; under the engine's lock when the engine
        serves this very model (no request decodes meanwhile)."""
        lock = self.weights.trainable().lock if self.weights.in_place else nullcontext()
        with lock:
            if pol.adapter is not None and self.model.active_adapter != pol.adapter:
                self.model.set_adapter(pol.adapter)
            self.model.train(train)
            if pol.value_head is not None:
                pol.value_head.train(train)
            try:
                yield
            finally:
                self.model.eval()

    def _pass_options(self, pol: Policy) -> dict[str, Any]:
        algo = self.algorithm
        return {
            "value_head": pol.value_head,
            "autocast": self.autocast,
            "pad_id": self.pad_id,
            "share_prefix": self.update_config.share_prefix and packs(self.model),
            "micro_batch_size": int(getattr(algo, "micro_batch_size", 8)),
            "micro_batch_tokens": int(getattr(algo, "micro_batch_tokens", 2048)),
        }

    def use_algorithm(self, algorithm: WeightUpdate) -> None:
        """Update with ``algorithm`` from now on: the same adapters, a fresh optimiser for each."""
        self.algorithm = check_algorithm(algorithm)
        for pol in self.policies:
            params = adapter_params(self.model, pol.adapter)
            pol.optimizer, pol.value_head = make_optimizer(algorithm, params, self.model, self.device)

    @contextmanager
    def using_weights(self, weights: WeightHandOver) -> Iterator[WeightHandOver]:
        """Hand the new weights over through ``weights`` inside the block; the hand-over the learner had
        is back when the block ends, on an error too (asynchronous rollouts with ``handover="drain"``
        switch the weights with the engine paused this way).

        >>> import torch, agentlightning_lite as agl
        >>> from agentlightning_lite.serving.engines import ScriptedEngine
        >>> model = torch.nn.Linear(2, 2)
        >>> engine = ScriptedEngine(["hi"], tokenizer="bytes")
        >>> learner = Learner(model, [], WeightHandOver(engine, model), agl.GRPO())
        >>> before, other = learner.weights, WeightHandOver(engine, model)
        >>> with learner.using_weights(other):
        ...     learner.weights is other
        True
        >>> learner.weights is before
        True
        """
        previous, self.weights = self.weights, weights
        try:
            yield weights
        finally:
            self.weights = previous

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
