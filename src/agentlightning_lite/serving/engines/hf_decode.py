"""The HF engine's batched decoding loop: left-padded prompts decoded together with a KV cache, each
request sampled with its own settings, seed, stop strings, grammar and token budget."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from .base import GenRequest, GenResult
from .hf_sampling import allowed_tokens, grammar_matcher, sample_row, sample_rows

if TYPE_CHECKING:
    from .hf import HFEngine

__all__ = ["decode_batch"]


@functools.cache
def _cache_name() -> str:
    """The name of the KV cache in a model's arguments and outputs: ``cache`` in the transformers
    releases that deprecate ``past_key_values`` (5.24 and later), ``past_key_values`` before. Looked
    up on first use: importing this module must not import transformers (runners import the engines)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


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
) -> list[GenResult]:
    """Decode ``requests`` together on ``engine``'s model (its adapter already active): the prompts
    left-padded, one token per row per step with a KV cache, each row with its own sampling settings,
    seed, stop strings and token budget; the results are tagged with ``version`` and ``adapter``.

    The engine's own state comes as arguments: ``rng`` (the generator of unseeded rows), ``eos`` (the
    end-of-sequence ids), ``ll_tokenizer`` (builds, once, the llguidance tokenizer of constrained rows)
    and ``should_abort`` (true for a request whose client is gone)."""
    import torch

    device = engine.device
    n = len(requests)
    width = max(len(r.prompt_token_ids) for r in requests)
    ids = torch.full((n, width), engine.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(requests):
        k = len(r.prompt_token_ids)
        ids[i, width - k :] = torch.tensor(r.prompt_token_ids, dtype=torch.long)
        mask[i, width - k :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    matchers = [grammar_matcher(r, ll_tokenizer) for r in requests]
    constrained = any(m is not None for m in matchers)
    gens = []
    for r in requests:
        if r.seed is None:
            gens.append(rng)
        else:
            g = torch.Generator(device=device)
            g.manual_seed(int(r.seed))
            gens.append(g)

    out = engine.model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    logits = out.logits[:, -1, :].float()
    cache = _cache_name()
    past = getattr(out, cache)
    next_pos = positions[:, -1:] + 1

    tokens: list[list[int]] = [[] for _ in requests]
    step_lps: list[Any] = []  # per step, the rows' logprobs [n] on the device: one host copy at the end
    row_tops: list[list[tuple[Any, Any]]] = [[] for _ in requests]
    done = [False] * n
    finish = ["length"] * n
    stop_reason: list[str | int | None] = [None] * n
    texts: list[str | None] = [None] * n
    max_new = max(r.max_tokens for r in requests)
    # rows that sample the same way (no seed, truncation, penalty or top logprobs): sampled in one call
    fast = [
        r.seed is None
        and not (r.truncated or r.penalised or r.top_logprobs)
        and engine.logprobs_mode != "processed"
        for r in requests
    ]
    temps = torch.tensor([max(r.temperature, 1e-5) for r in requests], device=device)[:, None]
    greedy = torch.tensor([r.temperature <= 1e-5 for r in requests], device=device)
    pad = torch.full((n,), engine.pad_token_id, dtype=torch.long, device=device)
    done_rows, finished = None, 0  # ``done`` on the device, rebuilt only when a row finishes
    for _step in range(max_new):
        allowed = allowed_tokens(matchers, logits.shape[-1], eos, device) if constrained else None
        if any(fast):
            step_tok, step_lp = sample_rows(logits, temps, greedy, rng, engine.logprobs_mode, allowed)
        else:
            step_tok, step_lp = pad.clone(), torch.zeros(n, device=device)
        for i, r in enumerate(requests):
            if not (done[i] or fast[i]):
                row_allowed = None if matchers[i] is None or allowed is None else allowed[i]
                tok, lp, top = sample_row(logits[i], r, gens[i], engine.logprobs_mode, row_allowed, tokens[i])
                step_tok[i], step_lp[i] = tok, lp
                if top is not None:
                    row_tops[i].append(top)
        if done_rows is not None:  # finished rows feed padding
            step_tok = torch.where(done_rows, pad, step_tok)
        step_lps.append(step_lp)
        # the one device-to-host copy per step: the sampled ids (EOS, stop strings, budgets)
        step_ids = step_tok.tolist()
        for i, r in enumerate(requests):
            if not done[i] and should_abort(r):  # cancelled: its client is gone
                done[i], finish[i] = True, "abort"
            if done[i]:
                continue
            tok = step_ids[i]
            tokens[i].append(tok)
            m = matchers[i]
            if m is not None and tok not in eos and not m.consume_token(tok):
                raise RuntimeError(f"constrained decoding went off its grammar: {m.get_error()}")
            if tok in eos:
                done[i], finish[i], stop_reason[i] = True, "stop", tok
            elif r.stop:
                text = engine.decode(tokens[i])
                hits = sorted((text.find(s), s) for s in r.stop if s and s in text)
                if hits:
                    done[i], finish[i], stop_reason[i] = True, "stop", hits[0][1]
                    texts[i] = text[: hits[0][0]]
            if not done[i] and (
                len(tokens[i]) >= r.max_tokens
                or len(r.prompt_token_ids) + len(tokens[i]) >= engine.max_context
            ):
                done[i] = True
        if all(done):
            break
        if any(done) and (done_rows is None or int(sum(done)) != finished):
            done_rows, finished = torch.tensor(done, device=device), int(sum(done))
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
        out = engine.model(
            input_ids=step_tok.unsqueeze(1),
            attention_mask=mask,
            position_ids=next_pos,
            use_cache=True,
            **{cache: past},
        )
        logits = out.logits[:, -1, :].float()
        past = getattr(out, cache)
        next_pos = next_pos + 1

    # row i's k-th token was sampled at step k: its logprob is column k
    all_lps = torch.stack(step_lps, dim=1).tolist() if step_lps else [[] for _ in requests]
    lps = [all_lps[i][: len(tokens[i])] for i in range(n)]
    tops: list[list[list[tuple[int, float]]]] = []
    for i in range(n):
        if not row_tops[i]:
            tops.append([])
            continue
        idx = torch.stack([t[0] for t in row_tops[i]]).tolist()
        vals = torch.stack([t[1] for t in row_tops[i]]).tolist()
        tops.append([list(zip(a, b, strict=True)) for a, b in zip(idx, vals, strict=True)])

    results = []
    for i, r in enumerate(requests):
        done_text = texts[i]
        text = done_text if done_text is not None else engine.decode(tokens[i])
        results.append(
            GenResult(
                prompt_token_ids=list(r.prompt_token_ids),
                token_ids=tokens[i],
                logprobs=lps[i],
                text=text,
                finish_reason=finish[i],
                top_logprobs=tops[i] if r.top_logprobs else None,
                stop_reason=stop_reason[i],
                weights_version=version,
                adapter=adapter,
            )
        )
    return results
