"""The HF engine's decoding batch: rows (requests) join it prefilled and leave it finished between steps,
one KV cache for all, each row sampled with its own settings, seed, stop strings, grammar and budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .base import GenRequest, GenResult
from .hf_kvcache import (
    KV,
    MIN_SHARED_PREFIX,
    CachedPrompt,
    PrefixCache,
    bare,
    cache_name,
    kv_bytes,
    kv_of,
    merge_kv,
    select_kv,
    seq_len,
    shared_head,
    with_kv,
)
from .hf_sampling import allowed_tokens, grammar_matcher, sample_row, sample_rows

if TYPE_CHECKING:
    from .hf import HFEngine

__all__ = ["DecodeCounters", "Row", "RowBatch", "decode_batch"]

_cache_name = cache_name  # the name this module had for it


@dataclass
class DecodeCounters:
    """Work done by a :class:`RowBatch`: prompt tokens run through the model (``prefill_tokens``) in
    ``prefill_passes`` forward passes, tokens fed back while decoding (``decode_tokens``) in
    ``decode_steps`` passes, and rows whose prompt was not prefilled for them (``prefix_hits``: shared
    with another row joining at the same time or found in the prefix cache; ``prefill_tokens_saved``
    their prompt tokens)."""

    prefill_tokens: int = 0
    prefill_passes: int = 0
    decode_tokens: int = 0
    decode_steps: int = 0
    prefix_hits: int = 0
    prefill_tokens_saved: int = 0


@dataclass(eq=False)
class Row:
    """One request decoding: what it sampled so far and how it ended."""

    request: GenRequest
    handle: Any  # the caller's (a future, an index)
    gen: Any
    matcher: Any
    fast: bool
    length: int  # positions of this row in the KV cache (prompt and the tokens fed back)
    started: float = field(default_factory=time.monotonic)
    tokens: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    tops: list[tuple[Any, Any]] = field(default_factory=list)
    finish: str = "length"
    stop_reason: str | int | None = None
    text: str | None = None
    done: bool = False
    error: BaseException | None = None


class RowBatch:
    """The rows decoding together on ``engine``'s model (its adapter active, its lock held) and their KV
    cache: :meth:`add` prefills requests and stacks them in, :meth:`step` samples one token for every
    row and returns the rows that ended (they leave at once), then feeds the others one step.

    A prompt that several joining rows share is prefilled once; with a :class:`PrefixCache`, a prompt
    prefilled earlier in this batch's life is not prefilled again. ``rng`` samples rows without a seed,
    ``eos`` ends replies, ``ll_tokenizer`` builds the llguidance tokenizer of constrained rows and
    ``should_abort`` is true for a request whose client is gone."""

    def __init__(
        self,
        engine: HFEngine,
        version: int,
        adapter: str | None,
        *,
        rng: Any,
        eos: Collection[int],
        ll_tokenizer: Callable[[], Any],
        should_abort: Callable[[GenRequest], bool],
        prefix_cache: PrefixCache | None = None,
        counters: DecodeCounters | None = None,
    ) -> None:
        import torch

        self.engine, self.version, self.adapter = engine, version, adapter
        self.rng, self.eos, self.ll_tokenizer, self.should_abort = rng, set(eos), ll_tokenizer, should_abort
        self.prefix_cache = prefix_cache
        self.counters = counters if counters is not None else DecodeCounters()
        self.device = engine.device
        self.rows: list[Row] = []
        self.kv: KV = []
        self.template: Any = None  # a cache object of the model's type (rebuilt around ``kv``)
        self.logits: Any = None  # [rows, vocab]: each row's next-token logits
        self.last: Any = None  # [rows] the tokens sampled at the last step, on the device
        self._settings: tuple[Any, Any] | None = None  # (temps, greedy) of the rows, rebuilt on change
        self._torch = torch

    # -- joining -------------------------------------------------------------------------
    def add(self, joining: Sequence[tuple[GenRequest, Any]]) -> list[Row]:
        """Prefill ``(request, handle)`` pairs and stack them into the batch; returns the rows that end
        before their first token (aborted already, no token budget)."""
        torch = self._torch
        ended: list[Row] = []
        fresh: list[Row] = []
        for request, handle in joining:
            row = Row(request, handle, None, None, False, len(request.prompt_token_ids))
            if self.should_abort(request):
                row.done, row.finish = True, "abort"
            elif request.max_tokens <= 0:
                row.done = True
            else:
                try:
                    row.matcher = grammar_matcher(request, self.ll_tokenizer)
                except BaseException as exc:
                    row.done, row.error = True, exc
            if row.done:
                ended.append(row)
                continue
            if request.seed is None:
                row.gen = self.rng
            else:
                row.gen = torch.Generator(device=self.device)
                row.gen.manual_seed(int(request.seed))
            row.fast = (
                request.seed is None
                and not (request.truncated or request.penalised or request.top_logprobs)
                and self.engine.logprobs_mode != "processed"
            )
            fresh.append(row)
        if not fresh:
            return ended
        kv, logits = self._prefill([r.request.prompt_token_ids for r in fresh])
        self.kv = merge_kv([self.kv, kv]) if self.rows else kv
        self.logits = torch.cat([self.logits, logits]) if self.rows else logits
        self.rows.extend(fresh)
        self._settings = None
        return ended

    def _prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[KV, Any]:
        """The KV (rows left-padded to the longest) and last logits of ``prompts``, each distinct prompt
        run through the model once (or taken from the prefix cache)."""
        torch = self._torch
        c = self.counters
        order: dict[tuple[int, ...], int] = {}  # distinct prompts, in order
        for p in prompts:
            order.setdefault(tuple(p), len(order))
        found: dict[int, CachedPrompt] = {}
        todo: list[tuple[int, ...]] = []
        for key, u in order.items():
            hit = self.prefix_cache.get(self.version, self.adapter, key) if self.prefix_cache else None
            if hit is not None:
                found[u] = hit
            else:
                todo.append(key)
        c.prefix_hits += len(prompts) - len(todo)
        c.prefill_tokens_saved += sum(len(p) for p in prompts) - sum(len(k) for k in todo)
        if todo:
            for u, entry in zip((order[k] for k in todo), self._run_shared(todo), strict=True):
                found[u] = entry
        if self.template is None:
            self.template = found[0].template
        uniques = [found[u] for u in range(len(order))]
        kv = merge_kv([e.kv for e in uniques])
        logits = torch.cat([e.logits for e in uniques])
        index = [order[tuple(p)] for p in prompts]
        if index != list(range(len(uniques))):  # rows sharing a prompt: repeat its KV
            idx = torch.tensor(index, dtype=torch.long, device=self.device)
            kv = select_kv(kv, idx, seq_len(kv))
            logits = logits.index_select(0, idx)
        return kv, logits

    def _run_shared(self, prompts: Sequence[tuple[int, ...]]) -> list[CachedPrompt]:
        """Prefill distinct ``prompts``, each shared head (few-shot examples, a system prompt, earlier
        turns) run once. A prompt whose first :data:`MIN_SHARED_PREFIX` or more tokens a prompt of the
        prefix cache also starts with reuses that prompt's KV of those tokens (causal attention: they do
        not depend on what follows); the other prompts' common head, when that long, is prefilled once
        (and cached). Each prompt then prefills only its own tail."""
        heads: dict[tuple[int, int], tuple[int, CachedPrompt]] = {}  # (entry id, length) -> the head
        head_of: list[tuple[int, int] | None] = []
        for p in prompts:
            hit = (
                self.prefix_cache.longest_common(self.version, self.adapter, p) if self.prefix_cache else None
            )
            key = None
            if hit is not None and hit[0] >= MIN_SHARED_PREFIX:
                key = (id(hit[1]), hit[0])
                heads[key] = hit
            head_of.append(key)
        rest = [p for p, h in zip(prompts, head_of, strict=True) if h is None]
        common = shared_head(rest)
        if len(rest) > 1 and len(common) >= MIN_SHARED_PREFIX:
            entry = self._run_prompts([common])[0]  # kept in the prefix cache for later prompts
            key = (id(entry), len(common))
            heads[key] = (len(common), entry)
            head_of = [key if h is None else h for h in head_of]
        out: dict[tuple[int, ...], CachedPrompt] = {}
        plain = [p for p, h in zip(prompts, head_of, strict=True) if h is None]
        if plain:
            out.update(zip(plain, self._run_prompts(plain), strict=True))
        for key, (start, entry) in heads.items():
            tails = [p for p, h in zip(prompts, head_of, strict=True) if h == key]
            out.update(zip(tails, self._run_tails(start, entry, tails), strict=True))
        return [out[p] for p in prompts]

    def _run_tails(
        self, start: int, entry: CachedPrompt, prompts: Sequence[tuple[int, ...]]
    ) -> list[CachedPrompt]:
        """Prefill ``prompts``, whose first ``start`` tokens are ``entry``'s, from ``entry``'s KV of those
        tokens: the tails left-padded after it in one forward pass; one entry (unpadded: head, tail) each."""
        torch = self._torch
        engine, c = self.engine, self.counters
        n = len(prompts)
        tails = [p[start:] for p in prompts]
        width = max(len(t) for t in tails)
        ids = torch.full((n, width), engine.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, start + width), dtype=torch.long)
        mask[:, :start] = 1
        for i, t in enumerate(tails):
            ids[i, width - len(t) :] = torch.tensor(t, dtype=torch.long)
            mask[i, start + width - len(t) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = start + (mask[:, start:].cumsum(-1) - 1).clamp(min=0)
        name = cache_name()
        past = [
            (k[:, :, :start].expand(n, -1, -1, -1), v[:, :, :start].expand(n, -1, -1, -1))
            for k, v in entry.kv
        ]
        past = [(k.contiguous(), v.contiguous()) for k, v in past]
        out = engine.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
            **{name: with_kv(entry.template, past)},
        )  # fmt: skip
        c.prefill_passes += 1
        c.prefill_tokens += sum(len(t) for t in tails)
        c.prefill_tokens_saved += start * n
        kv = kv_of(getattr(out, name))
        logits = out.logits[:, -1, :].float()
        entries = []
        for i, (p, t) in enumerate(zip(prompts, tails, strict=True)):
            own = start + width - len(t)  # where this row's tail begins, after the padding
            row_kv = [
                (torch.cat([k[i : i + 1, :, :start], k[i : i + 1, :, own:]], dim=2),
                 torch.cat([v[i : i + 1, :, :start], v[i : i + 1, :, own:]], dim=2))
                for k, v in kv
            ]  # fmt: skip
            cached = CachedPrompt(row_kv, logits[i : i + 1], entry.template, kv_bytes(row_kv))
            if self.prefix_cache is not None:
                self.prefix_cache.put(self.version, self.adapter, p, cached)
            entries.append(cached)
        return entries

    def _run_prompts(self, prompts: Sequence[tuple[int, ...]]) -> list[CachedPrompt]:
        """Prefill distinct ``prompts`` in one left-padded forward pass; one entry (unpadded) each."""
        torch = self._torch
        engine, c = self.engine, self.counters
        n, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((n, width), engine.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = engine.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        c.prefill_passes += 1
        c.prefill_tokens += sum(len(p) for p in prompts)
        cache = getattr(out, cache_name())
        kv = kv_of(cache)
        template = self.template if self.template is not None else bare(cache)
        logits = out.logits[:, -1, :].float()
        entries = []
        for i, p in enumerate(prompts):
            start = width - len(p)
            row_kv = [(k[i : i + 1, :, start:], v[i : i + 1, :, start:]) for k, v in kv]
            if n > 1 or self.prefix_cache is not None:  # views of the batch would keep it all alive
                row_kv = [(k.clone(), v.clone()) for k, v in row_kv]
            entry = CachedPrompt(row_kv, logits[i : i + 1], template, kv_bytes(row_kv))
            if self.prefix_cache is not None:
                self.prefix_cache.put(self.version, self.adapter, p, entry)
            entries.append(entry)
        return entries

    # -- decoding ------------------------------------------------------------------------
    def step(self) -> list[Row]:
        """Sample the next token of every row; the rows that ended leave the batch and are returned
        (their results: :meth:`result`); the others are fed their token (one forward pass)."""
        torch = self._torch
        engine, rows, n = self.engine, self.rows, len(self.rows)
        if not rows:
            return []
        for row in rows:  # cancelled: its client is gone
            if self.should_abort(row.request):
                row.done, row.finish = True, "abort"
        logits = self.logits
        matchers = [r.matcher for r in rows]
        allowed = (
            allowed_tokens(matchers, logits.shape[-1], self.eos, self.device)
            if any(m is not None for m in matchers)
            else None
        )
        if self._settings is None:
            self._settings = (
                torch.tensor([max(r.request.temperature, 1e-5) for r in rows], device=self.device)[:, None],
                torch.tensor([r.request.temperature <= 1e-5 for r in rows], device=self.device),
            )
        temps, greedy = self._settings
        if any(r.fast for r in rows):
            step_tok, step_lp = sample_rows(logits, temps, greedy, self.rng, engine.logprobs_mode, allowed)
        else:
            step_tok = torch.full((n,), engine.pad_token_id, dtype=torch.long, device=self.device)
            step_lp = torch.zeros(n, device=self.device)
        for i, row in enumerate(rows):
            if not (row.done or row.fast):
                r = row.request
                row_allowed = None if row.matcher is None or allowed is None else allowed[i]
                tok, lp, top = sample_row(
                    logits[i], r, row.gen, engine.logprobs_mode, row_allowed, row.tokens
                )
                step_tok[i], step_lp[i] = tok, lp
                if top is not None:
                    row.tops.append(top)
        # the one device-to-host copy per step: the sampled ids and their logprobs
        host = torch.stack([step_tok.to(torch.float64), step_lp.to(torch.float64)]).tolist()
        for i, row in enumerate(rows):
            if row.done:
                continue
            tok = int(host[0][i])
            row.tokens.append(tok)
            row.lps.append(host[1][i])
            self._check_end(row, tok)
        ended = [r for r in rows if r.done]
        if len(ended) == n:
            self.rows, self.kv, self.logits, self.last = [], [], None, None
            return ended
        if ended:
            keep = [i for i, r in enumerate(rows) if not r.done]
            idx = torch.tensor(keep, dtype=torch.long, device=self.device)
            self.rows = [rows[i] for i in keep]
            self.kv = select_kv(self.kv, idx, max(r.length for r in self.rows))
            step_tok = step_tok.index_select(0, idx)
            self._settings = None
        self._forward(step_tok)
        return ended

    def _check_end(self, row: Row, tok: int) -> None:
        r, engine = row.request, self.engine
        m = row.matcher
        if m is not None and tok not in self.eos and not m.consume_token(tok):
            row.done = True
            row.error = RuntimeError(f"constrained decoding went off its grammar: {m.get_error()}")
            return
        if tok in self.eos:
            row.done, row.finish, row.stop_reason = True, "stop", tok
        elif r.stop:
            text = engine.decode(row.tokens)
            hits = sorted((text.find(s), s) for s in r.stop if s and s in text)
            if hits:
                row.done, row.finish, row.stop_reason = True, "stop", hits[0][1]
                row.text = text[: hits[0][0]]
        if not row.done and (
            len(row.tokens) >= r.max_tokens or len(r.prompt_token_ids) + len(row.tokens) >= engine.max_context
        ):
            row.done = True

    def _forward(self, tokens: Any) -> None:
        """Feed each row its last sampled token: one decoding step for the whole batch."""
        torch = self._torch
        width = seq_len(self.kv)
        lengths = torch.tensor([r.length for r in self.rows], dtype=torch.long, device=self.device)
        cols = torch.arange(width + 1, device=self.device)
        mask = (cols[None, :] >= (width - lengths)[:, None]).long()
        name = cache_name()
        out = self.engine.model(
            input_ids=tokens.unsqueeze(1),
            attention_mask=mask,
            position_ids=lengths[:, None],
            use_cache=True,
            **{name: with_kv(self.template, self.kv)},
        )
        self.logits = out.logits[:, -1, :].float()
        self.kv = kv_of(getattr(out, name))
        for r in self.rows:
            r.length += 1
        self.counters.decode_steps += 1
        self.counters.decode_tokens += len(self.rows)

    # -- results -------------------------------------------------------------------------
    def result(self, row: Row) -> GenResult:
        """What ``row`` generated, as the engine reports it."""
        tops: list[list[tuple[int, float]]] | None = None
        if row.request.top_logprobs:
            tops = []
            if row.tops:
                idx = self._torch.stack([t[0] for t in row.tops]).tolist()
                vals = self._torch.stack([t[1] for t in row.tops]).tolist()
                tops = [list(zip(a, b, strict=True)) for a, b in zip(idx, vals, strict=True)]
        return GenResult(
            prompt_token_ids=list(row.request.prompt_token_ids),
            token_ids=list(row.tokens),
            logprobs=list(row.lps),
            text=row.text if row.text is not None else self.engine.decode(row.tokens),
            finish_reason=row.finish,
            top_logprobs=tops,
            stop_reason=row.stop_reason,
            weights_version=self.version,
            adapter=self.adapter,
        )


def decode_batch(
    engine: HFEngine,
    requests: Sequence[GenRequest],
    version: int,
    adapter: str | None = None,
    *,
    rng: Any,
    eos: Collection[int],
    ll_tokenizer: Callable[[], Any],
    should_abort: Callable[[GenRequest], bool],
    counters: DecodeCounters | None = None,
) -> list[GenResult]:
    """Decode ``requests`` together on ``engine``'s model (its adapter already active) until all end, a
    :class:`RowBatch` no request joins; the results are tagged with ``version`` and ``adapter``."""
    batch = RowBatch(
        engine,
        version,
        adapter,
        rng=rng,
        eos=eos,
        ll_tokenizer=ll_tokenizer,
        should_abort=should_abort,
        counters=counters,
    )
    ended = batch.add([(r, i) for i, r in enumerate(requests)])
    while batch.rows:
        ended.extend(batch.step())
    results: list[GenResult | None] = [None] * len(requests)
    for row in ended:
        if row.error is not None:
            raise row.error
        results[row.handle] = batch.result(row)
    return results  # type: ignore[return-value]
