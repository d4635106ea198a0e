"""What the Tinker path costs over calling the trainer in-process, and how it carries concurrent clients.

One model (SmolLM2-135M from the embedded GGUF, float32 on CPU), one LoRA (rank 8, alpha 32), one batch
(``--batch`` conversations-like sequences of ``--tokens`` tokens, cross-entropy on every target):

* **in-process**: ``Learner.forward_backward`` + ``Learner.optim_step`` on a LoRA adapter of the
  engine's module, with the server's settings for a client with Tinker's defaults (the attention, MLP and
  unembedding projections; the learner's micro-batches and precision);
  the sample: each prompt of the batch through ``HFEngine.submit`` directly.
* **backend, no HTTP**: the server's ``PeftBackend.forward_backward`` / ``optim_step`` called directly
  (the training side the routes call), to split the overhead into backend and protocol.
* **Tinker SDK over HTTP**: the official ``tinker`` SDK (0.38) in a child process against
  ``TinkerServer`` on 127.0.0.1 (protobuf bodies, futures, ``retrieve_future`` polling): one step is
  ``forward_backward(..., "cross_entropy")`` + ``optim_step`` + both results; the sample is one
  ``sample`` per prompt from ``save_weights_and_get_sampling_client()``, all submitted at once.
* **concurrency**: 1, 2 and 4 SDK clients (threads of the child, each its own LoRA training client)
  doing ``--steps`` steps at once: steps per second of wall time over all of them.

Nothing runs beside anything else except the concurrent clients. The in-process steps run again after
the SDK's, so drift over the run (the machine's load, its clocks) shows as two passes. The SDK's Python is
this one when it has ``tinker``, else ``--sdk-python`` / ``$AGL_TINKER_PYTHON``.

    python -m benchmarks.perf.tinker_overhead --threads 1     # writes tinker_overhead_results.md/.json
    python -m benchmarks.perf.tinker_overhead --threads 1 --steps 1 --no-write   # a quick look
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RANK = 8
LR = 1e-4

CLIENT = textwrap.dedent(
    """
    import json, sys, threading, time, warnings
    warnings.simplefilter("ignore")
    import tinker
    from tinker import types

    cfg = json.loads(sys.argv[1])
    sc = tinker.ServiceClient(base_url=cfg["url"], api_key="tml-bench")
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
        )
        for ids in cfg["batch"]
    ]
    adam = types.AdamParams(learning_rate=cfg["lr"])

    def step(tc):
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(adam)
        loss = fb.result().metrics["loss:sum"]
        opt.result()
        return loss

    def client():
        return sc.create_lora_training_client(base_model=cfg["base_model"], rank=cfg["rank"], seed=0)

    def say(msg):
        print(f"[sdk] {msg}", file=sys.stderr, flush=True)

    out = {}
    tc = client()
    step(tc)  # warm-up
    times, losses = [], []
    for _ in range(cfg["steps"]):
        t0 = time.perf_counter()
        losses.append(step(tc))
        times.append(time.perf_counter() - t0)
    out["step_s"], out["losses"] = times, losses
    say(f"steps: {times}")
    sampler = tc.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=cfg["max_tokens"], temperature=1.0, seed=0)
    t0 = time.perf_counter()
    futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in cfg["prompts"]]
    seqs = [f.result().sequences[0] for f in futures]
    out["sample_s"] = time.perf_counter() - t0
    out["sample_tokens"] = sum(len(s.tokens) for s in seqs)
    say(f"sample: {out['sample_s']:.1f} s")

    out["concurrency"] = {}
    for n in cfg["clients"]:
        clients = [client() for _ in range(n)]
        for c in clients:
            step(c)  # warm-up: each adapter created and stepped once
        errors = []

        def run(c):
            try:
                for _ in range(cfg["steps"]):
                    step(c)
            except Exception as exc:  # reported, never swallowed
                errors.append(repr(exc))

        threads = [threading.Thread(target=run, args=(c,)) for c in clients]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        out["concurrency"][str(n)] = {"wall_s": wall, "steps": n * cfg["steps"], "errors": errors}
        say(f"{n} clients: {wall:.1f} s")
    sc.close("success")
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def sdk_python(given: str | None) -> str:
    if given:
        return given
    if importlib.util.find_spec("tinker") is not None:
        return sys.executable
    env = os.environ.get("AGL_TINKER_PYTHON")
    if env:
        return env
    sys.exit("no Python with the tinker SDK: pass --sdk-python, or set AGL_TINKER_PYTHON")


def make_batch(engine: Any, n: int, length: int) -> list[list[int]]:
    """``n`` sequences of ``length`` tokens from plain text (distinct, deterministic)."""
    out = []
    for i in range(n):
        text = " ".join(f"Fact {i}.{j}: the number {i * 31 + j} is written in digits." for j in range(40))
        ids = engine.encode(text)[:length]
        assert len(ids) == length, (len(ids), length)
        out.append(ids)
    return out


def in_process(
    engine: Any, batch: list[list[int]], steps: int, prompts: list[list[int]], max_tokens: int
) -> dict:
    """The Learner's primitives in process, on a LoRA adapter of the engine's module (the modules, the
    learner's settings and precision the server uses for a client with Tinker's defaults); then a
    sample per prompt."""
    import torch

    from agentlightning_lite.lora_settings import LoRA
    from agentlightning_lite.rl.datum import AdamParams, Datum
    from agentlightning_lite.rl.engine_setup import update_autocast
    from agentlightning_lite.rl.learner import Learner
    from agentlightning_lite.rl.policies import Policy, adapter_params
    from agentlightning_lite.rl.sft import SFT
    from agentlightning_lite.rl.weights import WeightHandOver
    from agentlightning_lite.serving.engines import GenRequest
    from agentlightning_lite.tinker.peft_backend import (
        LORA_ALPHA,
        MICRO_BATCH_SIZE,
        MICRO_BATCH_TOKENS,
        lora_targets,
    )

    lora = LoRA(r=RANK, alpha=LORA_ALPHA, target_modules=lora_targets(engine.model))
    engine.add_adapter("bench", lora, named_only=True)
    params = adapter_params(engine.model, "bench")
    optimizer = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    learner = Learner(
        engine.model,
        [Policy("bench", "bench", None, optimizer, None)],
        WeightHandOver(engine, engine.model),
        SFT(micro_batch_size=MICRO_BATCH_SIZE, micro_batch_tokens=MICRO_BATCH_TOKENS),
        autocast=update_autocast(engine, params[0].device),
    )
    datums = [Datum.from_tokens(ids, weights=[1.0] * (len(ids) - 1)) for ids in batch]
    adam = AdamParams(learning_rate=LR)

    def step() -> float:
        for p in params:
            p.requires_grad_(True)
        loss = learner.forward_backward(datums, "cross_entropy").metrics["loss:sum"]
        learner.optim_step(adam)
        return float(loss)

    step()
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    futures = [
        engine.submit(
            GenRequest(prompt_token_ids=p, max_tokens=max_tokens, temperature=1.0, seed=0, adapter="bench")
        )
        for p in prompts
    ]
    results = [f.result() for f in futures]
    sample_s = time.perf_counter() - t0
    return {
        "step_s": times,
        "losses": losses,
        "sample_s": sample_s,
        "sample_tokens": sum(r.num_tokens for r in results),
        "step": step,  # run again after the other paths (not written out)
    }


def timed(step: Any, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def backend_direct(backend: Any, batch: list[list[int]], steps: int) -> dict:
    """The server's training backend called directly (no HTTP, no futures)."""
    from agentlightning_lite.tinker import AdamParams, Datum

    backend.create_model("bench:train:0", backend.base_model_names()[0], RANK, 0)
    data = [Datum(ids[:-1], {"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)}) for ids in batch]

    def step() -> float:
        loss = backend.forward_backward("bench:train:0", data, "cross_entropy", {}).metrics["loss:sum"]
        backend.optim_step("bench:train:0", AdamParams(learning_rate=LR))
        return float(loss)

    step()
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    return {"step_s": times, "losses": losses}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per measurement (after a warm-up)")
    parser.add_argument("--max-tokens", type=int, default=16, help="new tokens per sample (at most)")
    parser.add_argument("--clients", default="1,2,4", help="concurrent SDK clients")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    parser.add_argument("--sdk-python", default=None, help="a Python with tinker==0.38.0")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    python = sdk_python(args.sdk_python)
    load_before = load()
    wall0 = time.perf_counter()

    from agentlightning_lite.serving.engines import HFEngine
    from agentlightning_lite.tinker import TinkerServer
    from agentlightning_lite.tinker.peft_backend import PeftBackend
    from agentlightning_lite.tinker.server import base_model_names, tokenizer_id

    engine = HFEngine("smollm2-135m", num_threads=args.threads, seed=0)
    batch = make_batch(engine, args.batch, args.tokens)
    prompts = [ids[: args.tokens // 2] for ids in batch]
    print(f"in-process: {args.batch} x {args.tokens} tokens, {args.steps} steps...", flush=True)
    local = in_process(engine, batch, args.steps, prompts, args.max_tokens)
    print(f"in-process: steps {local['step_s']}, sample {local['sample_s']:.1f} s", flush=True)
    backend = PeftBackend(engine, base_model_names("smollm2-135m"), tokenizer_id("smollm2-135m"))
    print("backend, no HTTP...", flush=True)
    direct = backend_direct(backend, batch, args.steps)
    print(f"backend: steps {direct['step_s']}", flush=True)
    clients = [int(x) for x in args.clients.split(",")]
    cfg = {
        "batch": batch,
        "prompts": prompts,
        "steps": args.steps,
        "lr": LR,
        "rank": RANK,
        "max_tokens": args.max_tokens,
        "clients": clients,
        "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }
    with tempfile.TemporaryDirectory() as out_dir:
        server = TinkerServer(backend, out_dir).start()
        try:
            cfg["url"] = server.url
            print(f"Tinker SDK over HTTP ({python})...", flush=True)
            env = {**os.environ, "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1"}
            env.pop("TINKER_BASE_URL", None)
            # the child's stderr (its progress) passes through; its stdout carries the result
            proc = subprocess.run(
                [python, "-c", CLIENT, json.dumps(cfg)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                timeout=1800,
            )
        finally:
            server.close()
    # the in-process steps again, now that the other paths have run: drift over the run shows here
    again = timed(local.pop("step"), args.steps)
    print(f"in-process again: steps {again}", flush=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"the SDK client failed (exit {proc.returncode}): its stderr is above")
    sdk = json.loads(lines[-1][len("RESULT ") :])
    errors = {n: c["errors"] for n, c in sdk["concurrency"].items() if c["errors"]}
    if errors:
        sys.exit(f"concurrent clients failed: {errors}")
    wall = time.perf_counter() - wall0

    med = statistics.median
    # in-process: the median over both passes (before and after the other paths)
    step_local = med(local["step_s"] + again)
    step_direct, step_sdk = med(direct["step_s"]), med(sdk["step_s"])
    conc = {
        n: {"steps_per_s": c["steps"] / c["wall_s"], "wall_s": c["wall_s"], "steps": c["steps"]}
        for n, c in sdk["concurrency"].items()
    }
    result = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": "python -m benchmarks.perf.tinker_overhead " + " ".join(sys.argv[1:]),
        "autocast": str(engine.autocast_dtype).removeprefix("torch."),  # None: float32 throughout
        "load_before": load_before,
        "load_after": load(),
        "wall_s": round(wall, 1),
        "settings": {k: v for k, v in vars(args).items() if k not in ("no_write", "sdk_python")},
        "step_s": {"in_process": step_local, "backend": step_direct, "sdk_http": step_sdk},
        "in_process_passes_s": {"first": med(local["step_s"]), "last": med(again)},
        "losses": {"in_process": local["losses"], "backend": direct["losses"], "sdk_http": sdk["losses"]},
        "sample": {
            "in_process_s": local["sample_s"],
            "in_process_tokens": local["sample_tokens"],
            "sdk_http_s": sdk["sample_s"],
            "sdk_http_tokens": sdk["sample_tokens"],
        },
        "concurrency": conc,
    }
    md = render(result)
    print(md)
    if not args.no_write:
        (HERE / "tinker_overhead_results.json").write_text(json.dumps(result, indent=2) + "\n")
        (HERE / "tinker_overhead_results.md").write_text(md)


def render(r: dict[str, Any]) -> str:
    s, smp, c, st = r["step_s"], r["sample"], r["concurrency"], r["settings"]
    base = s["in_process"]
    passes = r["in_process_passes_s"]
    one = c.get("1", {}).get("steps_per_s")
    head = (
        f"`{r['command']}` ({r['date']}; {r['machine']}; smollm2-135m (GGUF, float32 weights, CPU, "
        f"autocast {r.get('autocast')}), "
        f"LoRA rank {RANK}, {st['threads']} torch thread(s); a step = cross-entropy `forward_backward` + "
        f"`optim_step` on {st['batch']} sequences of {st['tokens']} tokens; median of {st['steps']} steps "
        f"after a warm-up). Load average (1, 5, 15 min) {r['load_before']} before, {r['load_after']} after; "
        f"{r['wall_s']} s wall."
    )
    sample_head = f"one sample per prompt ({st['batch']} prompts, {st['max_tokens']} new tokens at most)"
    lines = [
        "# The Tinker path against the trainer in-process",
        "",
        head,
        "",
        "| one supervised step | seconds | vs in-process |",
        "|---|---|---|",
        f"| in-process (`Learner.forward_backward` + `optim_step`), both passes | {base:.2f} | 1.00x |",
        f"| in-process, first pass / last pass | {passes['first']:.2f} / {passes['last']:.2f} | "
        f"{passes['first'] / base:.2f}x / {passes['last'] / base:.2f}x |",
        f"| server backend called directly (no HTTP) | {s['backend']:.2f} | {s['backend'] / base:.2f}x |",
        f"| Tinker SDK over HTTP (`agl-lite tinker`) | {s['sdk_http']:.2f} | {s['sdk_http'] / base:.2f}x |",
        "",
        f"| {sample_head} | seconds | tokens |",
        "|---|---|---|",
        f"| in-process (`HFEngine.submit`) | {smp['in_process_s']:.2f} | {smp['in_process_tokens']} |",
        f"| Tinker SDK (`sample`, submitted at once) | {smp['sdk_http_s']:.2f} | {smp['sdk_http_tokens']} |",
        "",
        f"| concurrent SDK clients ({st['steps']} steps each) | steps/s (all) | wall s | vs 1 client |",
        "|---|---|---|---|",
    ]
    for n, v in c.items():
        ratio = f"{v['steps_per_s'] / one:.2f}x" if one else "-"
        lines.append(f"| {n} | {v['steps_per_s']:.3f} | {v['wall_s']:.1f} | {ratio} |")
    losses = "; ".join(f"{k} {[round(x, 1) for x in v]}" for k, v in r["losses"].items())
    lines += [
        "",
        f"`loss:sum` of the timed steps (each path its own fresh adapter, same batch): {losses}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
