"""The trainer/engine importance ratio of a training rollout's tokens before any update, when the agent
asks for truncated sampling (top-p), with the old behaviour and the current one.

An agent asks the PolicyServer for ``top_p`` in a training rollout; the first micro-batch of those
calls is rescored by the trainer (full vocabulary, the call's temperature, no update yet) and the
ratio ``pi_trainer / pi_engine`` of every sampled token is compared with 1:

- ``keep`` (the old behaviour, ``PolicyServer(truncated_sampling="keep")``): the engine samples from the
  truncated distribution. vLLM (``processed_logprobs``) reports the renormalised truncated logprob, so
  the ratio falls under 1; the HF engine (``logprobs_mode="scaled"``) reports the untruncated one, so
  the ratio reads 1 although the tokens came from another distribution: the ``keep, processed`` row
  gives the logprobs of the distribution actually sampled from, the true ratio.
- ``ignore`` (the default now): a training rollout samples from the full tempered distribution, the
  one the trainer scores (``params.truncation_ignored`` records what was asked).

SmolLM2-135M (the embedded GGUF, float32 on CPU), 12 prompts x 24 sampled tokens by default.

    python -m benchmarks.perf.bench_ratio_probe   # HF engine; writes ratio_probe_results.md/.json
    AGL_VLLM_PYTHON=/work/vllm-venv/bin/python python -m benchmarks.perf.bench_ratio_probe --vllm   # and vLLM
    python -m benchmarks.perf.bench_ratio_probe --prompts 4 --tokens 8 --no-write   # a quick look
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
QUESTIONS = [
    "Tell me a story about a dragon.",
    "Describe the sea in one paragraph.",
    "What do you like about autumn?",
    "Write a short poem about a cat.",
    "Explain why the sky is blue.",
    "Give advice to a new student.",
    "Describe your favourite meal.",
    "What would you do on a free day?",
    "Write a letter to a friend.",
    "Describe a busy market.",
    "Tell me about a mountain village.",
    "Invent a new holiday and describe it.",
]


def probe(
    engine: Any,
    model: Any,
    top_p: float,
    truncated_sampling: str = "ignore",
    prompts: int = 12,
    tokens: int = 24,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, float]:
    """Serve ``prompts`` training-rollout chat calls (``top_p``, ``temperature``) from ``engine`` and
    rescore the first micro-batch's sampled tokens with ``model`` (the trainer's forward pass); returns
    :func:`~agentlightning_lite.rl.correction.mismatch_metrics` of ``pi_trainer / pi_engine``."""
    import httpx
    import torch

    import agentlightning_lite as agl
    from agentlightning_lite.rl.batching import Sample, collate, forward_logprobs, micro_batches
    from agentlightning_lite.rl.correction import mismatch_metrics
    from agentlightning_lite.rl.update import _engine_logprobs
    from agentlightning_lite.serving import PolicyServer

    store = agl.MemoryStore()
    server = PolicyServer(engine, store, truncated_sampling=truncated_sampling, record_unrouted=False).start()

    def call(i: int) -> Sample:
        ro = store.start_rollout(QUESTIONS[i % len(QUESTIONS)], mode="train")
        body = {
            "model": server.model_name,
            "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "max_tokens": tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed + i,
        }
        r = httpx.post(f"{server.llm(ro.rollout_id).base_url}/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        (span,) = [s for s in store.spans(ro.rollout_id) if s.kind == "llm"]
        t = float(span.attributes["params"]["temperature"])
        assert span.prompt_token_ids and span.response_token_ids and span.response_logprobs
        return Sample(
            list(span.prompt_token_ids),
            list(span.response_token_ids),
            list(span.response_logprobs),
            0.0,
            "probe",
            temperature=t if t > 0 else 1.0,
            rollout_id=ro.rollout_id,
        )

    try:
        with concurrent.futures.ThreadPoolExecutor(prompts) as pool:
            samples = list(pool.map(call, range(prompts)))
    finally:
        server.stop()
    first = micro_batches(samples, prompts, 1 << 20)[0]  # the whole probe as the first micro-batch
    device = next(model.parameters()).device
    batch = collate(first, 0).to(device)
    with torch.no_grad():
        lp, _ = forward_logprobs(model, batch)
    eng = _engine_logprobs(first, batch, device)
    assert eng is not None
    return mismatch_metrics([(lp - eng)[batch.response_mask > 0]])


def _hf_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from agentlightning_lite.serving.engines import HFEngine

    rows = []
    for mode in ("scaled", "processed"):
        engine = HFEngine("smollm2-135m", seed=0, logprobs_mode=mode, max_batch_size=args.prompts)  # type: ignore[arg-type]
        try:
            policies = ("keep", "ignore") if mode == "scaled" else ("keep",)
            for policy in policies:
                for top_p, temp in [(p, 1.0) for p in args.top_p] + [(0.8, 0.7)]:
                    m = probe(engine, engine.model, top_p, policy, args.prompts, args.tokens, temp)
                    rows.append(_row("hf", mode, policy, top_p, temp, m))
                    print(_line(rows[-1]), flush=True)
        finally:
            engine.close()
    return rows


def _vllm_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from agentlightning_lite.serving.engines import HFEngine, VLLMEngine

    trainer = HFEngine("smollm2-135m", seed=0)
    with tempfile.TemporaryDirectory() as logs:
        engine = VLLMEngine(
            "smollm2-135m",
            enable_lora=False,
            max_model_len=1024,
            kv_cache_space_gb=1,
            log_dir=logs,
            startup_timeout_s=900,
            timeout_s=600,
        )
        rows = []
        try:
            for policy in ("keep", "ignore"):
                for top_p, temp in [(p, 1.0) for p in args.top_p] + [(0.8, 0.7)]:
                    m = probe(engine, trainer.model, top_p, policy, args.prompts, args.tokens, temp)
                    rows.append(_row("vllm", "processed_logprobs", policy, top_p, temp, m))
                    print(_line(rows[-1]), flush=True)
        finally:
            engine.close()
            trainer.close()
    return rows


def _row(
    engine: str, mode: str, policy: str, top_p: float, temp: float, m: dict[str, float]
) -> dict[str, Any]:
    row = {
        "engine": engine,
        "logprobs": mode,
        "truncated_sampling": policy,
        "top_p": top_p,
        "temperature": temp,
    }
    return row | {k.split("/")[1]: v for k, v in m.items()}


def _line(r: dict[str, Any]) -> str:
    return (
        f"| {r['engine']} | {r['logprobs']} | {r['truncated_sampling']} | {r['top_p']} | "
        f"{r['temperature']} | "
        f"{r['ratio_mean']:.4f} | {r['ratio_p5']:.4f} | {r['ratio_p50']:.4f} | {r['ratio_p95']:.4f} | "
        f"{r['kl_k3']:.2e} | {int(r['tokens'])} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--top-p", type=float, nargs="+", default=[1.0, 0.8, 0.5])
    ap.add_argument("--vllm", action="store_true", help="also vLLM (AGL_VLLM_PYTHON names its python)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    header = (
        "| engine | logprobs | truncated_sampling | top_p | T | ratio mean | p5 | p50 | p95 | KL k3 "
        "| tokens |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    print(header)
    rows = ([] if args.no_hf else _hf_rows(args)) + (_vllm_rows(args) if args.vllm else [])
    if args.no_write:
        return
    out = HERE / "ratio_probe_results.json"
    old = json.loads(out.read_text()) if out.exists() else {"rows": []}
    engines = {r["engine"] for r in rows}
    kept = [r for r in old["rows"] if r["engine"] not in engines]  # a run of one engine keeps the other's
    data = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.system()} {platform.machine()}, CPU",
        "prompts": args.prompts,
        "tokens": args.tokens,
        "rows": kept + rows,
    }
    out.write_text(json.dumps(data, indent=1) + "\n")
    lines = [_line(r) for r in data["rows"]]
    (HERE / "ratio_probe_results.md").write_text(
        "# Trainer/engine ratio under truncated sampling\n\n"
        f"`python -m benchmarks.perf.bench_ratio_probe` (add `--vllm` for the vllm rows; `--no-hf --vllm` "
        f"keeps the hf rows of the last run) ({data['date']}, {data['machine']}; "
        f"SmolLM2-135M float32, {args.prompts} prompts x {args.tokens} sampled tokens per row, the first "
        "micro-batch rescored by the trainer before any update). `keep`: the old behaviour (the engine "
        "samples the truncated distribution); `ignore`: the default now (training rollouts sample the full "
        "tempered distribution). HF `scaled` logprobs are untruncated whatever was sampled, so their `keep` "
        "ratio reads 1 while the tokens came from the truncated distribution: the `processed` row shows the "
        "ratio against the distribution actually sampled from.\n\n" + header + "\n" + "\n".join(lines) + "\n"
    )


if __name__ == "__main__":
    main()
