"""The trainer's knobs, grouped by the job they tune (the math's own knobs are in the algorithm configs).

``agl.Trainer`` takes each group as one object (``rollout_config=RolloutConfig(timeout=60)``); each
setting has that one spelling and each default is written here once. A keyword of the old one-by-one
style (``Trainer(rollout_timeout=60)``) raises a ``TypeError`` that names its new place (:data:`MOVED`).

>>> RolloutConfig(timeout=60).failed_reward
'drop'
>>> SampleConfig(transitions="episode")
Traceback (most recent call last):
...
ValueError: transitions must be 'call' or 'trajectory', got 'episode'
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

__all__ = [
    "AUTO_FLOOR_S",
    "AUTO_MARGIN",
    "MOVED",
    "CheckpointConfig",
    "LoggingConfig",
    "RolloutConfig",
    "SampleConfig",
    "UpdateConfig",
    "reject_moved_keywords",
]

P = ParamSpec("P")
R = TypeVar("R")

#: ``RolloutConfig(timeout="auto")``: the timeout of an agent that does not say how many tokens its
#: rollouts generate, and the least ``"auto"`` gives (an agent does more than generate: tools, a judge)
AUTO_FLOOR_S = 300.0
#: ``RolloutConfig(timeout="auto")``: this many times the estimated time of a rollout that generates all
#: its tokens (the estimate is timed once; the machine may be busier later, an update may run meanwhile)
AUTO_MARGIN = 3.0


@dataclass
class RolloutConfig:
    """How a step's rollouts run and what their outcomes count for.

    Args:
        concurrency: rollouts run at once (threads); default: a whole step's rollouts
            (``batch_size * group_size``), so that the engine decodes a step's first turns as
            one batch (the trainer announces them with ``engine.expect(n)``).
        timeout: seconds a rollout may take before it is marked
            ``timeout``; its engine requests are then cancelled and an ``async`` agent is cancelled. A
            sync agent's thread cannot be stopped: it is left running as a daemon thread (see
            ``rollouts.hung_threads``). ``"auto"`` (the default): sized to the engine before the
            first step when the agent says how many tokens a rollout generates at most (its
            ``max_rollout_tokens``; ``agl.envs.ReasoningGym``'s agent does): :data:`AUTO_MARGIN`
            times the estimated time of a rollout that uses them all, at least
            :data:`AUTO_FLOOR_S`; :data:`AUTO_FLOOR_S` when it does not (:mod:`.preflight`).
            ``None``: no limit. :attr:`timeout_s` is the number in effect.
        failed_reward: what a failed or timed-out rollout counts for: ``"drop"`` (left out of the
            update) or a number (its calls are trained with that reward).
        success_threshold: a rollout succeeds when its reward is at least this.
        max_failed_steps: ``fit`` stops with a ``RuntimeError`` carrying the first rollout's error
            once this many steps in a row had no rollout that succeeded (every one failed or timed
            out): an agent that cannot run (a missing package, a wrong URL) is reported at once
            instead of training on nothing. ``None`` never stops. A step where some rollouts
            succeed resets the count.
        async_rollouts: ``fit`` runs the rollouts of the next steps in a background thread while the
            learner updates, instead of alternating (docs/training.md, "Asynchronous training"). A
            rollout is trained only when its oldest call was made by weights at most
            ``SampleConfig.max_staleness`` versions older than the policy being trained (``None``
            means 1 here); a GRPO group is kept or dropped whole (``async/dropped_stale``).
        handover: how new weights reach the engine while rollouts run (``async_rollouts`` only):
            ``"finish"`` (requests in flight finish on the weights they started with; new requests
            get the new ones) or ``"drain"`` (new requests wait and the ones in flight finish before
            the switch, so no request spans two versions).
    """

    concurrency: int | None = None
    timeout: float | str | None = "auto"
    failed_reward: str | float = "drop"
    success_threshold: float = 1.0
    max_failed_steps: int | None = 1
    async_rollouts: bool = False
    handover: str = "finish"
    #: what ``timeout="auto"`` came to for the rollouts being run (set by the trainer before them)
    auto_timeout: float | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        t = self.timeout
        if t != "auto" and t is not None and (isinstance(t, (str, bool)) or not t > 0):
            raise ValueError(f"timeout must be 'auto', a number of seconds > 0 or None, got {t!r}")
        if self.handover not in ("finish", "drain"):
            raise ValueError(f"handover must be 'finish' or 'drain', got {self.handover!r}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.failed_reward != "drop" and not isinstance(self.failed_reward, (int, float)):
            raise ValueError(f"failed_reward must be 'drop' or a number, got {self.failed_reward!r}")
        limit = self.max_failed_steps
        if limit is not None and (type(limit) is not int or limit < 1):  # bool is no count
            raise ValueError(f"max_failed_steps must be an integer >= 1 or None, got {limit!r}")

    @property
    def timeout_s(self) -> float | None:
        """The timeout in effect, in seconds (``None``: no limit): ``timeout`` when it is a number or
        ``None``; for ``"auto"``, what it was sized to, else :data:`AUTO_FLOOR_S`.

        >>> RolloutConfig().timeout_s, RolloutConfig(timeout=60).timeout_s
        (300.0, 60)
        """
        if self.timeout != "auto":
            return self.timeout  # type: ignore[return-value]  # a number or None (checked above)
        return self.auto_timeout if self.auto_timeout is not None else AUTO_FLOOR_S

    def or_concurrency(self, default: int) -> RolloutConfig:
        """A copy whose ``concurrency`` is ``default`` where this one leaves it unset."""
        return dataclasses.replace(self, concurrency=self.concurrency or default)


@dataclass
class SampleConfig:
    """Which recorded calls become training samples, and how.

    Args:
        max_seq_len: samples with a longer prompt + response are skipped (counted in the metrics).
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
        truncated: what a call whose reply was cut at ``max_tokens`` (``finish_reason="length"``)
            trains as (counted as ``samples/truncated`` in the step's metrics): ``"keep"`` (default:
            like any other call; the cut reply is what the policy did and the episode's reward
            already reflects it), ``"mask"`` (its reward still counts in its GRPO group's baseline,
            its tokens get no loss) or ``"penalty"`` (its reward is ``truncated_reward``).
            See docs/training.md, "Replies cut at max_tokens".
        truncated_reward: the reward of a cut call under ``truncated="penalty"``.

    >>> SampleConfig(truncated="penalty", truncated_reward=-1.0).truncated_reward
    -1.0
    """

    max_seq_len: int = 2048
    max_staleness: int | None = None
    transitions: str = "call"
    truncated: str = "keep"
    truncated_reward: float = 0.0

    def __post_init__(self) -> None:
        if self.transitions not in ("call", "trajectory"):
            raise ValueError(f"transitions must be 'call' or 'trajectory', got {self.transitions!r}")
        if self.truncated not in ("keep", "mask", "penalty"):
            raise ValueError(f"truncated must be 'keep', 'mask' or 'penalty', got {self.truncated!r}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {self.max_staleness}")


@dataclass
class UpdateConfig:
    """How the update computes, beside the algorithm's own settings.

    Args:
        old_logprobs: importance-ratio denominator: ``"engine"`` (the logprobs the engine
            sampled with), ``"recompute"`` (a no-grad forward pass of the training model), or
            ``"auto"``: every micro-batch is recomputed and each call keeps the engine's logprobs
            when they agree with the recomputation within ``logprob_tolerance`` (mean absolute
            difference over its tokens), else the recomputed ones; the share of calls that fell back
            is logged (``train/old_logprobs_fallback``). The mismatch is logged.
        correction: off-policy correction of the policy-gradient loss for the gap between the
            engine and the trainer: ``None`` (default), :class:`~.correction.TIS`,
            :class:`~.correction.MaskedIS`, or a tuple of them (their weights multiply). With a
            correction the PPO ratio is taken against the trainer's recomputed logprobs (whatever
            ``old_logprobs`` says) and each token's loss is weighted by the correction of
            ``pi_old / pi_engine``; see docs/training.md, "Off-policy correction".
        gradient_checkpointing: recompute each decoder layer's activations in the backward pass
            instead of keeping them (transformers' gradient checkpointing, non-reentrant, so it
            works with peft's frozen base): activation memory of the update falls from one set per
            layer to about one layer's, for roughly one more forward pass of time (1.32x the update
            measured on the embedded model). ``None`` (the default): on when memory is short, that is
            when the estimated activations of a micro-batch of the algorithm's ``micro_batch_tokens``
            pass ``memory_budget`` of the memory available when the trainer starts (and the model
            supports it); ``True`` requires it; ``False`` never. Generation is unaffected (the engine
            runs the model in eval mode, where checkpointing is off). The numbers are the same either way.
        host_mmap_threshold_mib: on Linux with glibc, host (CPU) memory blocks of at least this many
            MiB get their own mapping, returned to the system as soon as they are freed (glibc's
            ``M_MMAP_THRESHOLD``, set for the whole process when the trainer starts). glibc's own
            default raises that threshold to 32 MiB after the first large free, and the update's
            freed activations then stay in its heap, fragmented: a CPU update peaked at 3.5 GiB with
            0.1 GiB of saved activations (``benchmarks/perf/memory_results.md``). The cost is more
            page faults (1.26x the update's time measured). ``"auto"`` (the default): 1.0 MiB when
            memory is short (as for ``gradient_checkpointing``), else glibc's behaviour; ``None`` keeps
            glibc's behaviour; an explicit ``MALLOC_MMAP_THRESHOLD_`` in the environment wins.
        memory_budget: the share (0, 1] of the memory available at start that the update's
            estimated activations may take before the memory savers above turn on (``"auto"`` /
            ``None`` only); the decision and its figures are logged once.
        share_prefix: run a prefix shared by several samples of a micro-batch (a GRPO group's
            prompt, the earlier turns of a conversation) through the model once, under a block
            mask (:mod:`.packing`); the logprobs and gradients are those of one sequence per sample.
            ``False``: one padded sequence per sample.

    >>> UpdateConfig(gradient_checkpointing=False, host_mmap_threshold_mib=None).old_logprobs
    'auto'
    """

    old_logprobs: str = "auto"
    logprob_tolerance: float = 1e-3
    gradient_checkpointing: bool | None = None
    host_mmap_threshold_mib: float | str | None = "auto"
    correction: Any = None
    memory_budget: float = 0.5
    share_prefix: bool = True

    def __post_init__(self) -> None:
        from .correction import parse_correction

        self.correction = parse_correction(self.correction)
        if self.old_logprobs not in ("auto", "engine", "recompute"):
            raise ValueError("old_logprobs must be 'auto', 'engine' or 'recompute'")
        mmap = self.host_mmap_threshold_mib
        if mmap is not None and mmap != "auto" and (isinstance(mmap, str) or not 0 < mmap <= 32):
            raise ValueError(f"host_mmap_threshold_mib must be 'auto', in (0, 32] MiB or None, got {mmap!r}")
        if not 0 < self.memory_budget <= 1:
            raise ValueError(f"memory_budget must be in (0, 1], got {self.memory_budget}")


@dataclass
class CheckpointConfig:
    """``save_every``: steps between checkpoints (0: never); ``keep``: how many to keep (``None``: all)."""

    save_every: int = 0
    keep: int | None = 3


@dataclass
class LoggingConfig:
    """``loggers``: ``"auto"``, or a list of ``"tensorboard"``, ``"wandb"``, ``"mlflow"``;
    ``eval_every``: steps between evaluations on ``fit``'s ``val_dataset`` (0: only once, at the end)."""

    loggers: str | list[str] = "auto"
    eval_every: int = 0


#: a keyword ``Trainer`` took one by one before the groups -> (group parameter, its field); only for
#: the ``TypeError`` that names the new place
MOVED: dict[str, tuple[str, str]] = {
    "concurrency": ("rollout_config", "concurrency"),
    "rollout_timeout": ("rollout_config", "timeout"),
    "failed_reward": ("rollout_config", "failed_reward"),
    "success_threshold": ("rollout_config", "success_threshold"),
    "max_failed_steps": ("rollout_config", "max_failed_steps"),
    "max_seq_len": ("sample_config", "max_seq_len"),
    "max_staleness": ("sample_config", "max_staleness"),
    "transitions": ("sample_config", "transitions"),
    "old_logprobs": ("update_config", "old_logprobs"),
    "logprob_tolerance": ("update_config", "logprob_tolerance"),
    "gradient_checkpointing": ("update_config", "gradient_checkpointing"),
    "save_every": ("checkpoint_config", "save_every"),
    "keep_checkpoints": ("checkpoint_config", "keep"),
    "loggers": ("logging_config", "loggers"),
    "eval_every": ("logging_config", "eval_every"),
}

_CLASSES: dict[str, type] = {
    "rollout_config": RolloutConfig,
    "sample_config": SampleConfig,
    "update_config": UpdateConfig,
    "checkpoint_config": CheckpointConfig,
    "logging_config": LoggingConfig,
}


def moved_message(keywords: Mapping[str, Any] | list[str]) -> str:
    """Where each old keyword went.

    >>> moved_message(["rollout_timeout"])
    'Trainer(rollout_timeout=...) moved: use rollout_config=RolloutConfig(timeout=...)'
    """
    return "; ".join(
        f"Trainer({kw}=...) moved: use {MOVED[kw][0]}={_CLASSES[MOVED[kw][0]].__name__}({MOVED[kw][1]}=...)"
        for kw in sorted(k for k in keywords if k in MOVED)
    )


def reject_moved_keywords(init: Callable[P, R]) -> Callable[P, R]:
    """Wrap ``Trainer.__init__``: an old one-by-one keyword raises a ``TypeError`` naming its group
    (:func:`moved_message`) instead of Python's bare "unexpected keyword argument"."""

    @functools.wraps(init)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        if any(k in MOVED for k in kwargs):
            raise TypeError(moved_message(list(kwargs)))
        return init(*args, **kwargs)

    return checked


def resolve(groups: Mapping[str, Any]) -> dict[str, Any]:
    """One config object per group: the one given (``groups["rollout_config"]``...), else the group's
    defaults; a TypeError for anything else.

    >>> resolve({})["rollout_config"].timeout
    'auto'
    """
    out: dict[str, Any] = {}
    for group, cls in _CLASSES.items():
        given = groups.get(group)
        if given is None:
            out[group] = cls()
        elif not isinstance(given, cls):
            raise TypeError(f"{group} must be agl.rl.config.{cls.__name__}(...), got {type(given).__name__}")
        else:
            out[group] = given
    return out
