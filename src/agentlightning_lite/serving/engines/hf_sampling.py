"""Next-token choice for the transformers engine: sampling, reported logprobs and structured-output masks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from ..structured import ResponseFormatError, grammar, tool_names
from .base import GenRequest

__all__ = ["LogprobsMode", "allowed_tokens", "grammar_matcher", "sample_row", "sample_rows"]

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


def sample_row(
    logits: Any, req: GenRequest, gen: Any, logprobs_mode: LogprobsMode, allowed: Any = None
) -> tuple[Any, Any, tuple[Any, Any] | None]:
    """Pick the next token for one row: its id and logprob as 0-d tensors on the model's device,
    and the top alternatives as ``(ids, logprobs)`` tensors (no host copy: the caller batches them).
    ``allowed`` (bool, one per token) masks what may be sampled (structured outputs)."""
    import torch

    raw = torch.log_softmax(logits, dim=-1)
    pick = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    if req.temperature <= 1e-5:
        token = torch.argmax(pick)
        report = raw
    else:
        scaled = torch.log_softmax(logits / req.temperature, dim=-1)
        processed = scaled if allowed is None else torch.log_softmax(pick / req.temperature, dim=-1)
        if req.top_p < 1.0:
            sorted_lp, order = torch.sort(processed, descending=True)
            cum = torch.cumsum(sorted_lp.exp(), dim=-1)
            drop_sorted = (cum - sorted_lp.exp()) >= req.top_p  # keep the smallest set reaching top_p
            drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
            processed = torch.log_softmax(processed.masked_fill(drop, float("-inf")), dim=-1)
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
    """Sample every row at once (same semantics as :func:`sample_row` without top-p or seeds); the
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
