"""Tinker sampling on the project's engine: ``SamplingParams`` turned into engine requests, and the
engine's results into Tinker's sequences (tokens with the stop token, their logprobs, the stop reason).

Stopping: the engine always ends a sample at the model's end-of-sequence tokens. ``stop=None`` is
that; stop strings are honoured besides (the returned tokens include the ones that spelled the stop
string); stop token ids must be end-of-sequence ids. ``stop=[]`` (no stopping at all, not even at
EOS) and other stop token ids are refused with an error naming them.

>>> request_settings({"max_tokens": 4, "temperature": 0.5, "top_k": -1, "stop": ["\\n"]}, eos={2})
{'max_tokens': 4, 'temperature': 0.5, 'top_p': 1.0, 'top_k': 0, 'stop': ['\\n'], 'seed': None}
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from ..serving.engines.base import GenRequest, GenResult
from .backend import SampledSequence
from .futures import OpError

__all__ = ["DEFAULT_MAX_TOKENS", "gen_requests", "request_settings", "sequences_of"]

#: the ``max_tokens`` of a request that gives none
DEFAULT_MAX_TOKENS = 256


def _number(params: dict[str, Any], name: str, default: float) -> float:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OpError(f"sampling_params.{name} must be a number, got {value!r}")
    return float(value)


def _stops(stop: Any, eos: Collection[int]) -> list[str]:
    """The stop strings of Tinker's ``stop`` (``None``, a string, strings or token ids)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, list):
        raise OpError(
            f"sampling_params.stop must be a string, a list of strings or of token ids, got {stop!r}"
        )
    if not stop:
        raise OpError(
            "sampling_params.stop=[] (no stopping, not even at end-of-sequence) is not supported: this "
            f"server's engine always stops at the end-of-sequence tokens {sorted(eos)}; pass stop=None"
        )
    if all(isinstance(s, str) for s in stop):
        return list(stop)
    if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        other = sorted(set(stop) - set(eos))
        if other:
            raise OpError(
                f"stop token ids {other} are not end-of-sequence tokens of the model ({sorted(eos)}): this "
                "server stops on end-of-sequence tokens and stop strings only (pass the token's text as a "
                "stop string)"
            )
        return []
    raise OpError(f"sampling_params.stop mixes strings and token ids: {stop!r}")


def request_settings(params: Any, eos: Collection[int], max_context: int | None = None) -> dict[str, Any]:
    """Engine request settings for Tinker ``SamplingParams`` (a JSON object); clear errors for bad ones."""
    if not isinstance(params, dict):
        raise OpError(f"sampling_params must be an object, got {type(params).__name__}")
    max_tokens = params.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS if max_context is None else min(DEFAULT_MAX_TOKENS, max_context)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise OpError(f"sampling_params.max_tokens must be an integer >= 1, got {max_tokens!r}")
    temperature = _number(params, "temperature", 1.0)
    if temperature < 0:
        raise OpError(f"sampling_params.temperature must be >= 0, got {temperature}")
    top_p = _number(params, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise OpError(f"sampling_params.top_p must be in (0, 1], got {top_p}")
    top_k = int(_number(params, "top_k", -1))
    seed = params.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise OpError(f"sampling_params.seed must be an integer, got {seed!r}")
    return {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": 0 if top_k < 0 else top_k,
        "stop": _stops(params.get("stop"), eos),
        "seed": seed,
    }


def gen_requests(
    prompt: Sequence[int], settings: dict[str, Any], num_samples: int, adapter: str | None
) -> list[GenRequest]:
    """One engine request per sample; with a seed, sample ``i`` is seeded ``seed + i`` (the samples
    differ, and the same request gives the same samples again)."""
    seed = settings["seed"]
    out = []
    for i in range(num_samples):
        options = {**settings, "seed": None if seed is None else seed + i}
        out.append(GenRequest(prompt_token_ids=list(prompt), adapter=adapter, **options))
    return out


def sequences_of(results: Sequence[GenResult]) -> list[SampledSequence]:
    """Tinker sequences of engine results (an aborted generation is an error)."""
    out = []
    for r in results:
        if r.finish_reason not in ("stop", "length"):
            raise OpError(f"a sample ended with {r.finish_reason!r} (stopped before it finished)", "server")
        out.append(
            SampledSequence(
                list(r.token_ids), [float(x) for x in r.logprobs], r.finish_reason, r.weights_version
            )
        )
    return out
