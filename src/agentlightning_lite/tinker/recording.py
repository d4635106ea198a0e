"""The Tinker server's record in a store, like any other run's: each training model is a rollout whose
spans are its operations (``forward_backward``, ``forward``, ``optim_step``, saves and loads, with their
metrics: ``loss:sum``, ``grad_norm``, ``learning_rate``, the engine's weight version), and each
``sample`` call is a rollout with one ``llm`` span per sample (the prompt's and the sample's token ids,
the sample's logprobs). ``agl-lite runs``, ``agl-lite show`` and the UI read them.

An operation that fails is recorded too (an ``error`` span naming the cause); a write to the store that
fails is logged and counted (``recorder.failed_writes``), never raised into the client's operation.

>>> import agentlightning_lite as agl
>>> rec = Recorder(agl.MemoryStore())
>>> rid = rec.training_model("s:train:0", "tiny", 4, session="s")
>>> rec.training_op("s:train:0", "optim_step", 0.0, {"grad_norm": 0.5})
>>> [s.name for s in rec.store.spans(rid)]
['optim_step']
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..ids import new_span_id
from ..store.base import Store
from ..types import Span
from .backend import SampledSequence

__all__ = ["Recorder"]

logger = logging.getLogger(__name__)

SOURCE = "tinker"  #: ``metadata["source"]`` of every rollout the server records


class Recorder:
    """Write the Tinker server's training models and samples into ``store`` (thread-safe)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.failed_writes = 0  #: store writes that failed (each logged)
        self._rollouts: dict[str, str] = {}  # model id -> its rollout id
        self._sessions: dict[str, str] = {}  # model id -> its session id
        self._lock = threading.Lock()

    def _write(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except Exception:
            with self._lock:
                self.failed_writes += 1
            logger.exception("Tinker server: could not record %s in the store", what)
            return None

    # -- training -------------------------------------------------------------------------------
    def training_model(self, model_id: str, base_model: str, lora_rank: int, session: str) -> str | None:
        """Open the rollout of a new training model; its id (``None`` when the store failed)."""
        task = {"tinker_model_id": model_id, "base_model": base_model, "lora_rank": lora_rank}
        meta = {"source": SOURCE, "tinker.kind": "training", "tinker.session_id": session}
        rid = self._write("a training model", self.store.open_rollout, task, mode="trace", metadata=meta)
        if rid is not None:
            with self._lock:
                self._rollouts[model_id] = rid
                self._sessions[model_id] = session
        return rid

    def training_rollout(self, model_id: str) -> str | None:
        """The rollout id of a training model (``None``: not recorded)."""
        with self._lock:
            return self._rollouts.get(model_id)

    def training_op(
        self,
        model_id: str,
        name: str,
        start: float,
        attributes: dict[str, Any],
        error: str | None = None,
    ) -> None:
        """Record one operation of a training model (``error``: it failed, and why)."""
        rid = self.training_rollout(model_id)
        if rid is None:
            return
        span = Span(
            span_id=new_span_id(),
            rollout_id=rid,
            kind="custom",
            name=name,
            start_time=start,
            end_time=time.time(),
            status="error" if error is not None else "ok",
            error=error,
            attributes={"server": SOURCE, "tinker.model_id": model_id, **attributes},
        )
        self._write(f"the {name} of {model_id}", self.store.add_span, span)

    def finish_session(self, session: str, ok: bool, detail: str | None = None) -> None:
        """Close the rollouts of ``session``'s training models (``ok``: the client finished it with
        success; otherwise they are ``failed`` with ``detail``)."""
        with self._lock:
            ids = [m for m, s in self._sessions.items() if s == session]
            rids = [self._rollouts.pop(m) for m in ids]
            for m in ids:
                self._sessions.pop(m)
        for rid in rids:
            status, error = (
                ("succeeded", None) if ok else ("failed", detail or "the client ended the session")
            )
            self._write(
                "a session's end",
                self.store.close_rollout,
                rid,
                status=status,
                error=error,
                only_if_running=True,
            )
        self._write("a flush", self.store.flush)

    def close(self) -> None:
        """Close the rollouts still open (the server stopped before their session finished)."""
        with self._lock:
            rids = list(self._rollouts.values())
            self._rollouts.clear()
            self._sessions.clear()
        for rid in rids:
            self._write(
                "the server's stop",
                self.store.close_rollout,
                rid,
                status="failed",
                error="the Tinker server stopped before the client finished its session",
                only_if_running=True,
            )
        self._write("a flush", self.store.flush)

    # -- sampling -------------------------------------------------------------------------------
    def sample(
        self,
        start: float,
        prompt: Sequence[int],
        params: Any,
        info: dict[str, Any],
        sequences: Sequence[SampledSequence] = (),
        prompt_logprobs: Sequence[float | None] | None = None,
        error: str | None = None,
    ) -> str | None:
        """Record one ``sample`` call as a rollout: an ``llm`` span per sequence with its token ids and
        logprobs (one ``error`` span when the call failed); its rollout id."""
        meta = {"source": SOURCE, "tinker.kind": "sample", **{f"tinker.{k}": v for k, v in info.items()}}
        rid = self._write(
            "a sample call",
            self.store.open_rollout,
            {"prompt_token_ids": list(prompt)},
            mode="trace",
            metadata=meta,
        )
        if rid is None:
            return None
        common = {"server": SOURCE, "params": params, **info}
        spans = [
            Span(
                span_id=new_span_id(),
                rollout_id=rid,
                kind="llm",
                name="sample",
                start_time=start,
                end_time=time.time(),
                model=info.get("base_model"),
                attributes={
                    **common,
                    "choice_index": i,
                    "stop_reason": s.stop_reason,
                    "weights_version": s.weights_version,
                    **({"prompt_logprobs": list(prompt_logprobs)} if prompt_logprobs is not None else {}),
                },
                prompt_token_ids=list(prompt),
                response_token_ids=list(s.tokens),
                response_logprobs=list(s.logprobs),
            )
            for i, s in enumerate(sequences)
        ]
        if error is not None:
            spans.append(
                Span(
                    span_id=new_span_id(),
                    rollout_id=rid,
                    kind="llm",
                    name="sample",
                    start_time=start,
                    end_time=time.time(),
                    status="error",
                    error=error,
                    model=info.get("base_model"),
                    attributes=common,
                    prompt_token_ids=list(prompt),
                )
            )
        self._write("the samples", self.store.add_spans, spans)
        status = "failed" if error is not None else "succeeded"
        self._write("a sample call's end", self.store.close_rollout, rid, status=status, error=error)
        return rid
