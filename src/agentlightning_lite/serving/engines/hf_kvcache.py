"""The HF engine's KV cache surgery (rows selected, left-padded and stacked) and its small prefix cache of
prefilled prompts."""

from __future__ import annotations

import collections
import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MIN_SHARED_PREFIX",
    "CachedPrompt",
    "PrefixCache",
    "bare",
    "cache_name",
    "shared_head",
    "kv_of",
    "merge_kv",
    "select_kv",
    "with_kv",
]

#: one layer's keys and values, ``[rows, heads, seq, head_dim]`` each
KV = list[tuple[Any, Any]]

#: the shortest head of prompts worth prefilling once for several of them (a shorter one costs more in
#: KV copies than it saves)
MIN_SHARED_PREFIX = 32


def shared_head(prompts: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The longest head common to all ``prompts`` that leaves each at least one token of its own.

    >>> shared_head([(1, 2, 3), (1, 2, 4, 5)]), shared_head([(1, 2), (1, 2, 3)]), shared_head([])
    ((1, 2), (1,), ())
    """
    if not prompts:
        return ()
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    i = 0
    while i < n and all(p[i] == first[i] for p in prompts):
        i += 1
    return tuple(first[:i])


@functools.cache
def cache_name() -> str:
    """The name of the KV cache in a model's arguments and outputs: ``cache`` in the transformers
    releases that deprecate ``past_key_values`` (5.24 and later), ``past_key_values`` before. Looked
    up on first use: importing this module must not import transformers (runners import the engines)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def kv_of(cache: Any) -> KV:
    """The per-layer ``(keys, values)`` tensors of a transformers ``DynamicCache`` (either layout: the
    ``layers`` of 4.56 and later, the ``key_cache``/``value_cache`` lists before)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def with_kv(template: Any, kv: KV) -> Any:
    """A cache like ``template`` (same class and settings) holding ``kv``; ``template`` is left as is."""
    out = copy.copy(template)
    layers = getattr(template, "layers", None)
    if layers is not None:
        new_layers = []
        for layer, (k, v) in zip(layers, kv, strict=True):
            fresh = copy.copy(layer)
            fresh.keys, fresh.values = k, v
            new_layers.append(fresh)
        out.layers = new_layers
    else:
        out.key_cache = [k for k, _ in kv]
        out.value_cache = [v for _, v in kv]
    if hasattr(out, "_seen_tokens"):  # transformers 4.4x counts the tokens it has seen
        out._seen_tokens = seq_len(kv)
    return out


def bare(cache: Any) -> Any:
    """A copy of ``cache`` without its tensors: a template for :func:`with_kv` that keeps no memory."""
    return with_kv(cache, [(None, None)] * len(kv_of(cache)))


def seq_len(kv: KV) -> int:
    """How many positions the cache holds (its sequence length)."""
    return int(kv[0][0].shape[-2]) if kv and kv[0][0] is not None else 0


def select_kv(kv: KV, index: Any, keep: int) -> KV:
    """Rows ``index`` (a long tensor) of ``kv``, cut to the last ``keep`` positions (the left columns
    that only padding of the rows kept used are dropped)."""
    start = seq_len(kv) - keep
    return [(k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:]) for k, v in kv]


def left_pad(kv: KV, width: int) -> KV:
    """``kv`` left-padded with zeros to ``width`` positions (the padding is masked out)."""
    import torch.nn.functional as F

    extra = width - seq_len(kv)
    if extra <= 0:
        return kv
    return [(F.pad(k, (0, 0, extra, 0)), F.pad(v, (0, 0, extra, 0))) for k, v in kv]


def merge_kv(parts: Sequence[KV]) -> KV:
    """Rows of several caches stacked into one, each left-padded to the longest."""
    import torch

    if len(parts) == 1:
        return parts[0]
    width = max(seq_len(p) for p in parts)
    padded = [left_pad(p, width) for p in parts]
    return [
        (torch.cat([p[i][0] for p in padded]), torch.cat([p[i][1] for p in padded]))
        for i in range(len(padded[0]))
    ]


def kv_bytes(kv: KV) -> int:
    """The memory ``kv`` holds."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


@dataclass
class CachedPrompt:
    """A prefilled prompt: its KV (one row, no padding), its last position's logits ``[1, vocab]`` and a
    cache object of the model's own type to put the KV back in."""

    kv: KV
    logits: Any
    template: Any
    nbytes: int


class PrefixCache:
    """A small LRU of prefilled prompts, keyed by (weights version, adapter, prompt token ids), bounded in
    entries and bytes; entries of older weights are dropped as soon as newer ones arrive.

    >>> cache = PrefixCache(max_entries=2, max_bytes=100)
    >>> cache.get(0, None, [1, 2]) is None
    True
    """

    def __init__(self, max_entries: int = 8, max_bytes: int = 256 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[tuple[int, str | None, tuple[int, ...]], CachedPrompt] = (
            collections.OrderedDict()
        )
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """The memory held by the entries."""
        return self._bytes

    def get(self, version: int, adapter: str | None, prompt: Sequence[int]) -> CachedPrompt | None:
        """The entry of exactly this prompt (made the most recent), or ``None``."""
        key = (version, adapter, tuple(prompt))
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
        return hit

    def longest_common(
        self, version: int, adapter: str | None, prompt: Sequence[int]
    ) -> tuple[int, CachedPrompt] | None:
        """The entry sharing the longest head with ``prompt`` (at most all but its last token), and the
        head's length; ``None`` when no entry of these weights and adapter shares a token with it.

        >>> cache = PrefixCache()
        >>> cache.put(0, None, [1, 2, 3], CachedPrompt([], None, None, 0))
        >>> cache.longest_common(0, None, [1, 2, 5])[0], cache.longest_common(0, None, [1, 2, 3])[0]
        (2, 2)
        """
        best: tuple[int, tuple[int, str | None, tuple[int, ...]]] | None = None
        limit = len(prompt) - 1
        for key in self._entries:
            if key[0] != version or key[1] != adapter:
                continue
            p, n = key[2], 0
            while n < limit and n < len(p) and p[n] == prompt[n]:
                n += 1
            if n > 0 and (best is None or n > best[0]):
                best = (n, key)
        if best is None:
            return None
        self._entries.move_to_end(best[1])
        return best[0], self._entries[best[1]]

    def put(self, version: int, adapter: str | None, prompt: Sequence[int], entry: CachedPrompt) -> None:
        """Keep ``entry`` (unless it alone exceeds the byte bound), evicting the least recently used."""
        if self.max_entries <= 0 or entry.nbytes > self.max_bytes:
            return
        for key in [k for k in self._entries if k[0] != version]:  # weights changed: stale
            self._drop(key)
        key = (version, adapter, tuple(prompt))
        if key in self._entries:
            self._drop(key)
        self._entries[key] = entry
        self._bytes += entry.nbytes
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._bytes = 0

    def _drop(self, key: tuple[int, str | None, tuple[int, ...]]) -> None:
        self._bytes -= self._entries.pop(key).nbytes
