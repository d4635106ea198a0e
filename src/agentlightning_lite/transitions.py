"""Spans to RL transitions: one (prompt, response, reward) per policy-model call, in call order."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence

from . import join
from .air import AIRRule, as_rules, call_before
from .credit import CreditRule, FinalReward, Step
from .store.base import Store
from .types import Rollout, Span, Transition

__all__ = [
    "SIDE_AGENT",
    "is_side_call",
    "policy_calls",
    "rollout_transitions",
    "transitions",
    "why_not_trained",
]

#: The agent name of side calls: a harness's titles, summaries and "small model" calls (a harness
#: given the model ``<model>@side`` makes them under this agent). They are recorded like every call
#: and left out of training unless asked for (``side_calls=True``, or ``agents`` naming it).
SIDE_AGENT = "side"


def is_side_call(span: Span) -> bool:
    """Whether ``span`` is a side call: its agent is :data:`SIDE_AGENT`, or it carries ``agl.side``.

    >>> from agentlightning_lite.types import Span
    >>> is_side_call(Span(span_id="s", rollout_id="r", kind="llm", name="chat", agent="side", start_time=0.0))
    True
    """
    return span.agent == SIDE_AGENT or bool(span.attributes.get("agl.side"))


def policy_calls(
    spans: Sequence[Span], models: Iterable[str] | None = None, side_calls: bool = False
) -> list[Span]:
    """The LLM spans of a rollout that count as policy-model calls, in call order.

    A span is left out when it failed (``status="error"``), when its model is not in ``models``
    (if given), when it is a side call (:func:`is_side_call`) unless ``side_calls``, when it carries the
    attribute ``agl.duplicate_of`` (a framework's view of a call already recorded with tokens),
    or when an adapter recorded it (``agl.source``) and it has no token ids (a call to a model the
    PolicyServer does not serve: :func:`transitions` warns about those).
    """
    allowed = None if models is None else set(models)
    return [s for s in spans if s.kind == "llm" and _not_a_policy_call(s, allowed, side_calls) is None]


def _not_a_policy_call(s: Span, models: set[str] | None, side_calls: bool) -> str | None:
    """Why the LLM span ``s`` is not a policy-model call (``None``: it is): :func:`policy_calls`' rules."""
    if s.status != "ok":
        return "the call failed: no response to learn from"
    if models is not None and s.model not in models:
        return f"model {s.model!r} is not among the trained models"
    if not side_calls and is_side_call(s):
        return "a side call (titles, summaries): not trained unless asked for"
    if s.attributes.get(join.DUPLICATE_OF):
        return "a framework's view of a call recorded with tokens (that one is trained)"
    if s.attributes.get(join.SOURCE) and not s.has_tokens:
        return "recorded by a framework adapter without token ids: the agent called a model not served here"
    return None


def why_not_trained(
    span: Span,
    agents: Iterable[str] | None = None,
    models: Iterable[str] | None = None,
    side_calls: bool = False,
) -> str | None:
    """Why the LLM span ``span`` of a rollout (joined: :func:`agentlightning_lite.join.resolve`) gives
    no transition under :func:`transitions`' arguments, in words; ``None`` when it gives one.

    >>> from agentlightning_lite.types import Span
    >>> call = Span(span_id="s", rollout_id="r", kind="llm", name="chat", agent="critic", start_time=0.0)
    >>> why_not_trained(call, agents=["writer"])
    "agent 'critic' is not among the trained agents"
    >>> why_not_trained(call) is None
    True
    """
    if span.kind != "llm":
        return "not an LLM call"
    agents = None if agents is None else list(agents)
    side = side_calls or (agents is not None and SIDE_AGENT in agents)
    reason = _not_a_policy_call(span, None if models is None else set(models), side)
    if reason is None and agents is not None and span.agent not in agents:
        return f"agent {span.agent!r} is not among the trained agents"
    return reason


def _warn_untokenized(skipped: dict[str, int], stacklevel: int) -> None:
    if not skipped:
        return
    total = sum(skipped.values())
    per = ", ".join(f"{n} from {src}" for src, n in sorted(skipped.items()))
    warnings.warn(
        f"{total} LLM call(s) recorded by framework adapters ({per}) have no token ids: no "
        "PolicyServer span of the same call was found (the agent called a model that is not served "
        "by agl.PolicyServer, or its calls were not routed to this rollout); they are not training data",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


def _untokenized_sources(spans: Sequence[Span], skipped: dict[str, int]) -> None:
    for s in join.untokenized(spans):
        src = str(s.attributes.get(join.SOURCE))
        skipped[src] = skipped.get(src, 0) + 1


def _intermediate_rewards(spans: Sequence[Span], calls: Sequence[Span]) -> list[list[tuple[str, float]]]:
    """Rewards emitted during the episode (not the final one), attributed to calls."""
    per_call: list[list[tuple[str, float]]] = [[] for _ in calls]
    for s in spans:
        if s.kind != "reward" or s.attributes.get("final"):
            continue
        idx = call_before(calls, s, s.agent)
        if idx is None:
            idx = 0 if calls else None  # a reward before any call belongs to the first one
        if idx is not None and isinstance(s.output, (int, float)):
            per_call[idx].append((s.name, float(s.output)))
    return per_call


def _finish_reason(span: Span) -> str | None:
    """Why the call's generation ended, as recorded on its span (``None`` when it was not); the
    engine's reason where the answer gave another (tool calls read from a reply cut at ``max_tokens``)."""
    reason = span.attributes.get("engine_finish_reason") or span.attributes.get("finish_reason")
    return reason if isinstance(reason, str) else None


def rollout_transitions(
    rollout: Rollout,
    spans: Sequence[Span],
    agents: Iterable[str] | None = None,
    credit: CreditRule | None = None,
    air: AIRRule | Iterable[AIRRule] | None = None,
    models: Iterable[str] | None = None,
    side_calls: bool = False,
) -> list[Transition]:
    """Transitions of one rollout from its spans; see :func:`transitions`."""
    skipped: dict[str, int] = {}
    agents = None if agents is None else list(agents)
    side = side_calls or (agents is not None and SIDE_AGENT in agents)
    out = _rollout_transitions(rollout, spans, agents, credit, as_rules(air), models, skipped, side)
    _warn_untokenized(skipped, stacklevel=3)
    return out


def _rollout_transitions(
    rollout: Rollout,
    spans: Sequence[Span],
    agents: Iterable[str] | None,
    credit: CreditRule | None,
    air: Sequence[AIRRule] | None,
    models: Iterable[str] | None,
    skipped: dict[str, int],
    side_calls: bool = False,
) -> list[Transition]:
    spans = join.resolve(spans)  # adapters' LLM spans paired with the server's token-level spans
    _untokenized_sources(spans, skipped)
    calls = policy_calls(spans, models, side_calls)
    if not calls:
        return []
    steps = [
        Step(i, c, r) for i, (c, r) in enumerate(zip(calls, _intermediate_rewards(spans, calls), strict=True))
    ]
    for rule in air or ():
        for ir in rule(spans, calls):
            steps[ir.call_index].rewards.append((ir.name, ir.value))
    rule_fn = credit if credit is not None else FinalReward()
    rewards = rule_fn(steps, rollout.reward)
    if len(rewards) != len(steps):
        raise ValueError(f"credit rule returned {len(rewards)} rewards for {len(steps)} calls")
    keep = None if agents is None else set(agents)
    out = []
    for step, reward in zip(steps, rewards, strict=True):
        c = step.span
        if keep is not None and c.agent not in keep:
            continue
        out.append(
            Transition(
                rollout_id=rollout.rollout_id,
                index=step.index,
                agent=c.agent,
                prompt=c.input,
                response=c.output,
                prompt_token_ids=c.prompt_token_ids,
                response_token_ids=c.response_token_ids,
                response_logprobs=c.response_logprobs,
                reward=reward,
                final_reward=rollout.reward,
                finish_reason=_finish_reason(c),
                metadata={
                    "span_id": c.span_id,
                    "model": c.model,
                    "intermediate_rewards": step.rewards,
                    "status": c.status,
                    "rollout_status": rollout.status,
                    "params": c.attributes.get("params"),
                    "weights_version": c.attributes.get("weights_version"),
                },
            )
        )
    return out


def transitions(
    store: Store,
    rollout_ids: Iterable[str] | None = None,
    agents: Iterable[str] | None = None,
    credit: CreditRule | None = None,
    air: AIRRule | Iterable[AIRRule] | None = None,
    models: Iterable[str] | None = None,
    mode: str | None = None,
    require_tokens: bool = False,
    side_calls: bool = False,
) -> list[Transition]:
    """One transition per policy LLM call of each rollout, in call order, with credited rewards.

    Args:
        store: where the rollouts live.
        rollout_ids: which rollouts (default: every rollout in the store, or those of ``mode``).
        agents: keep only these agents' calls; the others stay in the trace but are not trained.
            Credit is still assigned over the whole episode.
        credit: a credit rule (default ``credit.FinalReward()``: the episode's reward on every call).
        air: automatic intermediate reward rules (``air.ToolStatus``, ``air.Rule``, callables):
            one rule or a list of them.
        models: count only LLM calls made by these model names as policy calls.
        mode: with no ``rollout_ids``, take only rollouts of this mode (``train``/``val``/``trace``).
        require_tokens: drop calls without exact token ids (with a warning saying how many).
        side_calls: count side calls (agent ``"side"``: a harness's titles and small-model calls)
            as policy calls; by default they are not training data (``agents=["side", ...]`` too
            keeps them).

    LLM calls recorded by a framework adapter (``agentlightning_lite.adapters``) are joined here
    with the PolicyServer's token-level span of the same call, if the adapter has not joined them
    already; those left without token ids are skipped, with a ``RuntimeWarning`` saying how many.

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer()
    >>> with tracer.rollout("2+2?") as ro:
    ...     for agent in ("writer", "checker"):
    ...         with tracer.span("llm", "chat", agent=agent, input="2+2?") as sp:
    ...             sp.set_output("4")
    ...     ro.reward(1.0)
    >>> [(t.index, t.agent, t.reward) for t in agl.transitions(tracer.store, agents=["writer"])]
    [(0, 'writer', 1.0)]
    """
    if rollout_ids is None:
        rollouts = store.rollouts(mode=mode)
    else:
        rollouts = []
        for rid in rollout_ids:
            ro = store.get_rollout(rid)
            if ro is None:
                raise KeyError(f"unknown rollout {rid!r}")
            rollouts.append(ro)
    agents = None if agents is None else list(agents)
    models = None if models is None else list(models)
    side = side_calls or (agents is not None and SIDE_AGENT in agents)
    rules = as_rules(air)
    out: list[Transition] = []
    skipped: dict[str, int] = {}
    for ro in rollouts:
        spans = store.spans(ro.rollout_id)
        out.extend(_rollout_transitions(ro, spans, agents, credit, rules, models, skipped, side))
    _warn_untokenized(skipped, stacklevel=3)
    if require_tokens:
        kept = [t for t in out if t.prompt_token_ids is not None and t.response_token_ids is not None]
        if len(kept) < len(out):
            warnings.warn(
                f"{len(out) - len(kept)} of {len(out)} policy calls have no token ids "
                "(made against a model the PolicyServer does not serve?) and are skipped",
                RuntimeWarning,
                stacklevel=2,
            )
        out = kept
    return out
