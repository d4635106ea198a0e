"""The GPU benchmark: HF engine decode throughput and one LoRA GRPO step, per model size, against TRL.

Models are built from the architecture configs in ``configs/`` with random weights (no download), with
the byte-level tokenizer of :mod:`.tokenizer`: the figures are speed and memory, not quality. See
``benchmarks/gpu/README.md`` for what is measured and how.

    python -m benchmarks.gpu                                   # on CUDA: every size in configs/
    python -m benchmarks.gpu --sizes llama-3.2-1b,llama-3.2-3b
    python -m benchmarks.gpu --tiny                            # the CPU smoke run (automatic without CUDA)
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._harness import cpu_model, load_average

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIGS = HERE / "configs"
GPU_SIZES = ["llama-3.2-1b", "llama-3.2-3b", "qwen2.5-1.5b"]
NAN = float("nan")
NOT_QUALITY = "random weights: the figures are speed and memory, not quality"
CPU_NOTE = "CPU figures at a tiny size: they are NOT GPU figures (they show the benchmark runs)"
SERVER_MODULES = ("starlette", "uvicorn", "anyio", "h11")


@dataclass
class Settings:
    """What one run measures (GPU defaults; :meth:`tiny` for the CPU smoke run)."""

    concurrency: list[int] = field(default_factory=lambda: [1, 16, 64])
    prompt_tokens: int = 128  # prompt length of the decode measurement (chat template included)
    decode_tokens: int = 128  # new tokens per request in the decode measurement
    tasks: int = 8  # GRPO step: tasks x group_size rollouts
    group_size: int = 8
    max_tokens: int = 512  # new tokens per rollout
    micro_batch: int = 8
    lora_r: int = 16
    steps: int = 2  # GRPO steps per measurement: the first warms up, the last is reported
    seed: int = 0

    @classmethod
    def tiny(cls) -> Settings:
        return cls(
            concurrency=[1, 4, 16],
            prompt_tokens=24,
            decode_tokens=8,
            tasks=2,
            group_size=4,
            max_tokens=8,
            micro_batch=4,
            lora_r=16,
            steps=2,
        )


def available(*modules: str) -> list[str]:
    """The modules of ``modules`` that cannot be imported here."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


# -- models ------------------------------------------------------------------------------------
def load_config(size: str) -> Any:
    """The transformers config of ``configs/<size>.json`` (keys starting with ``_`` are notes)."""
    from transformers import AutoConfig

    path = CONFIGS / f"{size}.json"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIGS.glob("*.json"))
        raise SystemExit(f"no config {path.name}: sizes are {', '.join(known)}")
    raw = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


def build_model(size: str, device: Any, dtype: Any, seed: int = 0) -> Any:
    """A random-init causal LM of the config's architecture, created directly on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = load_config(size)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def device_and_dtype() -> tuple[Any, Any]:
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.device("cpu"), torch.float32


def make_engine(size: str, settings: Settings, lora: Any = None) -> Any:
    from agentlightning_lite.serving.engines import HFEngine

    from .tokenizer import byte_tokenizer

    device, dtype = device_and_dtype()
    model = build_model(size, device, dtype, settings.seed)
    tok = byte_tokenizer(int(model.config.vocab_size))
    return HFEngine(
        model,
        tokenizer=tok,
        lora=lora,
        device=str(device),
        dtype=dtype,
        seed=settings.seed,
        model_name=size,
        max_batch_size=max(max(settings.concurrency), settings.tasks * settings.group_size),
    )


def prompt_text(n_tokens: int) -> str:
    """A user message whose chat prompt is about ``n_tokens`` byte tokens."""
    base = "Count the apples in the basket and explain every step of the counting. "
    body = (base * (n_tokens // len(base) + 1))[: max(n_tokens - 24, 1)]
    return body


# -- GPU memory ---------------------------------------------------------------------------------
def cuda_mem() -> dict[str, float]:
    """Peak allocated / reserved GiB since the last reset (NaN without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return {"allocated_gib": NAN, "reserved_gib": NAN}
    return {
        "allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
    }


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# -- HTTP (standard library: the benchmark needs no openai client) --------------------------------
def chat(llm: Any, content: str, max_tokens: int) -> dict[str, Any]:
    """One chat completion from ``llm`` (an ``agl.LLM``) over HTTP."""
    body = {
        "model": llm.model,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "messages": [{"role": "user", "content": content}],
    }
    req = urllib.request.Request(
        llm.base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {llm.api_key}"},
    )
    with urllib.request.urlopen(req, timeout=3600) as resp:
        return json.load(resp)


def in_threads(n: int, fn: Any) -> list[Any]:
    """Run ``fn(i)`` for i in range(n) in n threads started together; their results in order."""
    out: list[Any] = [None] * n
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            start.wait()
            out[i] = fn(i)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


# -- worker: decode throughput -------------------------------------------------------------------
def run_decode(size: str, settings: Settings) -> dict[str, Any]:
    """Tokens/s of the HF engine at each concurrency, direct (``engine.generate``) and through the
    PolicyServer (n HTTP clients at once)."""
    from agentlightning_lite.serving.engines import GenRequest

    t0 = time.perf_counter()
    engine = make_engine(size, settings)
    load_s = time.perf_counter() - t0
    content = prompt_text(settings.prompt_tokens)
    prompt = engine.encode(engine.apply_chat_template([{"role": "user", "content": content}]))
    out: dict[str, Any] = {"load_s": load_s, "prompt_tokens": len(prompt), "direct": {}, "server": {}}
    warm = engine.generate([GenRequest(prompt, max_tokens=4)])  # kernels, allocator
    assert warm
    for c in settings.concurrency:
        reqs = [GenRequest(prompt, max_tokens=settings.decode_tokens, temperature=1.0) for _ in range(c)]
        engine.expect(c)
        reset_peak()
        t = time.perf_counter()
        res = engine.generate(reqs)
        sync()
        wall = time.perf_counter() - t
        tokens = sum(len(r.token_ids) for r in res)
        out["direct"][str(c)] = {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, **cuda_mem()}

    missing = available("pydantic", *SERVER_MODULES)
    if missing:
        out["server_skipped"] = f"the PolicyServer needs {', '.join(missing)} (see the README's carry list)"
    else:
        import agentlightning_lite as agl

        with agl.PolicyServer(engine, agl.MemoryStore()) as server:
            llm = server.llm()
            chat(llm, content, 4)
            for c in settings.concurrency:
                engine.expect(c)
                reset_peak()
                t = time.perf_counter()
                replies = in_threads(c, lambda _i: chat(llm, content, settings.decode_tokens))
                wall = time.perf_counter() - t
                tokens = sum(int(r["usage"]["completion_tokens"]) for r in replies)
                out["server"][str(c)] = {
                    "tokens": tokens,
                    "wall_s": wall,
                    "tok_s": tokens / wall,
                    **cuda_mem(),
                }
    engine.close()
    return out


# -- worker: one GRPO step, ours -----------------------------------------------------------------
def reward_of(text: str) -> float:
    """A deterministic reward with a spread inside every group (a hash of the reply): GRPO updates.

    >>> reward_of("abc") == reward_of("abc"), 0.0 <= reward_of("x") < 1.0
    (True, True)
    """
    return (zlib.crc32(text.encode("utf-8", "replace")) % 1000) / 1000.0


def grpo_tasks(settings: Settings) -> list[dict[str, str]]:
    return [{"q": f"Task {i}: " + prompt_text(settings.prompt_tokens)} for i in range(settings.tasks)]


def run_grpo(size: str, settings: Settings, checkpointing: bool) -> dict[str, Any]:
    """One GRPO step of ``agl.Trainer`` (rollouts through the PolicyServer + LoRA update), timed and
    with peak GPU memory per phase; the first of ``settings.steps`` steps warms up."""
    missing = available("pydantic", *SERVER_MODULES)
    if missing:
        return {
            "skipped": f"the trainer's rollouts go through the PolicyServer, which needs {', '.join(missing)}"
        }
    import torch

    import agentlightning_lite as agl
    from agentlightning_lite.rl.config import LoggingConfig, RolloutConfig, UpdateConfig

    def agent(task: dict[str, str], llm: agl.LLM) -> float:
        reply = chat(llm, task["q"], settings.max_tokens)
        return reward_of(reply["choices"][0]["message"]["content"] or "")

    with tempfile.TemporaryDirectory(prefix="agl-gpu-bench-") as tmp:
        t0 = time.perf_counter()
        lora = agl.LoRA(r=settings.lora_r, alpha=2 * settings.lora_r)
        engine = make_engine(size, settings, lora=lora)
        trainer = agl.Trainer(
            engine=engine,
            algorithm=agl.GRPO(
                group_size=settings.group_size,
                lr=1e-5,
                kl_coef=0.0,
                micro_batch_size=settings.micro_batch,
                # micro-batches of exactly micro_batch sequences (as TRL's per-device batch), not fewer
                # by the default token bound
                micro_batch_tokens=settings.micro_batch * (settings.prompt_tokens + settings.max_tokens + 64),
                loss_agg="token-mean",
            ),
            batch_size=settings.tasks,
            store=agl.MemoryStore(),
            output_dir=tmp,
            logging_config=LoggingConfig(loggers=[]),
            seed=settings.seed,
            rollout_config=RolloutConfig(timeout=None),
            update_config=UpdateConfig(gradient_checkpointing=checkpointing),
        )
        load_s = time.perf_counter() - t0
        phases: dict[str, dict[str, float]] = {}
        original_run = trainer.rollouts.run

        def tracked_run(*a: Any, **kw: Any) -> Any:  # generation; what follows is samples + update
            reset_peak()
            try:
                return original_run(*a, **kw)
            finally:
                phases["gen"] = cuda_mem()
                reset_peak()

        trainer.rollouts.run = tracked_run  # type: ignore[method-assign]
        tasks = list(enumerate(grpo_tasks(settings)))
        steps = []
        with trainer.rollouts.serving():
            for _ in range(settings.steps):
                t = time.perf_counter()
                m = trainer.train_step(agent, tasks)
                sync()
                wall = time.perf_counter() - t
                phases["update"] = cuda_mem()
                steps.append(
                    {
                        "wall_s": wall,
                        "gen_s": float(m["time/rollouts_s"]),
                        "update_s": float(m["time/update_s"]),
                        "tokens": int(m.get("train/response_tokens", 0)),
                        "rollouts": int(m["train/rollouts"]),
                        "failed_rollouts": int(m["train/failed_rollouts"] + m["train/timeout_rollouts"]),
                        "skipped_update": bool(m.get("train/skipped_update", 0.0)),
                        "logprob_mismatch": float(m.get("train/logprob_mismatch_mean", NAN)),
                        "gen_peak": dict(phases.get("gen", {})),
                        "update_peak": dict(phases.get("update", {})),
                    }
                )
        trainer.close()
        engine.close()
    del trainer, engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    last = steps[-1]
    if last["failed_rollouts"] or last["skipped_update"]:
        return {
            "error": f"{last['failed_rollouts']} rollouts failed, update skipped: {last['skipped_update']}"
        }
    return {"load_s": load_s, "steps": steps, "checkpointing": checkpointing}


# -- worker: one GRPO step, TRL ------------------------------------------------------------------
def run_trl(size: str, settings: Settings, checkpointing: bool) -> dict[str, Any]:
    """The same step with TRL's ``GRPOTrainer`` (same model, tokenizer, LoRA, group, lengths, reward)."""
    missing = available("trl", "datasets")
    if missing:
        return {"skipped": f"TRL is not importable here ({', '.join(missing)} missing)"}
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import agentlightning_lite as agl

    from .tokenizer import byte_tokenizer

    device, dtype = device_and_dtype()
    cuda = device.type == "cuda"
    tokens = {"n": 0}

    def hashed_reward(completions: list[Any], completion_ids: list[list[int]], **_: Any) -> list[float]:
        tokens["n"] += sum(len(c) for c in completion_ids)
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [reward_of(t) for t in texts]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0
            self.walls: list[float] = []
            self.peaks: list[dict[str, float]] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            reset_peak()
            self.begin = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            sync()
            self.walls.append(time.perf_counter() - self.begin)
            self.peaks.append(cuda_mem())

    with tempfile.TemporaryDirectory(prefix="trl-gpu-bench-") as tmp:
        t0 = time.perf_counter()
        model = build_model(size, device, dtype, settings.seed)
        tokenizer = byte_tokenizer(int(model.config.vocab_size))
        n_step = settings.tasks * settings.group_size
        args = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=settings.micro_batch,
            gradient_accumulation_steps=max(n_step // settings.micro_batch, 1),
            num_generations=settings.group_size,
            max_completion_length=settings.max_tokens,
            temperature=1.0,
            top_p=1.0,
            num_iterations=1,
            beta=0.0,
            loss_type="dapo",
            learning_rate=1e-5,
            lr_scheduler_type="constant",
            max_steps=settings.steps,
            use_vllm=False,
            use_cpu=not cuda,
            bf16=cuda and dtype == torch.bfloat16,
            fp16=False,
            gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None,
            report_to=[],
            eval_strategy="no",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            seed=settings.seed,
        )
        dataset = Dataset.from_list(
            [{"prompt": [{"role": "user", "content": t["q"]}]} for t in grpo_tasks(settings)]
        )
        timer = StepTimer()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[hashed_reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=agl.LoRA(r=settings.lora_r, alpha=2 * settings.lora_r).to_peft_config(),
            callbacks=[timer],
        )
        load_s = time.perf_counter() - t0
        gen_times: list[float] = []
        original = trainer._generate_and_score_completions

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                sync()
                gen_times.append(time.perf_counter() - t)

        trainer._generate_and_score_completions = timed  # type: ignore[method-assign]
        trainer.train()
    steps = []
    for i, wall in enumerate(timer.walls):
        gen = gen_times[i] if i < len(gen_times) else NAN
        steps.append({"wall_s": wall, "gen_s": gen, "update_s": wall - gen, "peak": timer.peaks[i]})
    return {"load_s": load_s, "steps": steps, "tokens_total": tokens["n"], "checkpointing": checkpointing}


WORKERS = {"decode": run_decode, "grpo": run_grpo, "trl": run_trl}


def call_worker(name: str, size: str, settings: Settings, in_process: bool, **kw: Any) -> dict[str, Any]:
    """Run one measurement, in this process or in a fresh one (its own CUDA context: clean peaks,
    and an out-of-memory error costs only that measurement)."""
    if in_process:
        try:
            return WORKERS[name](size, settings, **kw)
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.gpu",
        "--worker",
        name,
        "--size",
        size,
        "--settings",
        json.dumps(asdict(settings)),
        "--kw",
        json.dumps(kw),
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    try:
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"error": f"worker exited with {proc.returncode}: {' | '.join(tail)}"}
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


# -- the run -------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    """GPU, driver, CUDA and library versions, CPU, Python, commit."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "cpu": f"{cpu_model()}, {os.cpu_count()} cores",
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = (
            f"{props.name} ({props.total_memory / 2**30:.0f} GiB), {torch.cuda.device_count()} visible"
        )
        env["cuda"] = torch.version.cuda
        env["bf16"] = torch.cuda.is_bf16_supported()
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            env["driver"] = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else "unknown"
        except (OSError, subprocess.SubprocessError):
            env["driver"] = "unknown (no nvidia-smi)"
    else:
        env["gpu"] = "none"
    libs = {}
    for name in ("torch", "transformers", "peft", "accelerate", "trl", "bitsandbytes", "tokenizers"):
        try:
            libs[name] = version(name)
        except PackageNotFoundError:
            libs[name] = "not installed"
    env["libraries"] = libs
    try:
        env["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["commit"] = "unknown"
    return env


def _f(x: Any, fmt: str = "{:.3g}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and x != x) else fmt.format(x)


def markdown(results: dict[str, Any]) -> str:
    env, st = results["environment"], results["settings"]
    cpu = env["gpu"] == "none"
    lines = [
        "# GPU benchmark: HF engine decode and one LoRA GRPO step"
        if not cpu
        else "# GPU benchmark, CPU smoke run",
        "",
        f"**{CPU_NOTE}.**" if cpu else "",
        f"Models: {NOT_QUALITY}.",
        "",
        f"Command (from the repository root): `{results['command']}`",
        "",
        f"Date {results['date']}; GPU {env['gpu']}; driver {env.get('driver', 'n/a')}; "
        f"CUDA {env.get('cuda', 'n/a')}; "
        f"CPU {env['cpu']}; Python {env['python']}; "
        + ", ".join(f"{k} {v}" for k, v in env["libraries"].items())
        + f"; commit {env['commit']}; load average at start {results['load_average']}.",
        "",
        f"Decode: prompt of {st['prompt_tokens']} tokens (chat template included), "
        f"{st['decode_tokens']} new tokens per request, temperature 1. GRPO step: "
        f"{st['tasks']} tasks x {st['group_size']} rollouts, at most {st['max_tokens']} new tokens each, "
        f"LoRA r={st['lora_r']} on q/k/v/o/gate/up/down, micro-batches of {st['micro_batch']}, "
        f"{'bf16' if not cpu else 'float32'}; the last of {st['steps']} steps is reported "
        "(the first warms up).",
        "",
    ]
    for size, res in results["sizes"].items():
        lines += [f"## {size}", ""]
        dec = res.get("decode", {})
        if "error" in dec:
            lines += [f"Decode: failed: {dec['error']}", ""]
        else:
            lines += [
                "| concurrent requests | direct tokens/s | PolicyServer tokens/s "
                "| peak allocated / reserved GiB (direct) |",
                "|---:|---:|---:|---:|",
            ]
            for c in st["concurrency"]:
                d, s = dec.get("direct", {}).get(str(c), {}), dec.get("server", {}).get(str(c), {})
                lines.append(
                    f"| {c} | {_f(d.get('tok_s'))} | {_f(s.get('tok_s'))} | "
                    f"{_f(d.get('allocated_gib'), '{:.2f}')} / {_f(d.get('reserved_gib'), '{:.2f}')} |"
                )
            if dec.get("server_skipped"):
                lines.append(f"\nPolicyServer column skipped: {dec['server_skipped']}.")
            lines.append("")
        lines += [
            "| GRPO step | checkpointing | step s | generation s | update s | new tokens "
            "| peak GiB gen (alloc / reserved) | peak GiB update (alloc / reserved) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key, who in (("grpo", "ours (agl.Trainer)"), ("trl", "TRL GRPOTrainer")):
            for ck in ("off", "on"):
                r = res.get(f"{key}_{ck}", {})
                if "skipped" in r or "error" in r:
                    why = r.get("skipped") or f"failed: {r['error']}"
                    lines.append(f"| {who} | {ck} | {why} | | | | | |")
                    continue
                s = r["steps"][-1]
                gp = s.get("gen_peak") or {}
                up = s.get("update_peak") or s.get("peak") or {}
                gen_mem = (
                    f"{_f(gp.get('allocated_gib'), '{:.2f}')} / {_f(gp.get('reserved_gib'), '{:.2f}')}"
                    if gp
                    else "(whole step in the next column)"
                )
                lines.append(
                    f"| {who} | {ck} | {_f(s['wall_s'])} | {_f(s['gen_s'])} | {_f(s['update_s'])} "
                    f"| {s.get('tokens', r.get('tokens_total', 'n/a'))} | {gen_mem} | "
                    f"{_f(up.get('allocated_gib'), '{:.2f}')} / {_f(up.get('reserved_gib'), '{:.2f}')} |"
                )
        lines.append("")
    return "\n".join(lines).replace("\n\n\n", "\n\n")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sizes",
        default=None,
        help=f"comma-separated configs/ names (default on CUDA: {','.join(GPU_SIZES)})",
    )
    ap.add_argument("--tiny", action="store_true", help="the tiny CPU smoke run (automatic without CUDA)")
    ap.add_argument("--concurrency", default=None, help="decode concurrencies, e.g. 1,16,64")
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens per GRPO rollout (default 512)")
    ap.add_argument("--tasks", type=int, default=None, help="GRPO tasks per step (default 8)")
    ap.add_argument("--group-size", type=int, default=None, help="GRPO rollouts per task (default 8)")
    ap.add_argument("--micro-batch", type=int, default=None, help="update micro-batch (default 8)")
    ap.add_argument("--no-trl", action="store_true", help="skip the TRL comparison")
    ap.add_argument("--in-process", action="store_true", help="every measurement in this process")
    ap.add_argument("--out-dir", type=Path, default=HERE, help="where results(.md/.json) go")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--size", help=argparse.SUPPRESS)
    ap.add_argument("--settings", help=argparse.SUPPRESS)
    ap.add_argument("--kw", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        settings = Settings(**json.loads(args.settings))
        res = WORKERS[args.worker](args.size, settings, **json.loads(args.kw))
        args.json.write_text(json.dumps(res))
        return None

    import torch

    cuda = torch.cuda.is_available()
    tiny = args.tiny or not cuda
    if not cuda:
        print(f"No CUDA GPU: running the tiny CPU smoke run. {CPU_NOTE}.", flush=True)
    settings = Settings.tiny() if tiny else Settings()
    if args.concurrency:
        settings.concurrency = [int(x) for x in args.concurrency.split(",")]
    for name in ("max_tokens", "tasks", "group_size", "micro_batch"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    sizes = args.sizes.split(",") if args.sizes else (["tiny"] if tiny else GPU_SIZES)
    in_process = args.in_process or not cuda
    print(f"Models: {NOT_QUALITY}.", flush=True)
    given = list(argv if argv is not None else sys.argv[1:])
    results: dict[str, Any] = {
        "command": f"python -m benchmarks.gpu {shlex.join(given)}".strip(),
        "date": dt.date.today().isoformat(),
        "device": "cuda" if cuda else "cpu",
        "note": CPU_NOTE if not cuda else NOT_QUALITY,
        "settings": asdict(settings),
        "environment": environment(),
        "load_average": load_average(),
        "sizes": {},
    }
    for size in sizes:
        print(f"[{size}] decode throughput ...", flush=True)
        res: dict[str, Any] = {"decode": call_worker("decode", size, settings, in_process)}
        for ck in (False, True):
            label = "on" if ck else "off"
            print(f"[{size}] GRPO step, ours, checkpointing {label} ...", flush=True)
            res[f"grpo_{label}"] = call_worker("grpo", size, settings, in_process, checkpointing=ck)
            if args.no_trl:
                res[f"trl_{label}"] = {"skipped": "--no-trl"}
            else:
                print(f"[{size}] GRPO step, TRL, checkpointing {label} ...", flush=True)
                res[f"trl_{label}"] = call_worker("trl", size, settings, in_process, checkpointing=ck)
        results["sizes"][size] = res
    text = markdown(results)
    print("\n" + text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = "results" if cuda else "cpu_smoke_results"
    (args.out_dir / f"{stem}.md").write_text(text)
    (args.out_dir / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nwrote {args.out_dir / (stem + '.md')} and .json")
    return results
