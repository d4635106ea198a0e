"""Next-token choice for the transformers engine: sampling, reported logprobs and structured-output masks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from ..structured import ResponseFormatError, grammar, tool_names
from .base import GenRequest

__all__ = [
    "LogprobsMode",
    "allowed_tokens",
    "grammar_matcher",
    "penalise",
    "sample_row",
    "sample_rows",
    "truncate",
]

LogprobsMode = Literal["scaled", "raw", "processed"]


def grammar_matcher(req: GenRequest, ll_tokenizer: Callable[[], Any]) -> Any:
    """An llguidance matcher for a request with a ``response_format`` (``None`` without one);
    ``ll_tokenizer`` builds (once) the engine's llguidance tokenizer."""
    if req.response_format is None:
        return None
    import llguidance

    m = llguidance.LLMatcher(ll_tokenizer(), grammar(req.response_format, tool_names(req.tools)), log_level=0)
    if m.is_error():
        raise ResponseFormatError(f"'response_format' cannot be enforced: {m.get_error()}")
    return m


def allowed_tokens(matchers: Sequence[Any], width: int, eos: Iterable[int], device: Any) -> Any:
    """The tokens each row may sample next ([n, width] bool; all for unconstrained rows)."""
    import numpy as np
    import torch

    rows = []
    for m in matchers:
        if m is None:
            rows.append(np.ones(width, dtype=bool))
            continue
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
        row = bits[:width].astype(bool)
        if len(row) < width:
            row = np.concatenate([row, np.zeros(width - len(row), dtype=bool)])
        if not row.any():  # cannot happen for a valid grammar; end the reply rather than sample noise
            row[sorted(eos)[0]] = True
        rows.append(row)
    return torch.from_numpy(np.stack(rows)).to(device)


def penalise(logits: Any, req: GenRequest, prompt: Sequence[int], reply: Sequence[int]) -> Any:
    """``logits`` with ``req``'s penalties applied as vLLM applies them: ``repetition_penalty`` to the
    tokens of the prompt and the reply so far (positive logits divided by it, negative ones
    multiplied), then ``frequency_penalty`` times each token's count in the reply and
    ``presence_penalty`` once for each token the reply holds, subtracted.

    >>> import torch
    >>> req = GenRequest([0], presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    >>> penalise(torch.tensor([1.0, -1.0, 1.0, 1.0]), req, prompt=[0], reply=[1, 1]).tolist()
    [0.5, -3.0, 1.0, 1.0]
    """
    import torch

    if not req.penalised:
        return logits
    out = logits.clone()
    if req.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({*prompt, *reply}), dtype=torch.long, device=logits.device)
        vals = out[seen]
        out[seen] = torch.where(vals > 0, vals / req.repetition_penalty, vals * req.repetition_penalty)
    if reply and (req.frequency_penalty or req.presence_penalty):
        ids = torch.tensor(list(reply), dtype=torch.long, device=logits.device)
        counts = torch.bincount(ids, minlength=out.shape[-1])[: out.shape[-1]].to(out.dtype)
        out = out - req.frequency_penalty * counts - req.presence_penalty * (counts > 0).to(out.dtype)
    return out


def truncate(processed: Any, req: GenRequest) -> Any:
    """Log-probabilities ``processed`` cut to ``req``'s min-p, then top-k and top-p, renormalised (the
    order of vLLM's sampler: min-p is a logits processor applied before its top-k/top-p sampler)."""
    import torch

    if req.min_p > 0.0:
        floor = processed.max() + torch.log(torch.tensor(req.min_p, dtype=processed.dtype))
        processed = torch.log_softmax(processed.masked_fill(processed < floor, float("-inf")), dim=-1)
    if req.top_k > 0 and req.top_k < processed.shape[-1]:
        kth = torch.topk(processed, req.top_k).values[-1]
        processed = torch.log_softmax(processed.masked_fill(processed < kth, float("-inf")), dim=-1)
    if req.top_p < 1.0:
        sorted_lp, order = torch.sort(processed, descending=True)
        cum = torch.cumsum(sorted_lp.exp(), dim=-1)
        drop_sorted = (cum - sorted_lp.exp()) >= req.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        processed = torch.log_softmax(processed.masked_fill(drop, float("-inf")), dim=-1)
    return processed


def sample_row(
    logits: Any,
    req: GenRequest,
    gen: Any,
    logprobs_mode: LogprobsMode,
    allowed: Any = None,
    reply: Sequence[int] = (),
) -> tuple[Any, Any, tuple[Any, Any] | None]:
    """Pick the next token for one row: its id and logprob as 0-d tensors on the model's device,
    and the top alternatives as ``(ids, logprobs)`` tensors (no host copy: the caller batches them).
    ``allowed`` (bool, one per token) masks what may be sampled (structured outputs); ``reply``: the
    tokens sampled so far (for the penalties). Raw and scaled logprobs are the model's own (what a
    trainer recomputes), before the penalties, the mask and the truncation; processed ones are of the
    distribution sampled from."""
    import torch

    raw = torch.log_softmax(logits, dim=-1)
    shaped = penalise(logits, req, req.prompt_token_ids, reply)
    pick = shaped if allowed is None else shaped.masked_fill(~allowed, float("-inf"))
    if req.temperature <= 1e-5:
        token = torch.argmax(pick)
        report = raw
    else:
        scaled = torch.log_softmax(logits / req.temperature, dim=-1)
        processed = scaled if pick is logits else torch.log_softmax(pick / req.temperature, dim=-1)
        processed = truncate(processed, req)
        token = torch.multinomial(processed.exp(), 1, generator=gen)[0]
        report = {"scaled": scaled, "raw": raw, "processed": processed}[logprobs_mode]
    top = None
    if req.top_logprobs:
        vals, idx = torch.topk(report, req.top_logprobs)
        top = (idx, vals)
    return token, report[token], top


def sample_rows(
    logits: Any, temps: Any, greedy: Any, rng: Any, logprobs_mode: LogprobsMode, allowed: Any = None
) -> tuple[Any, Any]:
    """Sample every row at once (same semantics as :func:`sample_row` for rows without seeds,
    penalties or truncation: no top-k, top-p or min-p); the
    token ids and their logprobs stay on the model's device."""
    import torch

    raw = torch.log_softmax(logits, dim=-1)
    scaled = torch.log_softmax(logits / temps, dim=-1)
    pick = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    probs = scaled.exp() if allowed is None else torch.softmax(pick / temps, dim=-1)
    sampled = torch.multinomial(probs, 1, generator=rng).squeeze(-1)
    tokens = torch.where(greedy, torch.argmax(pick, dim=-1), sampled)
    report = torch.where(greedy[:, None], raw, raw if logprobs_mode == "raw" else scaled)
    lps = report.gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, lps
