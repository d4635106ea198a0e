"""``agl.APO``: the GEPA run driver and its adapter over the trainer's own rollouts.

GEPA (reflective prompt evolution with Pareto selection, the ``gepa`` package) proposes candidate
prompts; every evaluation of a candidate is a real rollout of the user's agent run by the trainer's
rollout source (threads of this process, remote runners or Ray), traced into the store like any
rollout, with the candidate's texts in ``metadata["prompts"]`` and ``metadata["apo"]`` naming the
run, candidate, parent, split and task. The reflection model reads, per component, a dataset built
from those spans (:mod:`.reflective`).

Resume without pickles: GEPA is re-run from its seed with the same seed; evaluations already in the
store (same run, candidate and task) are taken from there instead of being run again, and the
reflection model's answers from ``output_dir/apo/<run>/reflection.jsonl``, so the run replays to
where it stopped and goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..air import AIRRule
from ..prompts import component_key, load_prompts, save_prompts, split_key
from ..rl.rollouts import RolloutResult, RolloutSpec
from ..store.base import Store
from ..store.recovery import INTERRUPTED, recover_interrupted
from .records import Recorder, RunDir, candidate_id
from .reflection import ReflectionLM
from .reflective import prompt_reads, rollout_record

if TYPE_CHECKING:
    from gepa.core.result import GEPAResult

__all__ = ["APO", "candidate_id"]

logger = logging.getLogger(__name__)

Collect = Callable[[list[RolloutSpec]], list[RolloutResult]]


@dataclass(frozen=True)
class _Item:
    """One task as GEPA sees it: which split, its index there, the task itself."""

    split: str
    index: int
    task: Any


@dataclass
class _Done:
    rollout_id: str
    score: float
    status: str
    error: str | None
    reward: float | None


class _Log:
    """GEPA's logger, to ``logging`` (its proposals and decisions at INFO)."""

    def log(self, message: str) -> None:
        logger.info("%s", message)


class APO:
    """Optimise the prompts an agent reads (``agl.prompt``) with GEPA, from real traced rollouts.

    Args:
        reflection: the model that reads the traces and proposes new prompts: ``"policy"`` (the
            trainer's own PolicyServer), an ``agl.LLM`` or a mapping with ``base_url``, ``model`` and
            ``api_key`` of any OpenAI-compatible endpoint, or a callable ``prompt -> text``.
        budget: evaluations (rollouts) GEPA may spend: its ``max_metric_calls``. The seed candidate's
            first evaluation on the validation set counts; one probe rollout finding the prompts'
            defaults (when ``components`` gives none) does not. GEPA checks it between iterations:
            the last one may go past it by ``2 * minibatch_size`` plus the validation set's size.
        components: what to optimise: component keys (``"writer/system"`` for
            ``agl.prompt("system", agent="writer")``, ``"system"`` without an agent), or a mapping
            key -> starting text. ``None``: every prompt the agent reads. Others keep their text.
        seed: GEPA's seed (minibatches, Pareto sampling).
        minibatch_size: tasks per reflection minibatch.
        candidate_selection: ``"pareto"`` (default), ``"current_best"``, ``"epsilon_greedy"`` or
            ``"top_k_pareto"``.
        module_selector: ``"round_robin"`` (one component per iteration) or ``"all"``.
        use_merge: also try GEPA's merges of two candidates.
        perfect_score: the score at which a minibatch needs no improvement (with ``skip_perfect_score``).
        reflection_prompt_template: GEPA's reflection prompt (``<curr_param>`` and ``<side_info>``).
        reflection_options: keyword arguments of the reflection endpoint's client
            (:class:`~agentlightning_lite.apo.ReflectionLM`): ``temperature``, ``max_tokens``
            (default 4096), ``timeout``, ``retries``.

    The best prompts go to ``output_dir/prompts.json`` (rewritten whenever the best improves, so a
    killed run leaves its best so far); the trainer uses them from then on (``trainer.evaluate``,
    and RL after ``trainer.use_algorithm(agl.GRPO(...))``), and a later run loads them with
    ``agl.Trainer(prompts="runs/apo/prompts.json")`` or :meth:`APO.load`. Each candidate (its id,
    GEPA index, parent, texts, validation score and per-task scores) is a row of
    ``output_dir/apo/<run>/candidates.jsonl`` and of ``metrics.jsonl`` (``apo/*`` keys).

    >>> import agentlightning_lite as agl
    >>> def agent(task, llm):
    ...     system = llm.prompt("system", default="You are a helpful assistant.")
    ...     reply = llm.openai_client().chat.completions.create(model=llm.model, messages=[
    ...         {"role": "system", "content": system}, {"role": "user", "content": task["question"]}])
    ...     return float(task["answer"] in (reply.choices[0].message.content or ""))
    >>> apo = agl.APO(reflection=agl.LLM(base_url="https://api.openai.com/v1", model="gpt-4.1-mini",
    ...                                  api_key="sk-..."), budget=60)
    >>> trainer = agl.Trainer(model="smollm2-135m", algorithm=apo, output_dir="runs/apo")  # doctest: +SKIP
    >>> trainer.fit(agent, train_tasks, val_dataset=val_tasks)  # doctest: +SKIP
    {'apo/best_val_score': 0.62, 'apo/seed_val_score': 0.31, ...}
    """

    def __init__(
        self,
        reflection: Any = "policy",
        budget: int = 100,
        components: Sequence[str] | Mapping[str, str] | None = None,
        seed: int = 0,
        minibatch_size: int = 3,
        candidate_selection: str = "pareto",
        module_selector: str = "round_robin",
        use_merge: bool = False,
        perfect_score: float = 1.0,
        skip_perfect_score: bool = True,
        reflection_prompt_template: str | None = None,
        reflection_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ValueError(f"budget must be a positive number of evaluations, got {budget!r}")
        if minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1, got {minibatch_size}")
        if candidate_selection not in ("pareto", "current_best", "epsilon_greedy", "top_k_pareto"):
            raise ValueError(
                "candidate_selection must be 'pareto', 'current_best', 'epsilon_greedy' or 'top_k_pareto', "
                f"got {candidate_selection!r}"
            )
        if module_selector not in ("round_robin", "all"):
            raise ValueError(f"module_selector must be 'round_robin' or 'all', got {module_selector!r}")
        if isinstance(components, str):
            components = [components]
        if components is not None:
            for key in components:
                agent, name = split_key(key)
                component_key(name, agent)
        self.reflection = reflection
        self.budget = budget
        self.components = components
        self.seed = seed
        self.minibatch_size = minibatch_size
        self.candidate_selection = candidate_selection
        self.module_selector = module_selector
        self.use_merge = use_merge
        self.perfect_score = perfect_score
        self.skip_perfect_score = skip_perfect_score
        self.reflection_prompt_template = reflection_prompt_template
        self.reflection_options = dict(reflection_options or {})
        self.group_size = 1  # one rollout per task and candidate
        self.result: dict[str, Any] | None = None  #: what the last run came to

    def __repr__(self) -> str:
        return f"APO(budget={self.budget}, components={self.components!r}, seed={self.seed})"

    # -- what the training step asks (see agentlightning_lite.rl.algorithm) ---------------------
    #: every rollout is scored; none is left out of the candidates' evaluation
    min_reward: float | None = None

    @property
    def updates_weights(self) -> bool:
        """``False``: APO works on the rollout side only (the prompts), never on the weights."""
        return False

    def rollout_engine(self) -> Any | None:
        return None

    @staticmethod
    def load(path: str | Any) -> dict[str, str]:
        """The prompts a run wrote (``output_dir/prompts.json``, or the directory holding it).

        >>> agl.APO.load("runs/apo")  # doctest: +SKIP
        {'writer/system': 'Answer with the number only.'}
        """
        return load_prompts(path)

    # -- with a trainer ---------------------------------------------------------------------
    def run(
        self,
        trainer: Any,
        agent: Callable[..., Any],
        train_dataset: Sequence[Any],
        val_dataset: Sequence[Any] | None = None,
        resume: bool = False,
    ) -> dict[str, Any]:
        """Optimise with ``trainer``'s rollout source, store, metrics and output directory; the
        best prompts become ``trainer.prompts``. What ``trainer.fit`` runs when this is its algorithm."""
        rollouts = trainer.rollouts  # the trainer's rollout session (serving, rollout source, prompts)
        with rollouts.serving():
            policy_llm = None
            if self.reflection == "policy":
                server = rollouts.server
                policy_llm = server.llm() if server is not None else None
            failed = trainer.rollout_config.failed_reward
            result = self.optimize(
                agent,
                train_dataset,
                val_dataset,
                collect=lambda specs: rollouts.run(agent, specs),
                store=trainer.store,
                output_dir=trainer.output_dir,
                log=lambda row: trainer.metrics.log(trainer.step, row),
                air=trainer.air,
                failed_score=0.0 if failed == "drop" else float(failed),
                fixed=dict(rollouts.prompts),
                policy_llm=policy_llm,
                resume=resume,
            )
        trainer.prompts = dict(result["prompts"])
        return result

    # -- the optimisation ---------------------------------------------------------------------
    def optimize(
        self,
        agent: Any,
        train_dataset: Sequence[Any],
        val_dataset: Sequence[Any] | None,
        *,
        collect: Collect,
        store: Store,
        output_dir: str | Path,
        log: Callable[[dict[str, Any]], None] | None = None,
        air: Sequence[AIRRule] | None = None,
        failed_score: float = 0.0,
        fixed: Mapping[str, str] | None = None,
        policy_llm: Any = None,
        resume: bool = False,
    ) -> dict[str, Any]:
        """Run GEPA with ``collect(specs) -> results`` running the rollouts; returns the summary
        (``prompts``: every prompt, the optimised ones at their best; scores; counts)."""
        try:
            import gepa
        except ImportError:
            raise ImportError(
                "agl.APO needs the gepa package: pip install 'agentlightning-lite[apo]'"
            ) from None
        if len(train_dataset) == 0:
            raise ValueError("train_dataset is empty")
        out = Path(output_dir)
        run = RunDir.open(out / "apo", resume)
        if resume:  # evaluations a killed process left running are run again
            recover_interrupted(store)
        fixed = dict(fixed or {})
        reflection = self._reflection_lm(policy_llm, run.path / "reflection.jsonl")
        train = [_Item("train", i, t) for i, t in enumerate(train_dataset)]
        val = [_Item("val", i, t) for i, t in enumerate(val_dataset)] if val_dataset else None
        adapter = GEPAAdapter(self, run.run_id, collect, store, air, failed_score, fixed)
        adapter.load_cache()
        seed = self._seed_candidate(adapter, train[0], fixed)
        run.save_state({"components": sorted(seed), "seed_candidate": seed})
        recorder = Recorder(self, run, adapter, seed, log, out / "prompts.json", fixed, len(val or train))
        kwargs: dict[str, Any] = {}
        if self.reflection_prompt_template is not None:
            kwargs["reflection_prompt_template"] = self.reflection_prompt_template
        t0 = time.perf_counter()
        try:
            result: GEPAResult[Any, Any] = gepa.optimize(
                seed_candidate=seed,
                trainset=train,
                valset=val,
                adapter=adapter,  # type: ignore[arg-type]  # duck-typed: gepa's protocol is generic over its types
                reflection_lm=reflection,
                candidate_selection_strategy=self.candidate_selection,  # type: ignore[arg-type]
                skip_perfect_score=self.skip_perfect_score,
                reflection_minibatch_size=self.minibatch_size,
                perfect_score=self.perfect_score,
                module_selector=self.module_selector,
                use_merge=self.use_merge,
                max_metric_calls=self.budget,
                logger=_Log(),
                callbacks=[recorder],  # type: ignore[list-item]  # implements the GEPACallback hooks it needs
                track_best_outputs=False,
                display_progress_bar=False,
                seed=self.seed,
                raise_on_exception=True,
                **kwargs,
            )
        finally:
            recorder.close()
        best = dict(result.best_candidate)  # type: ignore[arg-type]
        best_idx = result.best_idx
        prompts = {**fixed, **best}
        scores = result.val_aggregate_scores
        summary = {
            "apo/best_val_score": float(scores[best_idx]),
            "apo/seed_val_score": float(scores[0]),
            "apo/candidates": float(len(result.candidates)),
            "apo/metric_calls": float(result.total_metric_calls or 0),
            "apo/rollouts_run": float(adapter.rollouts_run),
            "apo/reflection_calls": float(getattr(reflection, "calls", 0)),
            "apo/time_s": time.perf_counter() - t0,
            "apo/best_candidate": candidate_id(best),
            "prompts": prompts,
        }
        save_prompts(
            out / "prompts.json",
            prompts,
            candidate=candidate_id(best),
            val_score=summary["apo/best_val_score"],
            seed_val_score=summary["apo/seed_val_score"],
            run=run.run_id,
        )
        if log is not None:
            log({k: v for k, v in summary.items() if k != "prompts"})
        run.save_state({"finished": True, "best": best, "best_val_score": summary["apo/best_val_score"]})
        self.result = summary
        return summary

    def _reflection_lm(self, policy_llm: Any, cache: Path) -> Any:
        r = self.reflection
        if r == "policy":
            if policy_llm is None:
                raise ValueError(
                    "reflection='policy' needs the trainer's PolicyServer (run APO through a Trainer)"
                )
            r = policy_llm
        if isinstance(r, str):
            raise ValueError(
                "reflection must be 'policy', an agl.LLM, a mapping with base_url/model/api_key or a "
                f"callable, got {r!r}"
            )
        if isinstance(r, Mapping):
            return ReflectionLM(
                r["base_url"], r["model"], r.get("api_key"), cache=cache, **self.reflection_options
            )
        if hasattr(r, "base_url") and hasattr(r, "model"):
            api_key = getattr(r, "api_key", None)
            return ReflectionLM(r.base_url, r.model, api_key, cache=cache, **self.reflection_options)
        if callable(r):
            return r
        raise TypeError(
            f"reflection must be 'policy', an agl.LLM, a mapping or a callable, got {type(r).__name__}"
        )

    def _seed_candidate(self, adapter: GEPAAdapter, first: _Item, fixed: Mapping[str, str]) -> dict[str, str]:
        """The starting texts: given ones, else the fixed prompts, else the defaults the agent declares
        (found by one probe rollout on the first training task)."""
        wanted = self.components
        given = dict(wanted) if isinstance(wanted, Mapping) else {}
        keys = list(wanted) if wanted is not None else None
        missing = [k for k in (keys or []) if k not in given and k not in fixed]
        defaults: dict[str, str | None] = {}
        if keys is None or missing:
            defaults = adapter.probe(first)
        if keys is None:
            keys = sorted(defaults)
            if not keys:
                raise ValueError(
                    "the agent read no prompt in a probe rollout: read one with agl.prompt(name, "
                    "default=...) or llm.prompt(name, default=...), or name the components with "
                    "APO(components=...)"
                )
        seed: dict[str, str] = {}
        for k in keys:
            text = given.get(k, fixed.get(k, defaults.get(k)))
            if text is None:
                seen = ", ".join(sorted(defaults)) or "none"
                raise ValueError(
                    f"no starting text for component {k!r}: the agent did not read it with a default in a "
                    f"probe rollout (it read: {seen}); give it as APO(components={{{k!r}: '...'}})"
                )
            seed[k] = text
        return seed


class GEPAAdapter:
    """GEPA's adapter: ``evaluate`` runs rollouts, ``make_reflective_dataset`` reads their spans."""

    propose_new_texts = None

    def __init__(
        self,
        apo: APO,
        run_id: str,
        collect: Collect,
        store: Store,
        air: Sequence[AIRRule] | None,
        failed_score: float,
        fixed: Mapping[str, str],
    ) -> None:
        self.apo = apo
        self.run_id = run_id
        self.collect = collect
        self.store = store
        self.air = air
        self.failed_score = failed_score
        self.fixed = dict(fixed)
        self.cache: dict[tuple[str, str, int], _Done] = {}
        self.parents: dict[str, str] = {}  # candidate id -> its parent's
        self.rollouts_run = 0  # rollouts this process ran (not taken from the store)
        self.on_rollouts: Callable[[int], None] | None = None

    def load_cache(self) -> None:
        """Take the finished evaluations of this run from the store (a resumed run)."""
        for ro in self.store.rollouts():
            meta = ro.metadata.get("apo") if isinstance(ro.metadata, dict) else None
            if not isinstance(meta, dict) or meta.get("run") != self.run_id or ro.status == "running":
                continue
            if ro.status != "succeeded" and (ro.error or "").startswith(INTERRUPTED):
                continue
            key = (str(meta.get("candidate")), str(meta.get("split")), int(meta.get("task_index", -1)))
            self.cache[key] = self._done(ro.rollout_id, ro.status, ro.reward, ro.error)
        if self.cache:
            logger.info(
                "APO run %s: %d finished evaluations found in the store", self.run_id, len(self.cache)
            )

    def _done(self, rid: str, status: str, reward: float | None, error: str | None) -> _Done:
        if status == "succeeded":
            score = float(reward) if reward is not None else 0.0
        else:
            score = self.failed_score
        return _Done(rid, score, status, error, reward)

    def _run(self, items: Sequence[_Item], cid: str, prompts: Mapping[str, str]) -> list[_Done]:
        out: list[_Done | None] = [self.cache.get((cid, it.split, it.index)) for it in items]
        todo = [j for j, d in enumerate(out) if d is None]
        if todo:
            specs = [
                RolloutSpec(
                    items[j].task,
                    "val" if items[j].split == "val" else "train",
                    {
                        "prompts": {**self.fixed, **prompts},
                        "apo": {
                            "run": self.run_id,
                            "candidate": cid,
                            "parent": self.parents.get(cid),
                            "split": items[j].split,
                            "task_index": items[j].index,
                        },
                    },
                )
                for j in todo
            ]
            results = self.collect(specs)
            if len(results) != len(specs):
                raise RuntimeError(
                    f"the rollout source returned {len(results)} results for {len(specs)} rollouts"
                )
            self.rollouts_run += len(results)
            for j, res in zip(todo, results, strict=True):
                done = self._done(res.rollout_id, res.status, res.reward, res.error)
                if res.status == "succeeded" or not (res.error or "").startswith(INTERRUPTED):
                    self.cache[(cid, items[j].split, items[j].index)] = done
                out[j] = done
        return [d for d in out if d is not None]

    def probe(self, item: _Item) -> dict[str, str | None]:
        """Run the agent once with no candidate; the prompts it read and their defaults."""
        (done,) = self._run([item], "probe", {})
        return prompt_reads(self.store.spans(done.rollout_id))

    # -- GEPA's adapter protocol ----------------------------------------------------------------
    def evaluate(self, batch: list[_Item], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        from gepa import EvaluationBatch

        cid = candidate_id(candidate)
        done = self._run(batch, cid, candidate)
        outputs = [{"rollout_id": d.rollout_id, "reward": d.reward, "status": d.status} for d in done]
        trajectories = None
        if capture_traces:
            trajectories = [{"item": it, "done": d} for it, d in zip(batch, done, strict=True)]
        return EvaluationBatch(outputs=outputs, scores=[d.score for d in done], trajectories=trajectories)

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]
    ) -> dict[str, list[dict[str, Any]]]:
        dataset: dict[str, list[dict[str, Any]]] = {c: [] for c in components_to_update}
        for traj in eval_batch.trajectories or ():
            item, done = traj["item"], traj["done"]
            rollout = self.store.get_rollout(done.rollout_id)
            spans = self.store.spans(done.rollout_id)
            for comp in components_to_update:
                dataset[comp].append(
                    rollout_record(
                        comp, rollout, spans, item.task, done.score, done.status, done.error, self.air
                    )
                )
        return dataset
