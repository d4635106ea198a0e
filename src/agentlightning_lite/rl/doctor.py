"""Why a run's reward is flat: findings read from the metrics a run recorded (``metrics.jsonl``).

:func:`diagnose` reads a list of step metrics (one mapping per step, as ``Trainer.fit`` logs them) and
returns :class:`Finding` s: a code, a severity (``"warning"``, or ``"info"`` for what is only worth
knowing), the figure that triggered it, the steps where it showed and what to try. A healthy run gives
no warning. :func:`~.doctor_report.diagnose_run` reads a run's directory (and, when ``runs.db`` is next
to it, the errors of its failed rollouts); ``agl-lite doctor RUN_DIR`` prints the same, and
``Trainer.fit`` logs each warning once, at the step it first shows, and a summary at its end
(:class:`Watch`). :data:`ADVICE` holds each code's meaning and what to try.

The codes and the metrics they read:

* ``zero_spread``: ``grpo/zero_std_frac``, the share of groups whose rewards were all equal;
* ``constant_reward``: ``train/reward_mean`` the same at every step (with every group without spread);
* ``cut_replies`` / ``never_stop``: ``samples/truncated`` over ``train/samples`` (calls cut at
  ``max_tokens``; ``never_stop`` when nearly all of them are, at every step);
* ``tools_unparsed``: ``tools/unparsed`` (replies with a tool-call marker that gave no call) against
  ``tools/parsed``;
* ``failed_rollouts`` / ``timeouts``: ``train/failed_rollouts`` and ``train/timeout_rollouts`` over
  ``train/rollouts`` (an agent or reward function that raised fails its rollout);
* ``entropy_collapse``: ``diag/entropy`` at the end far below its start; ``same_replies``:
  ``diag/distinct_responses`` down to ``1/group_size`` (every reply of a group alike);
* ``logprob_mismatch``: ``mismatch/kl_k3`` or ``mismatch/clipped_frac`` high (engine and trainer
  disagree on the sampled tokens' probabilities); ``clip_frac``: ``train/clip_frac`` high;
* ``lr_too_high``: ``train/grad_norm`` spikes, ``train/loss`` jumps, or a loss or norm that is not finite;
* ``reward_fell``: the last steps' ``train/reward_mean`` clearly below the first steps'.

Runs do not record whether an environment extracted an answer from a reply, so that check is not made.
With one adapter per agent, the top-level metrics (the policies' mean loss and grad norm) are read.

>>> rows = [{"step": s, "train/reward_mean": 0.0, "grpo/zero_std_frac": 1.0} for s in range(1, 5)]
>>> [f.code for f in diagnose(rows)]
['zero_spread', 'constant_reward', 'few_steps']
>>> [f.code for f in diagnose([{"step": 1, "train/reward_mean": 0.2, "grpo/zero_std_frac": 0.1}])]
['few_steps']
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["ADVICE", "Finding", "Thresholds", "Watch", "diagnose"]

Severity = Literal["warning", "info"]


@dataclass(frozen=True)
class Finding:
    """One thing a run's metrics show: ``code`` (``"zero_spread"``...), ``severity`` (``"warning"`` or
    ``"info"``), ``message`` (what it means), ``figure`` (the numbers that triggered it), ``steps`` (where
    it showed) and ``advice`` (what to try).

    >>> f = Finding("cut_replies", "warning", "replies cut", "40% of calls", (1, 2), "raise max_tokens")
    >>> f.code, f.steps, f.to_dict()["advice"]
    ('cut_replies', (1, 2), 'raise max_tokens')
    """

    code: str
    severity: Severity
    message: str
    figure: str
    steps: tuple[int, ...]
    advice: str

    def to_dict(self) -> dict[str, Any]:
        """The finding as a JSON-ready dict (``steps`` as a list)."""
        return {**asdict(self), "steps": list(self.steps)}


@dataclass(frozen=True)
class Thresholds:
    """When a figure becomes a finding.

    ``zero_spread``: share of groups without reward spread, for ``run`` steps in a row (a constant
    reward and a high clip fraction need as many steps); ``truncated``:
    share of calls cut at ``max_tokens`` (``never_stop``: at least this share at every step);
    ``unparsed``: share of tool-call attempts that gave no call; ``failed``: share of rollouts that
    failed or timed out; ``entropy_drop``: the end's entropy below this fraction of the start's;
    ``kl_k3``, ``clipped``: engine/trainer mismatch; ``clip_frac``: the PPO ratio's clip fraction;
    ``grad_spike``: a grad norm (or, twice and at least ``loss_floor``, a loss) this many times the
    median of the steps before; ``reward_drop``: a later window this far (absolute) below the first
    ``window`` steps' mean reward, and three times the noise of a window's mean (from the step-to-step
    changes) below it.

    >>> Thresholds(zero_spread=0.75).zero_spread
    0.75
    """

    zero_spread: float = 0.5
    run: int = 3
    truncated: float = 0.2
    never_stop: float = 0.95
    unparsed: float = 0.5
    failed: float = 0.1
    entropy_drop: float = 0.2
    kl_k3: float = 0.01
    clipped: float = 0.1
    clip_frac: float = 0.3
    grad_spike: float = 10.0
    loss_floor: float = 0.5
    reward_drop: float = 0.1
    window: int = 3


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of the rows with a finite number under ``key``."""
    out = []
    for i, r in enumerate(rows):
        v = _num(r.get(key))
        if v is not None:
            out.append((int(r.get("step", i + 1)), v))
    return out


def _ranges(steps: Sequence[int]) -> str:
    """``1-3, 7``: steps as ranges.

    >>> _ranges([1, 2, 3, 7, 9, 10])
    '1-3, 7, 9-10'
    """
    spans: list[list[int]] = []
    for s in sorted(set(steps)):
        if spans and spans[-1][1] == s - 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _longest_run(flags: Sequence[tuple[int, bool]]) -> list[int]:
    """The steps of the longest run of consecutive true flags."""
    best: list[int] = []
    cur: list[int] = []
    for step, flag in flags:
        if not flag:
            cur = []
            continue
        cur.append(step)
        if len(cur) > len(best):
            best = cur
    return list(best)


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


#: what each code means and what to try (docs/training.md, "When the reward does not go up")
ADVICE: dict[str, tuple[str, str]] = {
    "zero_spread": (
        "most groups' rollouts got the same reward: GRPO has nothing to compare, they give no gradient",
        "larger groups (agl.GRPO(group_size=...)) or more tasks per step (agl.Trainer(batch_size=...)), "
        "e.g. twice the run's, a higher sampling temperature, tasks nearer the "
        "model's level (neither all solved nor all failed), or a graded reward (partial credit) over 0/1",
    ),
    "constant_reward": (
        "every rollout got the same reward at every step: nothing to learn from",
        "check the reward function on a few recorded replies (agl-lite show runs.db ID): an answer never "
        "extracted, a str compared with a number, a key that never matches; a failed rollout scores "
        "RolloutConfig(failed_reward=...)",
    ),
    "never_stop": (
        "nearly every reply runs to max_tokens: the model does not stop by itself",
        "check that the chat template ends a reply with the tokenizer's EOS, pass a stop string (stop=[...] "
        "in the agent's request) or a higher max_tokens; SampleConfig(truncated='penalty') gives a cut "
        "reply a low reward, so the policy learns to stop",
    ),
    "cut_replies": (
        "many replies were cut at max_tokens: their answer is often missing",
        "a higher max_tokens in the agent's request, a stop string, SampleConfig(truncated='penalty') (a low "
        "reward for a cut reply) or SampleConfig(truncated='mask') (cut replies out of the loss)",
    ),
    "tools_unparsed": (
        "the model's tool calls are not read: replies with a tool-call marker gave no call",
        "name the model's format: agl-lite train/serve --tool-call-parser NAME (hermes, qwen3_coder, "
        "llama3_json, ...) or PolicyServer(tool_parser=...); read a failing reply with agl-lite show",
    ),
    "failed_rollouts": (
        "rollouts failed: the agent or its reward function raised",
        "read the errors (agl-lite runs runs.db --status failed, agl-lite show runs.db ID) and fix the "
        "agent or the reward function; RolloutConfig(failed_reward=...) says what a failed rollout scores",
    ),
    "timeouts": (
        "rollouts timed out",
        "a longer RolloutConfig(timeout=...), a lower max_tokens, or fewer turns per episode",
    ),
    "entropy_collapse": (
        "the policy's entropy collapsed: it samples nearly the same tokens every time",
        "a lower learning rate (agl.GRPO(lr=...)), a KL penalty (agl.GRPO(kl_coef=0.01)), a higher "
        "sampling temperature, or clip_high above clip (agl.GRPO(clip_high=0.28))",
    ),
    "same_replies": (
        "every rollout of a group gave the same reply",
        "a higher sampling temperature (and no top_p/top_k in the agent's request), a lower learning "
        "rate (agl.GRPO(lr=...)), or a KL penalty (agl.GRPO(kl_coef=0.01))",
    ),
    "logprob_mismatch": (
        "the engine and the trainer disagree on the sampled tokens' probabilities: the update is off-policy",
        "an off-policy correction, UpdateConfig(correction=agl.TIS(cap=2.0)) or agl.MaskedIS(); the same "
        "dtype on the engine and the trainer; SampleConfig(max_staleness=...) with async rollouts",
    ),
    "clip_frac": (
        "many tokens hit the PPO clip: each update moves the policy too far",
        "a lower learning rate (agl.GRPO(lr=...)), fewer epochs or larger mini-batches",
    ),
    "lr_too_high": (
        "the update is unstable: the learning rate is likely too high for LoRA",
        "a lower learning rate (agl.GRPO(lr=1e-5) or ten times lower than now), max_grad_norm=1.0, "
        "or a smaller LoRA alpha (agl.LoRA(alpha=...))",
    ),
    "reward_fell": (
        "the reward went down after training started",
        "a lower learning rate (agl.GRPO(lr=...)), a KL penalty (agl.GRPO(kl_coef=0.01)); read the late "
        "steps' replies for reward hacking (agl-lite show runs.db ID)",
    ),
    "few_steps": (
        "too few training steps for the trend checks",
        "train for more steps before reading the trend",
    ),
}


def _finding(code: str, figure: str, steps: Sequence[int], severity: Severity = "warning") -> Finding:
    message, advice = ADVICE[code]
    return Finding(code, severity, message, figure, tuple(sorted(set(steps))), advice)


def diagnose(metrics: Sequence[Mapping[str, Any]], *, thresholds: Thresholds | None = None) -> list[Finding]:
    """The findings of a run's step metrics (rows as in ``metrics.jsonl``), warnings first.

    A row without a metric is skipped for the checks that read it (validation rows, older runs).

    >>> healthy = [{"step": s, "train/reward_mean": 0.1 * s, "grpo/zero_std_frac": 0.2,
    ...             "samples/truncated": 0.0, "train/samples": 16.0} for s in range(1, 9)]
    >>> diagnose(healthy)
    []
    >>> cut = [{**r, "samples/truncated": 8.0} for r in healthy]
    >>> f = diagnose(cut)[0]
    >>> f.code, f.figure
    ('cut_replies', '50% of calls cut at max_tokens (64 of 128), steps 1-8')
    """
    t = thresholds or Thresholds()
    rows = [r for r in metrics if isinstance(r, Mapping)]
    found: list[Finding] = []
    for check in _CHECKS:
        found += check(rows, t)
    trained = [s for s, _ in _series(rows, "train/reward_mean")]
    if 0 < len(trained) < 2 * t.window:
        found.append(_finding("few_steps", f"{len(trained)} steps, {2 * t.window} needed", trained, "info"))
    return sorted(found, key=lambda f: f.severity != "warning")


Rows = Sequence[Mapping[str, Any]]


def _zero_spread(rows: Rows, t: Thresholds) -> list[Finding]:
    frac = _series(rows, "grpo/zero_std_frac")
    run = _longest_run([(s, v >= t.zero_spread) for s, v in frac])
    if len(run) < t.run:
        return []
    peak = max(v for s, v in frac if s in set(run))
    skipped = [s for s, v in _series(rows, "train/skipped_update") if v == 1.0]
    also = f"; {len(skipped)} steps had no group with spread (no update)" if skipped else ""
    figure = f"up to {_pct(peak)} of groups without reward spread for {len(run)} steps in a row "
    return [_finding("zero_spread", f"{figure}(>= {_pct(t.zero_spread)}), steps {_ranges(run)}{also}", run)]


def _constant_reward(rows: Rows, t: Thresholds) -> list[Finding]:
    rewards = _series(rows, "train/reward_mean")
    if len(rewards) < t.run or max(v for _, v in rewards) - min(v for _, v in rewards) > 1e-9:
        return []
    if any(v < 1.0 for _, v in _series(rows, "grpo/zero_std_frac")):
        return []  # the mean stayed put, but some groups had spread
    figure = f"train/reward_mean = {rewards[0][1]:g} at all {len(rewards)} steps"
    return [_finding("constant_reward", figure, [s for s, _ in rewards])]


def _cut_replies(rows: Rows, t: Thresholds) -> list[Finding]:
    pairs = [
        (int(r.get("step", i + 1)), c, n)
        for i, r in enumerate(rows)
        if (c := _num(r.get("samples/truncated"))) is not None and (n := _num(r.get("train/samples")))
    ]
    cut, total = sum(c for _, c, _ in pairs), sum(n for _, _, n in pairs)
    if not total or cut / total < t.truncated:
        return []
    steps = [s for s, c, n in pairs if c / n >= t.truncated]
    figure = (
        f"{_pct(cut / total)} of calls cut at max_tokens ({cut:.0f} of {total:.0f}), steps {_ranges(steps)}"
    )
    never = all(c / n >= t.never_stop for _, c, n in pairs)
    return [_finding("never_stop" if never else "cut_replies", figure, steps)]


def _tools(rows: Rows, t: Thresholds) -> list[Finding]:
    parsed, unparsed = _series(rows, "tools/parsed"), _series(rows, "tools/unparsed")
    bad, good = sum(v for _, v in unparsed), sum(v for _, v in parsed)
    if not bad or (good and bad / (bad + good) < t.unparsed):
        return []
    steps = [s for s, v in unparsed if v > 0]
    figure = f"{bad:.0f} replies with a tool-call marker gave no call, {good:.0f} calls parsed"
    return [_finding("tools_unparsed", f"{figure}, steps {_ranges(steps)}", steps)]


def _failed(rows: Rows, t: Thresholds) -> list[Finding]:
    out = []
    total = sum(v for _, v in _series(rows, "train/rollouts"))
    for key, code in (("train/failed_rollouts", "failed_rollouts"), ("train/timeout_rollouts", "timeouts")):
        series = _series(rows, key)
        if not (bad := sum(v for _, v in series)):
            continue
        share = bad / total if total else 1.0
        steps = [s for s, v in series if v > 0]
        figure = f"{bad:.0f} of {total:.0f} rollouts ({_pct(share)}), steps {_ranges(steps)}"
        out.append(_finding(code, figure, steps, "warning" if share >= t.failed else "info"))
    return out


def _ends(values: Sequence[tuple[int, float]], window: int) -> tuple[float, float, int]:
    """The mean of the first and of the last ``window`` values (fewer for a short run), and that count."""
    w = max(1, min(window, len(values) // 2))
    return _mean([v for _, v in values[:w]]), _mean([v for _, v in values[-w:]]), w


def _collapse(rows: Rows, t: Thresholds) -> list[Finding]:
    out = []
    entropy = _series(rows, "diag/entropy")
    if len(entropy) >= 2:
        start, end, w = _ends(entropy, t.window)
        if start > 0 and end < t.entropy_drop * start:
            figure = f"diag/entropy {start:.3g} (first {w} steps) -> {end:.3g} (last {w})"
            out.append(_finding("entropy_collapse", figure, [s for s, _ in entropy[-w:]]))
    distinct, tail = _series(rows, "diag/distinct_responses"), []
    sizes = [
        n / g for r in rows if (n := _num(r.get("train/rollouts"))) and (g := _num(r.get("grpo/groups")))
    ]
    if sizes and max(sizes) > 1:
        floor, tail = 1.0 / max(sizes), distinct[-t.window :]
    if len(tail) >= min(t.window, 2) and all(v <= floor + 1e-6 for _, v in tail):
        steps = [s for s, _ in tail]
        figure = f"diag/distinct_responses {tail[-1][1]:.3g} = 1/group_size ({max(sizes):.0f})"
        out.append(_finding("same_replies", f"{figure} at steps {_ranges(steps)}", steps))
    return out


def _mismatch(rows: Rows, t: Thresholds) -> list[Finding]:
    out = []
    kl, clipped = _series(rows, "mismatch/kl_k3"), _series(rows, "mismatch/clipped_frac")
    if high := [s for s, v in kl if v >= t.kl_k3] + [s for s, v in clipped if v >= t.clipped]:
        figure = ", ".join(
            f"{name} up to {max(v for _, v in series):.3g} (>= {limit:g})"
            for name, series, limit in (
                ("mismatch/kl_k3", kl, t.kl_k3),
                ("mismatch/clipped_frac", clipped, t.clipped),
            )
            if series
        )
        out.append(_finding("logprob_mismatch", f"{figure}, steps {_ranges(high)}", high))
    clip = _series(rows, "train/clip_frac")
    steps = [s for s, v in clip if v >= t.clip_frac]
    if steps and len(steps) >= min(t.run, len(clip)):
        figure = f"train/clip_frac up to {max(v for _, v in clip):.3g} (>= {t.clip_frac:g})"
        out.append(_finding("clip_frac", f"{figure}, steps {_ranges(steps)}", steps))
    return out


def _spikes(series: Sequence[tuple[int, float]], factor: float, last: int = 20) -> list[int]:
    """Steps whose value is at least ``factor`` times the median of the (absolute) values of the (up to
    ``last``, at least 3) steps before it."""
    out = []
    for i in range(3, len(series)):
        ref = statistics.median(abs(v) for _, v in series[max(0, i - last) : i])
        if ref > 0 and abs(series[i][1]) >= factor * ref:
            out.append(series[i][0])
    return out


def _learning_rate(rows: Rows, t: Thresholds) -> list[Finding]:
    bad = [
        int(r.get("step", i + 1))
        for i, r in enumerate(rows)
        for k in ("train/loss", "train/grad_norm")
        if isinstance(r.get(k), float) and not math.isfinite(r[k])
    ]
    grad = _spikes(_series(rows, "train/grad_norm"), t.grad_spike)
    losses = dict(_series(rows, "train/loss"))
    loss = [s for s in _spikes(list(losses.items()), t.grad_spike) if abs(losses[s]) >= t.loss_floor]
    loss = loss if len(loss) >= 2 else []  # one loss jump alone is noise; a grad spike is not
    parts = [f"loss or grad norm not finite at steps {_ranges(bad)}"] if bad else []
    parts += [f"grad norm >= {t.grad_spike:g}x its median so far at steps {_ranges(grad)}"] if grad else []
    parts += [f"loss >= {t.grad_spike:g}x its median so far at steps {_ranges(loss)}"] if loss else []
    return [_finding("lr_too_high", "; ".join(parts), bad + grad + loss)] if parts else []


def _reward_fell(rows: Rows, t: Thresholds) -> list[Finding]:
    """The last window of steps (a quarter of the run, at least ``t.window``) against the first: a drop
    of at least ``t.reward_drop`` and three standard errors of the difference of two window means (the
    per-step spread read from successive steps: a step's few tasks make its reward noisy)."""
    rewards = _series(rows, "train/reward_mean")
    w = max(t.window, len(rewards) // 4)
    if len(rewards) < 2 * w:
        return []
    first, last = _mean([v for _, v in rewards[:w]]), _mean([v for _, v in rewards[-w:]])
    sigma = statistics.stdev(b - a for (_, a), (_, b) in itertools.pairwise(rewards)) / math.sqrt(2)
    if first - last < max(t.reward_drop, 3 * sigma * math.sqrt(2 / w)):
        return []
    steps = [s for s, _ in rewards[-w:]]
    figure = f"mean reward {first:.3g} over the first {w} steps, {last:.3g} at steps {_ranges(steps)}"
    return [_finding("reward_fell", figure, steps)]


_CHECKS = (
    _zero_spread,
    _constant_reward,
    _cut_replies,
    _tools,
    _failed,
    _collapse,
    _mismatch,
    _learning_rate,
    _reward_fell,
)


class Watch:
    """The check ``Trainer.fit`` runs after each step: :meth:`step` returns the warnings that show for
    the first time (each code once); :meth:`summary` the lines to log at the end. Each check reads the
    whole run so far: after ``every_step`` steps it runs every ``n // every_step`` steps only (a long run's
    finding shows at most 1% of its steps late; its cost stays a fraction of a step's).

    >>> w = Watch()
    >>> [f.code for s in range(1, 5) for f in w.step({"step": s, "grpo/zero_std_frac": 1.0})]
    ['zero_spread']
    >>> w.summary()[1][0]
    'doctor: 1 finding(s) in 4 steps (agl-lite doctor OUTPUT_DIR):'
    """

    def __init__(self, thresholds: Thresholds | None = None, every_step: int = 100) -> None:
        self.thresholds, self.every_step = thresholds, every_step
        self.rows: list[Mapping[str, Any]] = []
        self.seen: set[str] = set()

    def step(self, row: Mapping[str, Any]) -> list[Finding]:
        """Add a step's metrics; the warnings that show for the first time now."""
        self.rows.append(row)
        n = len(self.rows)
        if n > self.every_step and n % (n // self.every_step):
            return []
        new = [
            f
            for f in diagnose(self.rows, thresholds=self.thresholds)
            if f.severity == "warning" and f.code not in self.seen
        ]
        self.seen.update(f.code for f in new)
        return new

    def summary(self) -> tuple[bool, list[str]]:
        """Whether the run has warnings, and the lines that say them (or that there are none)."""
        found = [f for f in diagnose(self.rows, thresholds=self.thresholds) if f.severity == "warning"]
        if not found:
            return False, [f"doctor: no findings in {len(self.rows)} steps"]
        head = f"doctor: {len(found)} finding(s) in {len(self.rows)} steps (agl-lite doctor OUTPUT_DIR):"
        return True, [head, *(f"  [{f.code}] {f.figure}; try: {f.advice}" for f in found)]
