"""The inference servers as the HTTP engine sees them: each server's state, the error a failed request
raises, the sampling settings sent, the adapter directories they load, and the checks and parsing
of the servers' answers."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .base import GenRequest, GenResult
from .contract import BackendError  # defined with the engine contract; importable from here too

__all__ = ["Backend", "BackendError", "adapter_directory", "check_answer", "completion_result"]
__all__ += ["prompt_logprobs_of", "sampling_settings", "write_adapter"]


def sampling_settings(req: GenRequest) -> dict[str, Any]:
    """Every sampling setting of ``req``, named in each request, so that a server's defaults (vLLM takes
    them from the model's ``generation_config.json``: Qwen2.5 asks for top_k 20 and repetition_penalty
    1.05) do not change the distribution sampled from: the request's own values, neutral unless the
    agent asked otherwise, shape it, as on the HF engine.

    >>> sampling_settings(GenRequest([1], temperature=0.7))["top_k"]  # vLLM: 0 (or -1) disables top-k
    0
    """
    return {
        "temperature": float(req.temperature),
        "top_p": float(req.top_p),
        "top_k": int(req.top_k),
        "min_p": float(req.min_p),
        "repetition_penalty": float(req.repetition_penalty),
        "presence_penalty": float(req.presence_penalty),
        "frequency_penalty": float(req.frequency_penalty),
    }


@dataclass
class Backend:
    """One inference server, as the engine tracks it."""

    url: str
    in_flight: int = 0
    dead_since: float | None = None
    error: str = ""
    loaded: set[str] = field(default_factory=set)  # adapter version names loaded on this server
    lock: asyncio.Lock | None = None  # serialises adapter loading (created on the engine's loop)


def check_answer(b: Backend, path: str, r: Any) -> None:
    """Raise a :class:`BackendError` when server ``b`` answered ``path`` with an HTTP error."""
    if r.status_code >= 400:
        try:
            err = r.json().get("error")
            detail = err.get("message") if isinstance(err, dict) else err
        except (ValueError, AttributeError):
            detail = r.text[:500]
        raise BackendError(
            f"inference server {b.url} answered {r.status_code} to {path}: {detail}",
            r.status_code,
            path,
            str(detail),
        )


def completion_result(
    b: Backend, req: GenRequest, data: dict[str, Any], version: int, adapter: str | None
) -> GenResult:
    """The :class:`GenResult` of a ``/v1/completions`` answer ``data`` from server ``b``."""
    try:
        c = data["choices"][0]
        token_ids = [int(t) for t in c["token_ids"]]
        lp = c.get("logprobs") or {}
        logprobs = [float(x) for x in lp.get("token_logprobs") or []]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BackendError(
            f"inference server {b.url} answered /v1/completions without token ids and logprobs "
            f"(does it support return_token_ids? vLLM 0.10.2 or later does): {exc!r}"
        ) from None
    if len(logprobs) != len(token_ids):
        raise BackendError(
            f"inference server {b.url} returned {len(logprobs)} logprobs for {len(token_ids)} tokens"
        )
    tops = None
    if req.top_logprobs:
        tops = [
            sorted(
                ((int(str(t).removeprefix("token_id:")), float(v)) for t, v in (row or {}).items()),
                key=lambda kv: -kv[1],
            )[: req.top_logprobs]
            for row in lp.get("top_logprobs") or []
        ]
    finish = c.get("finish_reason")
    return GenResult(
        prompt_token_ids=[int(t) for t in c.get("prompt_token_ids") or req.prompt_token_ids],
        token_ids=token_ids,
        logprobs=logprobs,
        text=c.get("text") or "",
        finish_reason=finish if finish in ("stop", "length", "abort") else "stop",
        top_logprobs=tops,
        stop_reason=c.get("stop_reason"),
        weights_version=version,
        adapter=adapter,
    )


def prompt_logprobs_of(b: Backend, prompt: list[int], data: dict[str, Any]) -> list[float | None]:
    """The logprob of each prompt token from a ``/v1/completions`` answer asked for
    ``prompt_logprobs`` (vLLM: per position ``None`` or ``{token id: {"logprob": ...}}``, the prompt's
    own token among the keys).

    >>> row = {"15": {"logprob": -2.5, "rank": 3}}
    >>> prompt_logprobs_of(Backend("http://h"), [1, 15], {"choices": [{"prompt_logprobs": [None, row]}]})
    [None, -2.5]
    """
    try:
        rows = data["choices"][0]["prompt_logprobs"]
        if not isinstance(rows, list) or len(rows) != len(prompt):
            raise ValueError(
                f"{0 if not isinstance(rows, list) else len(rows)} rows for {len(prompt)} tokens"
            )
        out: list[float | None] = [None]
        for token, row in zip(prompt[1:], rows[1:], strict=True):
            entry = row.get(str(token)) or row.get(f"token_id:{token}")
            out.append(float(entry["logprob"] if isinstance(entry, dict) else entry))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise BackendError(
            f"inference server {b.url} answered /v1/completions without the prompt's logprobs "
            f"(prompt_logprobs, as vLLM returns them): {exc!r}"
        ) from None
    return out


def adapter_directory(path: str) -> str:
    """``path`` made absolute, once it is known to be a peft adapter directory (the servers load it)."""
    path = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise FileNotFoundError(f"{path} is not a peft adapter directory (no adapter_config.json)")
    return path


def write_adapter(state: Mapping[str, Any], path: str, config_from: str) -> str:
    """Write the adapter state dict ``state`` to directory ``path``, beside a copy of the config of the
    adapter directory ``config_from``; returns ``path``."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    shutil.copy(os.path.join(config_from, "adapter_config.json"), path)
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in state.items()},
        os.path.join(path, "adapter_model.safetensors"),
    )
    return path
