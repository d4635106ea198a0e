"""The transformers engine: continuously batched generation with exact per-token logprobs, CPU or GPU,
with LoRA; a trainer can update the (optionally peft-wrapped) model in place between steps."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ... import models
from ..structured import ResponseFormat, ResponseFormatError, grammar, ll_tokenizer, tool_names
from .base import GenRequest, GenResult
from .batching import BatchingEngine, Item
from .cpu_precision import cpu_autocast
from .hf_adapters import HFAdapters
from .hf_decode import DecodeCounters, RowBatch, decode_batch
from .hf_kvcache import PrefixCache
from .hf_sampling import LogprobsMode
from .hf_scheduler import ContinuousBatching

__all__ = ["HFEngine"]


#: the counters of :attr:`HFEngine.stats` added to every engine's, from :class:`DecodeCounters`
_WORK = {
    "prefill_tokens": "prefill_tokens",
    "prefill_passes": "prefill_passes",
    "decode_tokens": "decode_tokens",
    "decode_steps": "decode_steps",
    "prefix_cache_hits": "prefix_hits",
    "prefill_tokens_saved": "prefill_tokens_saved",
}


class HFEngine(ContinuousBatching, HFAdapters, BatchingEngine):
    """Serve a transformers causal LM: ``HFEngine("smollm2-135m")``, any Hugging Face id or local path.

    Args:
        model: a name from :mod:`agentlightning_lite.models`, a Hugging Face id, a local directory
            or ``.gguf`` file, or an already loaded ``PreTrainedModel`` (then pass ``tokenizer``).
        lora: ``None``; a directory holding a peft adapter (loaded trainable); a
            ``peft.LoraConfig`` (a fresh adapter is attached); or an object with
            ``to_peft_config()``.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``...
        dtype: ``"auto"`` (float32 on CPU, bfloat16 on CUDA), a ``torch.dtype`` or its name.
        autocast: the compute precision of generation (and of a trainer's update on this engine's
            model): ``"auto"`` (bfloat16 autocast on CUDA with bfloat16 weights and on a CPU with
            bfloat16 units, AMX or AVX512-BF16, per :func:`.cpu_precision.cpu_autocast`; none otherwise),
            ``None`` (none), or ``"bfloat16"`` to run a float32 model under bfloat16 autocast, the
            fast path on CPUs with AMX or AVX512-BF16 (SmolLM2-135M on one core of a Xeon with AMX:
            decoding 1.35x and a LoRA update 1.85x faster, peak memory 0.67x;
            ``benchmarks/perf/precision_results.md``). The weights, LoRA included, stay in ``dtype``.
        max_batch_size: most requests decoded together (rows of the running batch).
        batch_window_s: how long the batching loop waits for more requests after the first, when
            the engine was idle.
        regroup_wait_s: how long it waits for as many requests as the last batch held (the same
            agents coming back for their next turn); see :class:`BatchingEngine`.
        prefix_cache_size: how many prefilled prompts are kept for requests that arrive later with
            the same prompt token ids (the rollouts of a GRPO group arriving one by one); 0: none.
            Requests joining together with the same prompt share one prefill regardless.
        prefix_cache_bytes: the most memory those prompts' KV may hold.
        logprobs_mode: which log-probabilities are reported for the sampled tokens.
            ``"scaled"`` (default): ``log_softmax(logits / temperature)``, the policy at the
            sampling temperature before penalties and truncation (what a trainer recomputes with
            a forward pass; at temperature 1 the model's own distribution). ``"raw"``:
            ``log_softmax(logits)``. ``"processed"``: after the penalties, temperature, min-p,
            top-k and top-p (the distribution sampled from). Greedy requests report ``"raw"``.
        model_name: the name served and recorded in spans (default: the name given).
        seed: seeds the sampler of requests that bring no ``seed`` of their own.
        num_threads: calls ``torch.set_num_threads`` (process-wide) when given; on a CPU shared
            with other busy processes, fewer threads than cores avoid oversubscription.
        adapters: named LoRA adapters on the same base model, e.g. one per agent:
            ``{"writer": agl.LoRA(r=16), "rewriter": agl.LoRA(r=8), "checker": "adapters/checker"}``
            (settings give a fresh trainable adapter; a directory, a saved adapter served frozen).
            See :meth:`add_adapter`.
        routes: which adapter serves which agent (``{"writer": "writer", "checker": None}``,
            ``None`` for the base model); see :meth:`set_routes`. Requests of different adapters
            are decoded one adapter at a time (see below).

    Batching is continuous, as in vLLM: a background loop collects the first requests (waiting
    ``batch_window_s``, or for the requests announced by :meth:`expect`), and from then on, between
    decoding steps, a row that ended (EOS, stop string, ``max_tokens``, :meth:`cancel`) leaves the batch
    and its future is resolved at once, and waiting requests join the running batch (prefilled, then
    decoded with the others, each with its own sampling settings, seed and budget) up to
    ``max_batch_size`` rows. A prompt shared by several requests (a GRPO group) is prefilled once.
    Rows of different adapters are not decoded together: one adapter's rows decode at a time; while a
    request of another adapter waits, the running adapter takes no new rows, and once its rows are
    done that request's adapter goes next (its waiting requests all start together). A weight update
    (:meth:`update_weights`, :meth:`add_adapter`, :meth:`remove_adapter`) likewise stops new rows and
    runs once the running ones are done: a reply is generated by one version of the weights.
    :meth:`running` tells which requests are generating, for how long, with how many tokens so far;
    :attr:`stats` counts the tokens prefilled and decoded.

    Structured outputs: a request with ``response_format`` (``json_object``, or ``json_schema`` with a
    schema) is decoded under a token mask from llguidance, so the reply is JSON that fits (unless
    ``max_tokens`` cuts it: ``finish_reason="length"``); the JSON is compact (no optional
    whitespace). When tools are offered, the reply is either that JSON or ``<tool_call>`` blocks. The
    logprobs reported are those of the unmasked policy (what a trainer recomputes), except in
    ``"processed"`` mode (the masked distribution actually sampled from).

    ``engine.model`` is the module (peft-wrapped with ``lora``), ``engine.tokenizer`` its
    tokenizer, ``engine.lock`` is held during each batch (hold it while changing weights) and
    ``engine.version`` counts :meth:`update_weights` calls.

    >>> engine = HFEngine("smollm2-135m", max_batch_size=8)  # doctest: +SKIP
    >>> prompt = engine.apply_chat_template([{"role": "user", "content": "2+2?"}])  # doctest: +SKIP
    >>> ids = engine.encode(prompt)  # doctest: +SKIP
    >>> engine.generate([GenRequest(ids, max_tokens=8, temperature=0)])[0].text  # doctest: +SKIP
    'The answer to this classic math problem'
    """

    def __init__(
        self,
        model: Any = "smollm2-135m",
        lora: Any = None,
        device: str = "auto",
        dtype: Any = "auto",
        max_batch_size: int = 16,
        batch_window_s: float = 0.01,
        regroup_wait_s: float = 0.1,
        logprobs_mode: LogprobsMode = "scaled",
        model_name: str | None = None,
        tokenizer: Any = None,
        seed: int | None = None,
        trust_remote_code: bool = False,
        num_threads: int | None = None,
        adapters: Mapping[str, Any] | None = None,
        routes: Mapping[str, str | None] | None = None,
        autocast: Any = "auto",
        prefix_cache_size: int = 8,
        prefix_cache_bytes: int = 256 << 20,
    ) -> None:
        super().__init__(max_batch_size, batch_window_s, regroup_wait_s)
        import torch

        self.prefix_cache_size = int(prefix_cache_size)
        self.prefix_cache_bytes = int(prefix_cache_bytes)
        self._update_cond = threading.Condition()
        self._updates_waiting = 0  # weight updates waiting for the running rows to finish
        self._busy_counted = False
        self._stats.update({k: 0 for k in _WORK})

        if logprobs_mode not in ("scaled", "raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'scaled', 'raw' or 'processed', got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        if num_threads is not None:  # process-wide; on a busy CPU fewer threads avoid oversubscription
            torch.set_num_threads(int(num_threads))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if dtype == "auto":
            dtype = torch.float32
            if self.device.type == "cuda":
                dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        elif isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        self.dtype = dtype
        self.autocast_dtype = self._resolve_autocast(autocast)
        # QLoRA: any adapter asking for 4-bit base weights quantises the shared base model
        specs = [lora, *(adapters or {}).values()]
        self.load_in_4bit = any(bool(getattr(spec, "load_in_4bit", False)) for spec in specs)
        if self.load_in_4bit:
            from ...lora_settings import check_4bit_available

            check_4bit_available(self.device)

        if isinstance(model, (str, os.PathLike)):
            resolved = models.resolve(model)
            known = str(model).lower() in models.KNOWN_MODELS
            if known and resolved.gguf_file is not None and not self.load_in_4bit:
                resolved = models.loadable(model)  # de-quantised once, then read in well under a second
            self.model_name = model_name or str(model)
            from transformers import AutoModelForCausalLM, AutoTokenizer

            kwargs = {"trust_remote_code": trust_remote_code, **resolved.from_pretrained_kwargs()}
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(resolved.path, **kwargs)
            if self.load_in_4bit:
                kwargs.update(self._4bit_kwargs(resolved))
            module = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype, **kwargs)
        else:
            if tokenizer is None:
                raise ValueError("pass tokenizer= with an already loaded model")
            module = model
            config_name = getattr(getattr(model, "config", None), "name_or_path", "model")
            self.model_name = str(model_name or config_name)
            if self.load_in_4bit and not getattr(module, "is_loaded_in_4bit", False):
                raise ValueError(
                    "LoRA(load_in_4bit=True) with an already loaded model needs that model loaded in 4-bit "
                    "(from_pretrained(..., quantization_config=agl.LoRA(load_in_4bit=True)"
                    ".quantization_config())); or pass the model's name or path and the engine loads it so"
                )
        if self.load_in_4bit:
            from ...lora_settings import prepare_4bit

            module = prepare_4bit(module)  # already on its GPU (bitsandbytes weights cannot be moved)
        else:
            module = module.to(self.device)  # type: ignore[arg-type]  # transformers' wrapper hides .to's signature
        module.eval()
        self.tokenizer = tokenizer
        if lora is not None:
            module = self._attach_lora(module, lora)
        self.model = module
        config = getattr(module, "config", None)
        self.max_context = int(getattr(config, "max_position_embeddings", None) or 2048)
        self._eos = set(super().eos_token_ids)
        gen_eos = getattr(getattr(module, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            self._eos.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            self._eos.update(int(e) for e in gen_eos)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else (min(self._eos) if self._eos else 0)
        self._named_only: set[str] = set()  # adapters never served by default (see add_adapter)
        self._ll_tok: Any = None  # llguidance's view of the tokenizer, built on the first response_format
        self._rng = torch.Generator(device=self.device)
        self._rng.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        for name, spec in (adapters or {}).items():
            self.add_adapter(name, spec)
        if routes is not None:
            self.set_routes(routes)

    # -- weights --------------------------------------------------------------------------
    def _4bit_kwargs(self, resolved: Any) -> dict[str, Any]:
        """``from_pretrained`` arguments that load the base weights in 4-bit NF4 on this engine's GPU."""
        import torch

        from ...lora_settings import LoRA

        if resolved.gguf_file is not None:
            raise ValueError(
                "LoRA(load_in_4bit=True) quantises safetensors weights with bitsandbytes; "
                f"{resolved.name!r} is a GGUF file, which transformers de-quantises instead. Pass the "
                "Hugging Face id "
                f"({resolved.hf_id or 'of the original model'}) or a local safetensors directory"
            )
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        compute = self.dtype if self.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        config = LoRA(load_in_4bit=True).quantization_config(compute)
        return {"quantization_config": config, "device_map": {"": index}}

    # -- generation -----------------------------------------------------------------------
    @property
    def eos_token_ids(self) -> set[int]:
        return set(self._eos)

    def _n_vocab(self) -> int:
        """The width of the model's logits."""
        emb = self.model.get_output_embeddings()
        if emb is not None and getattr(emb, "weight", None) is not None:
            return int(emb.weight.shape[0])
        return int(self.model.config.vocab_size)

    def _ll_tokenizer(self) -> Any:
        if self._ll_tok is None:
            with self._stats_lock:
                if self._ll_tok is None:
                    self._ll_tok = ll_tokenizer(self.tokenizer, self._n_vocab(), sorted(self._eos))
        return self._ll_tok

    def check_response_format(
        self, fmt: ResponseFormat, tools: Sequence[dict[str, Any]] | None = None
    ) -> None:
        grammar(fmt, tool_names(tools))
        self._ll_tokenizer()

    def start_request(self, request: GenRequest) -> concurrent.futures.Future[GenResult]:
        """Queue one generation; a ``response_format`` this engine cannot enforce fails its own future
        at once (not the batch it would have joined)."""
        if request.response_format is not None:
            try:
                self.check_response_format(request.response_format, request.tools)
            except ResponseFormatError as exc:
                failed: concurrent.futures.Future[GenResult] = concurrent.futures.Future()
                failed.set_exception(exc)
                return failed
        return super().start_request(request)

    def _serve(self, batch: list[Item]) -> None:
        if (
            type(self)._decode is not HFEngine._decode
            or type(self)._generate_batch is not HFEngine._generate_batch
        ):
            super()._serve(batch)  # a subclass that decodes its own way: whole batches, as before
            return
        self._serve_continuously(batch)

    def _row_batch(
        self, adapter: str | None, prefixes: PrefixCache | None, counters: DecodeCounters
    ) -> RowBatch:
        """An empty decoding batch for ``adapter``'s rows (the adapter active, ``lock`` held)."""
        return RowBatch(
            self,
            self.version,
            adapter,
            rng=self._rng,
            eos=self._eos,
            ll_tokenizer=self._ll_tokenizer,
            should_abort=self._should_abort,
            prefix_cache=prefixes,
            counters=counters,
        )

    def _record_work(self, counters: DecodeCounters) -> None:
        """Add the tokens prefilled and decoded that ``counters`` counted to :attr:`stats`."""
        with self._stats_lock:
            for key, field_name in _WORK.items():
                self._stats[key] += getattr(counters, field_name)

    @property
    def stats(self) -> dict[str, Any]:
        """The counters of every engine (see :attr:`Engine.stats`; here ``batches`` counts the times
        the engine went busy until it had nothing left, ``batch_sizes`` the requests each served and
        ``max_batch_size`` the most rows decoded together), and the work per phase:
        ``prefill_tokens`` (prompt tokens run through the model) in ``prefill_passes`` forward passes,
        ``decode_tokens`` (tokens fed back while decoding, one per row and step) in ``decode_steps``
        passes, ``prefix_cache_hits`` (requests whose prompt was not prefilled for them: shared with
        another request or kept from an earlier one) and ``prefill_tokens_saved`` (their prompt
        tokens)."""
        return super().stats

    def _generate_batch(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        import torch

        with self.lock, torch.inference_mode(), self._autocast():
            was_training = self.model.training
            if was_training:
                self.model.eval()
            try:
                names = [self._adapter_of(r) for r in requests]
                if len(set(names)) == 1:
                    with self.using_adapter(names[0]):
                        return self._decode(requests, self.version, names[0])
                # several agents' adapters: decode one adapter's requests at a time
                results: list[GenResult | None] = [None] * len(requests)
                for name in dict.fromkeys(names):
                    idx = [i for i, n in enumerate(names) if n == name]
                    with self.using_adapter(name):
                        for i, res in zip(
                            idx, self._decode([requests[i] for i in idx], self.version, name), strict=True
                        ):
                            results[i] = res
                return results  # type: ignore[return-value]
            finally:
                if was_training:
                    self.model.train()

    def _resolve_autocast(self, autocast: Any) -> Any:
        """The autocast dtype (or ``None``) that ``autocast`` asks for on this engine's device."""
        import torch

        if autocast == "auto":
            # bf16 weights on CUDA: the fp32 LoRA weights (and, with QLoRA, the fp32 norms) then
            # compute in the same precision as the trainer's recomputed logprobs; float32 weights on
            # a CPU with bfloat16 units: bfloat16 autocast, their fast path (cpu_precision)
            if self.device.type == "cpu" and self.dtype == torch.float32:
                return cpu_autocast()
            return torch.bfloat16 if self.device.type == "cuda" and self.dtype == torch.bfloat16 else None
        if autocast is None or autocast is False:
            return None
        if isinstance(autocast, str):
            if autocast not in ("bfloat16", "bf16", "float16", "fp16"):
                raise ValueError(f"autocast must be 'auto', None, 'bfloat16' or 'float16', got {autocast!r}")
            autocast = torch.bfloat16 if autocast in ("bfloat16", "bf16") else torch.float16
        if autocast not in (torch.bfloat16, torch.float16):
            raise ValueError(f"autocast must be 'auto', None, 'bfloat16' or 'float16', got {autocast!r}")
        if self.device.type == "cpu" and autocast == torch.float16:
            raise ValueError("autocast='float16' is for CUDA; on a CPU use 'bfloat16'")
        return autocast

    def _autocast(self) -> Any:
        """The engine's autocast context (see ``autocast`` in the class docstring); the trainer's forward
        pass uses the same one, so recomputed logprobs match the sampled ones' precision."""
        import torch

        if self.autocast_dtype is not None:
            return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
        return contextlib.nullcontext()

    def _decode(
        self, requests: Sequence[GenRequest], version: int, adapter: str | None = None
    ) -> list[GenResult]:
        counters = DecodeCounters()
        try:
            return decode_batch(
                self,
                requests,
                version,
                adapter,
                rng=self._rng,
                eos=self._eos,
                ll_tokenizer=self._ll_tokenizer,
                should_abort=self._should_abort,
                counters=counters,
            )
        finally:
            self._record_work(counters)
