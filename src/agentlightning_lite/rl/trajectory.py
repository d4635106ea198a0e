"""Trajectory mode: the calls of a multi-turn episode merged into one training sequence.

A chat agent that appends to its history sends, at call ``k``, a prompt that starts with call
``k-1``'s prompt and response token ids. Training each call as its own sample pays for that
shared context once per call (quadratic in the turns); merging the calls pays for it once::

    call 1:  [ prompt 1 ][ resp 1 ]
    call 2:  [ prompt 1 ][ resp 1 ][ tool/user 2 ][ resp 2 ]
    call 3:  [ prompt 1 ][ resp 1 ][ tool/user 2 ][ resp 2 ][ tool/user 3 ][ resp 3 ]

    merged:  [ prompt 1 ][ resp 1 ][ tool/user 2 ][ resp 2 ][ tool/user 3 ][ resp 3 ]
    mask:     0 0 0 0 0   1 1 1 1   0 0 0 0 0 0 0  1 1 1 1   0 0 0 0 0 0 0  1 1 1 1
    credit:               A1 ....                  A2 ....                  A3 ....

Only the generated tokens are trained; each response segment keeps its own call's reward and
advantage (so ``credit.Discounted`` and AIR mean what they mean per call). Because attention is
causal, each response token sees exactly the context it saw as a separate sample, so the loss and
its gradient are the same; the forward pass is one instead of one per call. A call whose prompt
does not start with the previous call's prompt + response (a summarised history, a re-rendered
template) starts a new sequence: the fallback is counted in the metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .batching import Sample

__all__ = ["merge_trajectories"]


def _starts_with(seq: list[int], prefix: list[int]) -> bool:
    return len(seq) >= len(prefix) and seq[: len(prefix)] == prefix


def merge_trajectories(samples: Sequence[Sample]) -> tuple[list[Sample], dict[str, float]]:
    """Merge each episode's calls (same rollout and agent, in call order) into as few sequences as
    their token ids allow.

    A call joins the sequence whose tokens so far (first prompt, every response and the context
    between them) are a prefix of its prompt; a call that extends no sequence starts its own, and
    counts as a fallback (``trajectory/prefix_mismatches``) when its rollout and agent already had
    one. A merged sequence is exactly as long as its last call's prompt + response, so a length
    limit that every call meets holds for the merged sequences too. Returns the samples (merged
    ones carry ``parts`` and ``offsets``; a call left alone is returned as it was) and stats.

    >>> a = Sample([1, 2], [3, 4], None, 1.0, "g", advantage=0.5, rollout_id="r", index=0)
    >>> b = Sample([1, 2, 3, 4, 5], [6], None, 0.0, "g", advantage=-0.5, rollout_id="r", index=1)
    >>> c = Sample([9, 9], [7], None, 0.0, "g", rollout_id="r", index=2)  # history rewritten
    >>> merged, stats = merge_trajectories([a, b, c])
    >>> [(s.prompt_ids, s.response_ids) for s in merged]
    [([1, 2], [3, 4, 5, 6]), ([9, 9], [7])]
    >>> merged[0].token_mask(), merged[0].token_advantages()
    ([1.0, 1.0, 0.0, 1.0], [0.5, 0.5, 0.0, -0.5])
    >>> stats["trajectory/merged_calls"], stats["trajectory/prefix_mismatches"]
    (1.0, 1.0)
    """
    chains: dict[tuple[str, str | None], list[list[Sample]]] = {}
    order: list[list[Sample]] = []
    merged_calls = mismatches = 0
    ordered = sorted(enumerate(samples), key=lambda p: (p[1].rollout_id, p[1].agent or "", p[1].index, p[0]))
    for _, s in ordered:
        open_chains = chains.setdefault((s.rollout_id, s.agent), [])
        target: list[Sample] | None = None
        best = -1
        for chain in open_chains:  # the longest sequence this prompt continues
            full = chain[-1].prompt_ids + chain[-1].response_ids
            if len(full) > best and _starts_with(s.prompt_ids, full):
                target, best = chain, len(full)
        if target is not None:
            target.append(s)
            merged_calls += 1
            continue
        if open_chains:
            mismatches += 1
        chain = [s]
        open_chains.append(chain)
        order.append(chain)
    out = [_merge(chain) for chain in order]
    stats = {
        "trajectory/calls": float(len(samples)),
        "trajectory/sequences": float(len(out)),
        "trajectory/merged_calls": float(merged_calls),
        "trajectory/prefix_mismatches": float(mismatches),
    }
    return out, stats


def _merge(chain: list[Sample]) -> Sample:
    """One sample for a chain of calls whose prompts extend each other (a single call as it is)."""
    if len(chain) == 1:
        return chain[0]
    first, last = chain[0], chain[-1]
    p = len(first.prompt_ids)
    response = last.prompt_ids[p:] + last.response_ids
    offsets = [len(c.prompt_ids) - p for c in chain]
    return replace(
        first,
        response_ids=response,
        engine_logprobs=None,
        reward=last.reward,
        parts=list(chain),
        offsets=offsets,
        meta={**first.meta, "calls": [c.index for c in chain]},
    )
