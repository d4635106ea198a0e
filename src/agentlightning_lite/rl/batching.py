"""Transitions to tensors, and the per-token log-probabilities of their responses under the model.

Prompts are left-padded and responses right-padded so every response starts at the same column:
one ``logits_to_keep`` slice then holds exactly the logits that predict the response tokens.
A merged trajectory (several calls in one sequence, see :mod:`.trajectory`) is a sample whose
"response" runs from its first call's response to its last, with a mask that keeps only the
generated tokens in the loss.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from .packing import Packed, pack_prefixes

__all__ = ["PACKABLE_MODEL_TYPES", "Sample", "TokenBatch", "collate", "forward_logprobs", "packs", "trained"]

logger = logging.getLogger(__name__)

#: models whose attention refused the packed batch's block mask: they run the plain path from then on
_UNPACKABLE: weakref.WeakSet[Any] = weakref.WeakSet()

#: the architectures (``config.model_type``) whose attention takes the packed batch's block mask and
#: gives the plain path's logprobs, checked per family (``tests/rl/test_model_families.py``); others
#: (gpt-oss's sliding windows and sinks gave other logprobs; DeepSeek-V3's attention refuses the mask)
#: run one sequence per sample
PACKABLE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "glm4_moe"})


def packs(model: Any) -> bool:
    """Whether :func:`forward_logprobs` runs ``model`` on packed shared prefixes (its architecture is in
    :data:`PACKABLE_MODEL_TYPES` and its attention has not refused the mask)."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) in PACKABLE_MODEL_TYPES and model not in _UNPACKABLE


#: most bytes of float32 logits that :func:`forward_logprobs` materialises at once (one chunk)
LOGITS_CHUNK_BYTES = 32 * 2**20


@dataclass
class Sample:
    """One policy call ready for the update, or several calls of one episode merged into one sequence.

    A merged sample (``parts`` set) holds its calls in order: ``response_ids`` runs from the first
    call's response to the last one's, ``offsets[k]`` is where call ``k``'s response starts in it,
    and the tokens between two responses (tool outputs, new user turns) are context only: the
    per-token views below give them mask 0, and each call's response keeps its own reward,
    advantage, temperature and engine logprobs.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    engine_logprobs: list[float] | None
    reward: float
    group: Any
    temperature: float = 1.0
    advantage: float = 0.0
    rollout_id: str = ""
    index: int = 0
    agent: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    parts: list[Sample] | None = None
    offsets: list[int] | None = None

    @property
    def num_segments(self) -> int:
        """How many calls this sample trains (1 for a single call)."""
        return len(self.parts) if self.parts else 1

    def _per_token(self, one: Any) -> list[Any]:
        """Build a per-token list: ``one(call)`` is the call's value(s) on its own response tokens."""
        if not self.parts:
            return list(one(self))
        out: list[Any] = [None] * len(self.response_ids)
        for part, start in zip(self.parts, self.offsets or [], strict=True):
            out[start : start + len(part.response_ids)] = one(part)
        return out

    def token_mask(self) -> list[float]:
        """1.0 on generated tokens (trained), 0.0 on the context between calls.

        >>> a = Sample([1], [2, 3], None, 1.0, "g")
        >>> b = Sample([1, 2, 3, 9], [4], None, 0.0, "g")
        >>> Sample([1], [2, 3, 9, 4], None, 0.0, "g", parts=[a, b], offsets=[0, 3]).token_mask()
        [1.0, 1.0, 0.0, 1.0]
        """
        return [0.0 if v is None else 1.0 for v in self._per_token(lambda c: [1.0] * len(c.response_ids))]

    def token_segments(self) -> list[int]:
        """Which call (1, 2, ...) each response token belongs to; 0 on the context between calls."""
        if not self.parts:
            return [1] * len(self.response_ids)
        seg = [0] * len(self.response_ids)
        for k, (part, start) in enumerate(zip(self.parts, self.offsets or [], strict=True), 1):
            seg[start : start + len(part.response_ids)] = [k] * len(part.response_ids)
        return seg

    def token_advantages(self) -> list[float]:
        """Each trained token's advantage: its call's (0.0 on context)."""
        return [v or 0.0 for v in self._per_token(lambda c: [c.advantage] * len(c.response_ids))]

    def token_rewards(self) -> list[float]:
        """Each call's reward on its last response token, 0.0 elsewhere (what PPO's GAE reads)."""
        return [
            v or 0.0
            for v in self._per_token(
                lambda c: [0.0] * (len(c.response_ids) - 1) + [c.reward] if c.response_ids else []
            )
        ]

    def token_temperatures(self) -> list[float]:
        """The sampling temperature of each response token's call (1.0 on context)."""
        return [
            1.0 if v is None else v
            for v in self._per_token(
                lambda c: [c.temperature if c.temperature > 0 else 1.0] * len(c.response_ids)
            )
        ]

    def token_engine_logprobs(self) -> list[float] | None:
        """The engine's logprob of each response token (0.0 on context), or None when one is missing."""
        calls = self.parts or [self]
        if any(c.engine_logprobs is None for c in calls):
            return None
        return [v or 0.0 for v in self._per_token(lambda c: list(c.engine_logprobs or []))]


def trained(samples: Sequence[Sample]) -> list[Sample]:
    """The samples the loss trains: all but those masked (``meta["masked"]``: a reply cut at
    ``max_tokens`` under ``SampleConfig(truncated="mask")``; they still count in GRPO's group baseline).

    >>> cut = Sample([1], [2], None, 0.0, "g", meta={"masked": True})
    >>> len(trained([Sample([1], [2], None, 1.0, "g"), cut]))
    1
    """
    return [s for s in samples if not s.meta.get("masked")]


@dataclass
class TokenBatch:
    """Padded tensors for a list of samples (``R`` = longest response)."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    position_ids: torch.Tensor  # [B, P + R]
    response_ids: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R], 1 on generated (trained) response tokens
    temperature: torch.Tensor  # [B]
    response_len: int
    token_temperature: torch.Tensor | None = None  # [B, R] when a merged sample mixes temperatures
    segment_ids: torch.Tensor | None = None  # [B, R]: which call of the row, 0 on padding/context
    #: the same samples with their shared prefixes packed (:mod:`.packing`), or ``None``
    packed: Packed | None = None

    @property
    def model_tokens(self) -> int:
        """The tokens the model computes for this batch: packed, or every sample's own (unpadded)."""
        return self.packed.tokens if self.packed is not None else int(self.attention_mask.sum())

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.position_ids.to(device),
            self.response_ids.to(device),
            self.response_mask.to(device),
            self.temperature.to(device),
            self.response_len,
            None if self.token_temperature is None else self.token_temperature.to(device),
            None if self.segment_ids is None else self.segment_ids.to(device),
            None if self.packed is None else self.packed.to(device),
        )


def collate(samples: Sequence[Sample], pad_id: int, share_prefix: bool = False) -> TokenBatch:
    """Left-pad prompts and right-pad responses into one :class:`TokenBatch`.

    Merged samples bring their own mask (context between calls is 0), per-token temperatures and
    segment ids; for single calls these are all-ones, the call's temperature and 1. With
    ``share_prefix`` the samples that share a prefix are also packed (:func:`.packing.pack_prefixes`):
    :func:`forward_logprobs` then runs each shared prefix once.
    """
    p_max = max(len(s.prompt_ids) for s in samples)
    r_max = max(max(len(s.response_ids) for s in samples), 1)
    b = len(samples)
    input_ids = torch.full((b, p_max + r_max), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_max + r_max), dtype=torch.long)
    resp = torch.full((b, r_max), pad_id, dtype=torch.long)
    rmask = torch.zeros((b, r_max), dtype=torch.float32)
    segs = torch.zeros((b, r_max), dtype=torch.long)
    merged = any(s.parts for s in samples)
    tok_temps = torch.ones((b, r_max), dtype=torch.float32) if merged else None
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, p_max - p : p_max] = torch.tensor(s.prompt_ids, dtype=torch.long)
        attn[i, p_max - p : p_max] = 1
        if r:
            input_ids[i, p_max : p_max + r] = torch.tensor(s.response_ids, dtype=torch.long)
            attn[i, p_max : p_max + r] = 1
            resp[i, :r] = torch.tensor(s.response_ids, dtype=torch.long)
            rmask[i, :r] = torch.tensor(s.token_mask())
            segs[i, :r] = torch.tensor(s.token_segments(), dtype=torch.long)
            if tok_temps is not None:
                tok_temps[i, :r] = torch.tensor(s.token_temperatures())
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    temps = torch.tensor([s.temperature if s.temperature > 0 else 1.0 for s in samples], dtype=torch.float32)
    packed = (
        pack_prefixes([s.prompt_ids for s in samples], [s.response_ids for s in samples], r_max, pad_id)
        if share_prefix and len(samples) > 1
        else None
    )
    return TokenBatch(input_ids, attn, position_ids, resp, rmask, temps, r_max, tok_temps, segs, packed)


def forward_logprobs(
    model: Any,
    batch: TokenBatch,
    value_head: Any = None,
    autocast_dtype: torch.dtype | None = None,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities ``[B, R]`` of the response tokens, ``log_softmax(logits / T)``.

    With ``value_head``, also the values ``[B, R]`` at the same positions (the state before each
    response token). Gradients flow unless the caller wraps this in ``torch.no_grad()``.

    The full-vocabulary logits are never held for the whole batch: the model runs to its last hidden
    state, then the output layer, ``log_softmax`` and the gather run on ``chunk_tokens`` positions at a
    time (by default as many as fit :data:`LOGITS_CHUNK_BYTES` of float32 logits), and only on the
    trained positions (``response_mask`` 1; the others get 0.0). With gradients each chunk is
    checkpointed: its logits are freed after the forward and recomputed in the backward, one chunk at
    a time, as fused linear-cross-entropy kernels do on GPUs. The numbers are those of the full
    ``logits`` path (same operations per row). Models whose heads scale or cap the logits after the
    output layer (Gemma 2's soft-capping, Cohere's ``logit_scale``, Granite's ``logits_scaling``) take
    that full path.
    """
    r = batch.response_len
    ctx = (
        torch.autocast(device_type=batch.input_ids.device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else nullcontext()
    )
    split = _decoder_and_head(model)
    if split is None:
        return _forward_logprobs_full(model, batch, value_head, ctx)
    decoder, head = split
    packed = batch.packed if packs(model) else None
    with ctx:
        out = None
        if packed is not None:  # each shared prefix once, under a block mask (see .packing)
            impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
            dtype = next(decoder.parameters()).dtype
            try:
                out = decoder(
                    input_ids=packed.input_ids,
                    attention_mask=packed.attention_mask(dtype, impl),
                    position_ids=packed.position_ids,
                    use_cache=False,
                )
            except RuntimeError as exc:  # an attention that takes no custom 4D mask: the plain path
                _UNPACKABLE.add(model)
                logger.warning(
                    "%s does not run shared prefixes under a block mask (%s): this model's updates run one "
                    "sequence per sample (UpdateConfig(share_prefix=False) says so up front)",
                    type(model).__name__,
                    str(exc).splitlines()[0][:200],
                )
                packed = None
        if out is None:
            out = decoder(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            )
    if packed is None:
        hidden = out.last_hidden_state[:, -(r + 1) : -1, :]  # [B, R, H]: the states that predict each token
    else:
        hidden = out.last_hidden_state[packed.row[:, None], packed.pos]  # [B, R, H], gathered
    keep = batch.response_mask > 0
    if not bool(keep.any()):
        keep = torch.ones_like(keep)  # nothing trained: score every position so a graph still exists
    temps = (
        batch.token_temperature
        if batch.token_temperature is not None
        else batch.temperature[:, None].expand(-1, r)
    )
    h, targets, t = hidden[keep], batch.response_ids[keep], temps[keep]
    n_vocab = int(getattr(head, "out_features", 0) or getattr(head.weight, "shape", [1])[0])
    step = chunk_tokens or max(1, LOGITS_CHUNK_BYTES // (4 * max(n_vocab, 1)))
    grad = torch.is_grad_enabled()
    parts = []
    for i in range(0, h.shape[0], step):
        args = (head, h[i : i + step], targets[i : i + step], t[i : i + step], autocast_dtype)
        if grad:
            parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(*args))
    logp = torch.zeros(keep.shape, dtype=torch.float32, device=hidden.device).index_put(
        (keep,), torch.cat(parts)
    )
    values = None
    if value_head is not None:
        values = value_head(hidden.float())
    return logp, values


def _chunk_logprobs(
    head: Any, h: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor, autocast_dtype: torch.dtype | None
) -> torch.Tensor:
    """``log_softmax(head(h) / T)`` at ``targets`` for one chunk of positions (``[N]``)."""
    ctx = torch.autocast(device_type=h.device.type, dtype=autocast_dtype) if autocast_dtype else nullcontext()
    with ctx:
        logits = head(h)
    logits = logits.float() / temps[:, None]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def _decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """The model's decoder (to its last hidden state) and output layer, or ``None`` when the logits
    are more than ``head(hidden)`` (or the model does not expose the two)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None
    if getattr(cfg, "logits_scaling", 1.0) not in (None, 1, 1.0):
        return None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError, ValueError):
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if decoder is None or head is None or decoder is model or decoder is base:
        return None
    if not hasattr(head, "weight"):
        return None
    return decoder, head


def _forward_logprobs_full(
    model: Any, batch: TokenBatch, value_head: Any, ctx: Any
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The whole-batch path: the model's own logits for every response position at once."""
    r = batch.response_len
    with ctx:
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=r + 1,
            output_hidden_states=value_head is not None,
            use_cache=False,
        )
    logits = out.logits[:, :-1, :].float()  # [B, R, V]: the logits that predict each response token
    if batch.token_temperature is not None:
        logits = logits / batch.token_temperature[:, :, None]
    else:
        logits = logits / batch.temperature[:, None, None]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, batch.response_ids[..., None]).squeeze(-1)
    values = None
    if value_head is not None:
        hidden = out.hidden_states[-1][:, -(r + 1) : -1, :].float()
        values = value_head(hidden)
    return logp, values


def micro_batches(
    samples: Sequence[Sample], most: int, max_tokens: int, share_prefix: bool = False
) -> list[list[Sample]]:
    """Split samples (in order) so each chunk has at most ``most`` samples and ``max_tokens`` tokens:
    padded (one row per sample), or with ``share_prefix`` the prompt of consecutive samples that share
    it counted once (what :mod:`.packing` runs).

    >>> s = [Sample([1] * 100, [2] * 10, None, 0.0, "g") for _ in range(4)]
    >>> [len(c) for c in micro_batches(s, 8, 300)], [len(c) for c in micro_batches(s, 8, 300, True)]
    ([2, 2], [4])
    """
    chunks: list[list[Sample]] = []
    cur: list[Sample] = []
    p_max = r_max = 0
    packed = 0  # tokens of the chunk with shared prompts counted once
    for s in samples:
        p, r = max(p_max, len(s.prompt_ids)), max(r_max, len(s.response_ids))
        shared = bool(cur) and cur[-1].prompt_ids == s.prompt_ids
        add = len(s.response_ids) + (0 if shared else len(s.prompt_ids))
        over = packed + add > max_tokens if share_prefix else (len(cur) + 1) * (p + r) > max_tokens
        if cur and (len(cur) >= most or over):
            chunks.append(cur)
            cur, p, r = [], len(s.prompt_ids), len(s.response_ids)
            packed, add = 0, len(s.prompt_ids) + len(s.response_ids)
        cur.append(s)
        p_max, r_max = p, r
        packed += add
    if cur:
        chunks.append(cur)
    return chunks
