"""The rollout side of training: serve the policy, run tasks through the agent, make samples.

A :class:`Rollouts` session serves the policy (a PolicyServer over the engine, started by the outermost
:meth:`Rollouts.serving` and reused inside it), runs a batch of tasks through the user's agent with
its rollout source (threads of this process, remote runners, Ray actors), and turns the finished
rollouts into training samples (:mod:`.samples`), each batch tagged with the policy version that
served it. ``Trainer.fit``, ``Trainer.evaluate``, ``agl.APO`` and rank 0 of a data-parallel run use
it (``trainer.rollouts``); it knows nothing of the model's weights.

>>> with trainer.rollouts.serving():  # doctest: +SKIP
...     batch = trainer.rollouts.step(agent, [(0, task)], step=0, algorithm=agl.GRPO(group_size=4))
>>> len(batch.results), batch.version  # doctest: +SKIP
(4, 0)
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from .._progress import progress
from ..air import AIRRule
from ..credit import CreditRule
from ..prompts import with_prompts
from ..run_settings import KEY, describe
from ..serving.engines.contract import ServingEngine
from ..store.base import Store
from ..tracer import Tracer
from .algorithm import Algorithm
from .batching import Sample
from .config import RolloutConfig, SampleConfig
from .distributed import DataParallel
from .rollouts import RolloutResult, RolloutSpec
from .samples import build_samples
from .sources import InProcessRollouts, RolloutSource, Serving
from .timing import Timer

__all__ = ["RolloutBatch", "Rollouts"]


@dataclass
class RolloutBatch:
    """A step's finished rollouts and their training samples.

    ``version`` is the engine's policy version that served them (every call also records its own
    ``weights_version``; ``max_staleness`` drops the samples too far behind)."""

    results: list[RolloutResult]
    samples: list[Sample]
    stats: dict[str, float] = field(default_factory=dict)
    version: int = 0


class Rollouts:
    """Serve ``engine``, run tasks through an agent with ``source``, turn the rollouts into samples.

    Args:
        engine, store, tracer: what serves the policy and where its calls are recorded.
        config: how rollouts run (``concurrency``, ``timeout``, ``failed_reward``...), read at each run.
        sample_config: which recorded calls become samples (``max_seq_len``, ``max_staleness``).
        source: where rollouts run (default: threads of this process).
        server_options: keyword arguments of the PolicyServer.
        prompts: the fixed prompts every rollout reads (``agl.prompt``).
        credit, air: credit rule and AIR rules of the samples.
        agents, agent_policy: the trained agents (``None``: all) and the policy each one's calls train.
    """

    def __init__(
        self,
        engine: ServingEngine,
        store: Store,
        tracer: Tracer,
        config: RolloutConfig,
        sample_config: SampleConfig,
        *,
        source: RolloutSource | None = None,
        server_options: dict[str, Any] | None = None,
        prompts: Mapping[str, str] | None = None,
        credit: CreditRule | None = None,
        air: Sequence[AIRRule] | None = None,
        agents: Sequence[str] | None = None,
        agent_policy: Mapping[str, str] | None = None,
    ) -> None:
        self.engine, self.store, self.tracer = engine, store, tracer
        self.config, self.sample_config = config, sample_config
        self.source: RolloutSource = source if source is not None else InProcessRollouts(tracer, config)
        self.server_options = dict(server_options or {})
        self.prompts: dict[str, str] = dict(prompts or {})
        self.credit, self.air = credit, (list(air) if air is not None else None)
        self.agents = list(agents) if agents is not None else None
        self.agent_policy = dict(agent_policy or {})
        self._serving = Serving(self.source, engine, store, config, self.server_options)
        self._turns = _EngineTurns()

    # -- serving ------------------------------------------------------------------------------
    def serving(self) -> AbstractContextManager[Any]:
        """A context in which the policy is served (started by the outermost, reused inside)."""
        return self._serving.session()

    @property
    def server(self) -> Any:
        """The running PolicyServer (``None`` outside :meth:`serving`)."""
        return self._serving.server

    def stop(self) -> None:
        """Stop the server if one still runs."""
        server, self._serving.server = self._serving.server, None
        if server is not None:
            server.stop()

    # -- running ------------------------------------------------------------------------------
    def run(
        self, agent: Callable[..., Any], specs: Sequence[RolloutSpec], desc: str = "", engine: Any = None
    ) -> list[RolloutResult]:
        """Run one rollout per spec (with the session's prompts); one result per spec, in order.

        ``engine``: another engine plays the policy (``SFT(teacher=...)``), served for these rollouts
        only: on a server of its own when they run in this process; by the source's server (remote
        runners call the trainer's) while they run, other rollouts of that server waiting meanwhile."""
        specs = [dataclasses.replace(s, metadata=with_prompts(s.metadata, self.prompts)) for s in specs]
        bar = progress(len(specs), desc) if desc else None
        tick = bar.update if bar is not None else None
        try:
            if engine is not None and isinstance(self.source, InProcessRollouts):
                source = InProcessRollouts(self.tracer, self.config)
                with Serving(source, engine, self.store, self.config, self.server_options).session():
                    return source.collect(agent, specs, tick)
            if engine is not None:
                with self._turns.serve(self._serving.server, engine, self.engine):
                    return self.source.collect(agent, specs, tick)
            with self._turns.policy():
                # the agents start together: let a batching engine wait for their first requests
                self.engine.expect(min(len(specs), int(self.config.concurrency or 1)))
                return self.source.collect(agent, specs, tick)
        finally:
            if bar is not None:
                bar.close()

    def samples(
        self, results: Sequence[RolloutResult], min_reward: float | None = None
    ) -> tuple[list[Sample], dict[str, float]]:
        """The training samples of ``results`` and their counts; under a launcher, rank 0's samples
        go to every rank."""
        return DataParallel.shared(build_samples)(
            results,
            self.store,
            version=int(self.engine.version),
            failed_reward=self.config.failed_reward,
            min_reward=min_reward,
            agents=self.agents,
            agent_policy=self.agent_policy,
            credit=self.credit,
            air=self.air,
            max_seq_len=self.sample_config.max_seq_len,
            max_staleness=self.sample_config.max_staleness,
            truncated=self.sample_config.truncated,
            truncated_reward=self.sample_config.truncated_reward,
        )

    def step(
        self,
        agent: Callable[..., Any],
        tasks: Sequence[tuple[int, Any]],
        step: int,
        algorithm: Algorithm,
        timer: Timer | None = None,
    ) -> RolloutBatch:
        """Run each ``(index, task)`` ``algorithm.group_size`` times (``mode="train"``) and make the
        samples (``timing/rollouts``, ``timing/samples`` on ``timer``)."""
        timer = timer if timer is not None else Timer()
        version = int(self.engine.version)
        before = _engine_counters(self.engine)
        with timer.phase("rollouts"):
            results = self.step_results(agent, tasks, step, algorithm)
        work = _engine_work(before, _engine_counters(self.engine), timer.seconds.get("rollouts", 0.0))
        with timer.phase("samples"):
            samples, stats = self.samples(results, algorithm.min_reward)
        return RolloutBatch(results, samples, {**stats, **work}, version)

    def step_results(
        self, agent: Callable[..., Any], tasks: Sequence[tuple[int, Any]], step: int, algorithm: Algorithm
    ) -> list[RolloutResult]:
        """Run each ``(index, task)`` ``algorithm.group_size`` times (``mode="train"``); the results
        in order (what :meth:`step` and the asynchronous producer run)."""
        settings = describe(self.credit, self.air, type(algorithm).__name__)  # read back by agl-lite ui
        specs = [
            RolloutSpec(task, "train", {"step": step, "task_index": idx, "sample": k, KEY: settings})
            for idx, task in tasks
            for k in range(algorithm.group_size)
        ]
        with self.serving():
            return self.run(agent, specs, engine=algorithm.rollout_engine())

    def evaluate(
        self, agent: Callable[..., Any], dataset: Sequence[Any], step: int = 0
    ) -> list[RolloutResult]:
        """Run ``agent`` once per task in ``mode="val"``."""
        specs = [RolloutSpec(task, "val", {"step": step, "task_index": i}) for i, task in enumerate(dataset)]
        with self.serving():
            return self.run(agent, specs, desc="evaluating")


#: the engine counters (``Engine.stats``) a step reports as ``perf/<name>``: what generation computed
ENGINE_WORK = ("prefill_tokens", "decode_tokens", "prefix_cache_hits", "prefill_tokens_saved")


def _engine_counters(engine: Any) -> dict[str, float]:
    """The engine's work counters now (empty for engines that keep none)."""
    stats = engine.stats
    return {k: float(stats[k]) for k in ENGINE_WORK if k in stats}


def _engine_work(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """What the engine computed between two readings, as ``perf/...`` metrics, and the tokens it
    generated per second of the rollouts.

    >>> was = {"prefill_tokens": 10.0, "decode_tokens": 5.0}
    >>> _engine_work(was, {"prefill_tokens": 110.0, "decode_tokens": 45.0}, 2.0)
    {'perf/prefill_tokens': 100.0, 'perf/decode_tokens': 40.0, 'perf/decode_tokens_per_s': 20.0}
    """
    out = {f"perf/{k}": after[k] - before.get(k, 0.0) for k in after if k in before}
    if seconds > 0 and "perf/decode_tokens" in out:
        out["perf/decode_tokens_per_s"] = out["perf/decode_tokens"] / seconds
    return out


class _EngineTurns:
    """Who the source's server serves: the policy (any number of runs at once), or, for one run at
    a time, another engine (``SFT(teacher=...)`` with remote runners, whose agents call that server)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._policy_runs = 0
        self._other = False

    @contextlib.contextmanager
    def policy(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._other)
            self._policy_runs += 1
        try:
            yield
        finally:
            with self._cond:
                self._policy_runs -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def serve(self, server: Any, engine: Any, policy: Any) -> Iterator[None]:
        if server is None or getattr(server, "engine", None) is not policy:
            raise RuntimeError(
                f"another engine cannot play the policy here: the rollout source {server!r} does not "
                "serve the trainer's engine as `server.engine`; run these rollouts in the trainer "
                "(Trainer(runners=None)) or with agl.RemoteRunners"
            )
        with self._cond:
            self._cond.wait_for(lambda: not self._other and self._policy_runs == 0)
            self._other = True
            server.engine = engine  # every route reads server.engine per request
        try:
            yield
        finally:
            with self._cond:
                server.engine = policy
                self._other = False
                self._cond.notify_all()
