"""Shared-prefix packing: the samples of a micro-batch that share a token prefix (a GRPO group's
prompt, the earlier turns of one conversation) run that prefix through the model once.

A packed row holds a shared prefix ``C`` followed by each sample's own suffix, ``[C, s_1, s_2, ...]``;
a block mask lets every suffix see ``C`` and itself only, and each suffix's positions continue from
``C``'s, so every token sees exactly the context it has in its own sequence: the logprobs (and the
LoRA gradients) are those of the plain padded batch, for ``|C| + sum |s_i|`` tokens instead of
``n * |C| + sum |s_i|`` (Prefix Grouper; packing with a block mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["MIN_SHARED_TOKENS", "Packed", "pack_prefixes", "prefix_groups"]

#: the fewest tokens two sequences must share for packing them together to be worth it
MIN_SHARED_TOKENS = 16


@dataclass
class Packed:
    """A micro-batch as packed rows, and where each sample's response is predicted in them.

    ``hidden[row[i], pos[i, t]]`` (of the model's last hidden state over ``input_ids``) is the state
    that predicts response token ``t`` of sample ``i`` (``pos`` is 0 past its response's end).
    """

    input_ids: torch.Tensor  # [N, T]
    position_ids: torch.Tensor  # [N, T]
    allowed: torch.Tensor  # [N, T, T] bool: query t may attend to key u
    row: torch.Tensor  # [B]: the packed row of each sample
    pos: torch.Tensor  # [B, R]
    tokens: int  # real (unpadded) tokens in the rows: what the model computes
    plain_tokens: int  # the same samples' prompt + response tokens, one sequence each

    def to(self, device: torch.device) -> Packed:
        return Packed(
            self.input_ids.to(device),
            self.position_ids.to(device),
            self.allowed.to(device),
            self.row.to(device),
            self.pos.to(device),
            self.tokens,
            self.plain_tokens,
        )

    def attention_mask(self, dtype: torch.dtype, implementation: str | None) -> torch.Tensor:
        """The 4D mask ``[N, 1, T, T]`` in the form the model's attention takes: boolean (``True``:
        attend) for SDPA and flex attention, additive (0 / most negative) for the eager path."""
        allowed = self.allowed[:, None, :, :]
        if implementation in (None, "sdpa", "flex_attention"):
            return allowed
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )


def _lcp(a: Sequence[int], b: Sequence[int], most: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (at most ``most``)."""
    n = min(len(a), len(b), most)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_groups(
    seqs: Sequence[Sequence[int]], min_shared: int = MIN_SHARED_TOKENS
) -> list[tuple[list[int], int]]:
    """Group sequences that share a prefix of at least ``min_shared`` tokens.

    Returns ``(indices, shared)`` per group, ``shared`` the group's common prefix length; a sequence
    that shares too little with the others is a group of its own (``shared`` 0). Sequences are sorted
    so that those with common prefixes are neighbours; a group grows while its common prefix stays at
    least ``min_shared`` tokens and packing saves tokens.

    >>> prefix_groups([[1, 2, 3, 4], [9, 9], [1, 2, 3, 5], [1, 2, 3]], min_shared=2)
    [([3, 0, 2], 3), ([1], 0)]
    """
    order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
    groups: list[tuple[list[int], int]] = []
    cur: list[int] = []
    shared = 0
    for i in order:
        if cur:
            common = _lcp(seqs[cur[0]], seqs[i], shared if len(cur) > 1 else len(seqs[cur[0]]))
            if common >= min_shared:
                cur.append(i)
                shared = common
                continue
            groups.append((cur, shared if len(cur) > 1 else 0))
        cur, shared = [i], 0
    if cur:
        groups.append((cur, shared if len(cur) > 1 else 0))
    return groups


def pack_prefixes(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    response_len: int,
    pad_id: int,
    min_shared: int = MIN_SHARED_TOKENS,
) -> Packed | None:
    """Pack samples (``prompts[i] + responses[i]``) that share prefixes into rows; ``None`` when no two
    share ``min_shared`` tokens (the plain padded batch is then as cheap).

    ``response_len`` is the batch's response width ``R`` (``pos`` is ``[B, R]``).

    >>> p = pack_prefixes([[5] * 20, [5] * 20], [[1, 2], [3]], 2, pad_id=0)
    >>> p.input_ids.shape, p.tokens, p.plain_tokens
    (torch.Size([1, 23]), 23, 43)
    >>> p.pos.tolist()  # both first tokens are predicted from the prompt's last state
    [[19, 20], [19, 0]]
    """
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    groups = prefix_groups(seqs, min_shared)
    if all(shared == 0 for _, shared in groups):
        return None
    rows: list[tuple[list[int], list[int], list[tuple[int, int]], int]] = []  # ids, positions, spans, shared
    b = len(seqs)
    row_of = torch.zeros(b, dtype=torch.long)
    pos = torch.zeros((b, max(response_len, 1)), dtype=torch.long)
    for members, shared in groups:
        ids = list(seqs[members[0]][:shared])
        positions = list(range(shared))
        spans: list[tuple[int, int]] = []  # each suffix's (start, length)
        for i in members:
            start = len(ids)
            suffix = seqs[i][shared:]
            ids.extend(suffix)
            positions.extend(range(shared, shared + len(suffix)))
            spans.append((start, len(suffix)))
            row_of[i] = len(rows)

            def where(u: int, start: int = start, shared: int = shared) -> int:  # packed index of u
                return u if u < shared else start + (u - shared)

            p_len = len(prompts[i])
            for t in range(len(responses[i])):
                pos[i, t] = where(p_len + t - 1)
        rows.append((ids, positions, spans, shared))
    width = max(len(r[0]) for r in rows)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((n, width), dtype=torch.long)
    allowed = torch.zeros((n, width, width), dtype=torch.bool)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    for k, (ids, positions, spans, shared) in enumerate(rows):
        input_ids[k, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        position_ids[k, : len(positions)] = torch.tensor(positions, dtype=torch.long)
        allowed[k, :shared, :shared] = causal[:shared, :shared]
        for start, length in spans:
            end = start + length
            allowed[k, start:end, start:end] = causal[:length, :length]
            allowed[k, start:end, :shared] = True  # a suffix sees the whole shared prefix
        for t in range(len(ids), width):  # padding attends to itself only (no empty softmax row)
            allowed[k, t, t] = True
    tokens = sum(len(r[0]) for r in rows)
    plain = sum(len(s) for s in seqs)
    return Packed(input_ids, position_ids, allowed, row_of, pos, tokens, plain)
