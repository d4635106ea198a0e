"""Loud diagnostics of a training step: did its rollouts call the served policy, and how varied were the
replies it learns from.

A step whose rollouts made no call to the policy the trainer serves trains on nothing, and the reason
is nearly always a wiring mistake in the agent; it is logged at once (a warning naming the likely
cause) instead of surfacing later as a flat reward curve. The numbers go into the step's metrics:

* ``diag/policy_calls``: LLM calls the trainer's PolicyServer answered (with token ids);
* ``diag/other_calls``: LLM calls recorded that did not go through it (another model or endpoint);
* ``diag/entropy``: the mean negative log-probability of the sampled response tokens under the engine
  (an estimate of the policy's per-token entropy: it falls towards 0 as the policy collapses);
* ``diag/distinct_responses``: per task group, the share of distinct replies (1.0: every rollout of a
  task answered differently; ``1/group_size``: all alike, so GRPO has nothing to compare);
* ``diag/distinct_2``: distinct token bigrams over all bigrams of the step's replies;
* ``tools/parsed``: tool calls read from the served replies;
* ``tools/unparsed``: served replies that hold a tool-call marker of the server's tool parser but
  gave no call (recorded as ``tool_parse_failed`` on their span: a parser that does not fit the
  model, or a model that writes broken calls; the server warns once with an excerpt).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from .. import join
from ..store.base import Store
from ..types import Span
from .rollouts import RolloutResult

__all__ = ["step_diagnostics"]

logger = logging.getLogger(__name__)


def _served(s: Span) -> bool:
    """A call the trainer's PolicyServer answered (it records ``policy`` and ``server`` on its spans)."""
    return bool(s.attributes.get("policy")) and s.attributes.get("server") == "agl"


def _tool_calls(s: Span) -> int:
    """How many tool calls the served reply of ``s`` gave (its output message's ``tool_calls``)."""
    calls = s.output.get("tool_calls") if isinstance(s.output, dict) else None
    return len(calls) if isinstance(calls, list) else 0


def step_diagnostics(
    results: Sequence[RolloutResult],
    store: Store,
    agent_policy: Mapping[str, str] | None = None,
    step: int | None = None,
) -> dict[str, float]:
    """The step's call and diversity metrics; logs a warning at once for a step that made no call to
    the served policy, called other models, or had a policy's calls served without its adapter."""
    ran = [r for r in results if r.rollout_id]
    served: list[Span] = []
    other: list[Span] = []
    by_group: dict[object, list[tuple[int, ...]]] = defaultdict(list)
    for r in ran:
        reply: list[int] = []
        for s in store.spans(r.rollout_id):
            if s.kind != "llm" or s.status != "ok" or s.attributes.get(join.DUPLICATE_OF):
                continue
            if _served(s):
                served.append(s)
                reply += s.response_token_ids or []
            else:
                other.append(s)
        by_group[r.spec.metadata.get("task_index", r.rollout_id)].append(tuple(reply))
    if step is None and ran:
        step = ran[0].spec.metadata.get("step")
    where = f"step {step}: " if step is not None else ""
    models = ", ".join(f"{m!r} ({n})" for m, n in Counter(s.model or "?" for s in other).most_common(5))
    if ran and not served:
        if other:
            logger.warning(
                "%sthe %d rollouts made %d LLM calls, none to the served policy: they went to %s. Likely "
                "cause: the agent's client is not pointed at the trainer's server: build it from the `llm` "
                "the agent is given (llm.openai_client(), or base_url=llm.base_url and model=llm.model)",
                where,
                len(ran),
                len(other),
                models,
            )
        else:
            logger.warning(
                "%sthe %d rollouts made no LLM call that was recorded. Likely cause: the agent does not call "
                "the model it is given (its `llm` argument), or its calls fail before reaching the server "
                "(see the rollouts' errors: agl-lite runs %s --status failed)",
                where,
                len(ran),
                getattr(store, "path", "runs.db"),
            )
    elif other:
        logger.warning(
            "%s%d of %d LLM calls did not go to the served policy (%s) and are not trained. Likely cause: "
            "some of the agent's clients use their own base_url instead of the `llm` given to the agent",
            where,
            len(other),
            len(other) + len(served),
            models,
        )
    if agent_policy:
        bare = Counter(
            s.agent
            for s in served
            if s.agent is not None
            and s.agent in agent_policy
            and agent_policy[s.agent] != "default"
            and s.attributes.get("adapter") is None
        )
        for agent, n in bare.items():
            logger.warning(
                "%s%d calls of agent %r were served by the base model, not by its adapter %r. Likely cause: "
                "its calls are not routed with its agent name: give the agent the llm for its name "
                "(server.llm(rollout_id, agent=...)) or send the X-Agl-Agent header",
                where,
                n,
                agent,
                agent_policy[agent],
            )
    out = {
        "diag/policy_calls": float(len(served)),
        "diag/other_calls": float(len(other)),
        "tools/parsed": float(sum(_tool_calls(s) for s in served)),
        "tools/unparsed": float(sum(bool(s.attributes.get("tool_parse_failed")) for s in served)),
    }
    logprobs = [lp for s in served for lp in (s.response_logprobs or []) if math.isfinite(lp)]
    if logprobs:
        out["diag/entropy"] = -statistics.fmean(logprobs)
    groups = [replies for replies in by_group.values() if len(replies) > 1]
    if groups:
        out["diag/distinct_responses"] = statistics.fmean(len(set(g)) / len(g) for g in groups)
    bigrams = [
        b
        for s in served
        for b in zip((s.response_token_ids or [])[:-1], (s.response_token_ids or [])[1:], strict=True)
    ]
    if bigrams:
        out["diag/distinct_2"] = len(set(bigrams)) / len(bigrams)
    return out
