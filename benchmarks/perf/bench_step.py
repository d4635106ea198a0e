"""One training step of the demo, before and after a change, against the machine's GEMM throughput.

Three measurements in one run, on one machine:

1. **The machine's limit**: GFLOP/s of torch matmuls at the shapes of the embedded model
   (``smollm2-135m``, dimensions read from its config through ``agentlightning_lite.models``):
   q/o, k/v, gate/up, down and the lm head, forward (``F.linear(x, W)``, as the model runs them) and the
   input-gradient GEMM of the backward (``dY @ W``), float32 and bfloat16, at a micro-batch's token
   counts, with torch's default thread count (what the trainer uses). A fresh process; median of
   repeats after a warm-up. The aggregate weighs each shape by its share of a forward's FLOPs.
2. **A step of the demo** (``examples/quickstart.py``: GRPO, group 8, 4 tasks per step, LoRA r16/alpha32,
   micro-batches of 16, the calculator agent of ``examples/calc_agent.py``), ``--steps`` steps of
   ``trainer.fit`` with a fixed seed, in a fresh process per contender: **before** is the code at
   ``--baseline-ref`` (a detached git worktree under /tmp, on ``PYTHONPATH``), **after** is this tree's
   ``src``. The same agent and tasks (this tree's ``examples/``) on both sides. Contenders interleaved
   (before, after, before, after...). The first step of each process is a warm-up; the later ones are
   reported.
3. **Utilisation**: the update's model FLOPs (``perf/update_flops`` when the trainer reports it, else
   counted here from the tokens through the model, see ``FLOPS_NOTE``) over ``timing/update``, against the
   GEMM throughput measured in 1.

    python -m benchmarks.perf.bench_step                     # writes step_results.md / .json
    python -m benchmarks.perf.bench_step --steps 3 --repeats 3
    python -m benchmarks.perf.bench_step --gemm-only --no-write
    python -m benchmarks.perf.bench_step --skip-before --steps 1 --repeats 1 --no-write
    python -m benchmarks.perf.bench_step --trl        # also TRL's GRPOTrainer (bench_grpo_step's worker)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks._harness import cpu_model, load_average
from benchmarks.perf._child import PREFIX, emit
from benchmarks.perf.bench_precision import cpu_flags

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODEL = "smollm2-135m"
NAN = float("nan")
DEFAULT_BASELINE = "39b3a67"  # main before the update's performance work
TRL_VENV = Path("/tmp/agl-trl-venv")
TORCH_PIN = "torch==2.13.0"
#: the trainer's optional per-step counters (absent before they were added: shown as n/a)
PERF_KEYS = (
    "perf/update_tokens",
    "perf/update_flops",
    "perf/update_flops_per_s",
    "perf/prefill_tokens",
    "perf/decode_tokens",
)
FLOPS_NOTE = (
    "Model FLOPs of the update (gradient phase, `timing/update`), when the trainer does not report "
    "`perf/update_flops`: F = 4 N T + 6 N_lora T + 4 H V T_head, with N the non-embedding parameters of the "
    "frozen base (decoder layers; embeddings, lm head and LoRA excluded), N_lora the LoRA parameters, T the "
    "tokens through the decoder with gradient enabled (input_ids as padded or packed: every position the "
    "model computes, counted by a forward pre-hook on the decoder), T_head the positions through the lm "
    "head with gradient (a forward hook on the head; its recomputation in the backward not counted), H V "
    "the head's weight (hidden x vocab). Forward 2 N T; backward about 2 N T (the frozen base computes "
    "input gradients only); LoRA 2 forward + 4 backward (input and weight gradients). Attention's score "
    "and value products, norms and activations are left out (a few % at these lengths), and so is the "
    "forward recomputed under gradient checkpointing (model FLOPs, not hardware FLOPs). The old-logprob "
    "pass (no gradient) is counted alike: 2 (N + N_lora) T + 2 H V T_head. The attainable rate is the "
    "GEMM throughput of the same mix: the update's FLOPs per shape and direction (decoder projections, lm "
    "head; forward and input-gradient) at the measured rate of each, at the measured token count nearest "
    "the update's mean tokens per forward."
)


# -- small helpers -------------------------------------------------------------------------------
def med(xs: list[float]) -> float:
    xs = [float(x) for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else NAN


def _git(*args: str, cwd: Path = ROOT) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def tree_state() -> str:
    """This tree's HEAD and how many files under src/ differ from it."""
    try:
        head, dirty = _git("rev-parse", "--short", "HEAD"), _git("status", "--porcelain", "--", "src")
    except (OSError, RuntimeError):
        return "unknown"
    n = len(dirty.splitlines()) if dirty else 0
    return head + (f" + {n} uncommitted file(s) under src/" if n else "")


def baseline_tree(ref: str) -> tuple[Path, str]:
    """A detached worktree of ``ref`` under /tmp (made once, reused while it is at that commit)."""
    sha = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    path = Path(tempfile.gettempdir()) / f"agl-bench-before-{sha[:10]}"
    if path.exists():
        try:
            if _git("rev-parse", "HEAD", cwd=path) == sha:
                return path, sha
        except RuntimeError:
            pass
        raise SystemExit(f"{path} exists but is not a worktree at {sha[:10]}: remove it first")
    _git("worktree", "add", "--detach", str(path), sha)
    return path, sha


def remove_baseline_tree(path: Path) -> None:
    try:
        _git("worktree", "remove", "--force", str(path))
    except (OSError, RuntimeError) as exc:
        print(f"could not remove the worktree {path}: {exc}", file=sys.stderr)


def spawn(args: list[str], src: Path | None, timeout: float, python: str | None = None) -> dict[str, Any]:
    """``python -m benchmarks.perf.bench_step *args`` in a fresh process with ``src`` first on the path.

    Returns what the child emitted, or ``{"error": ..., "stderr_tail": ...}`` (a crash, a timeout)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    paths = ([str(src)] if src is not None else []) + [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    cmd = [python or sys.executable, "-m", "benchmarks.perf.bench_step", *args]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return {"error": f"timed out after {timeout:.0f} s", "stderr_tail": err[-3000:]}
    wall = time.perf_counter() - t
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith(PREFIX)), None)
    if line is None:
        tail = (proc.stderr or proc.stdout)[-3000:]
        return {"error": f"exit status {proc.returncode}, no result", "stderr_tail": tail}
    res = json.loads(line[len(PREFIX) :])
    res["process_s"] = wall
    if "error" in res and "stderr_tail" not in res:
        res["stderr_tail"] = proc.stderr[-3000:]
    return res


# -- 1. GEMM throughput (child) -----------------------------------------------------------------
def model_dims() -> dict[str, int]:
    """The model's dimensions, from its config (through ``agentlightning_lite.models``)."""
    from transformers import AutoConfig

    from agentlightning_lite import models

    r = models.loadable(MODEL)
    cfg = AutoConfig.from_pretrained(r.path, **r.from_pretrained_kwargs())
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return {
        "hidden": int(cfg.hidden_size),
        "intermediate": int(cfg.intermediate_size),
        "layers": int(cfg.num_hidden_layers),
        "heads": heads,
        "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": head_dim,
        "vocab": int(cfg.vocab_size),
    }


def gemm_shapes(d: dict[str, int]) -> list[dict[str, Any]]:
    """Each distinct weight shape ``[k -> n]`` of a forward and how many such GEMMs a token goes through."""
    h, i, kv = d["hidden"], d["intermediate"], d["kv_heads"] * d["head_dim"]
    q = d["heads"] * d["head_dim"]
    return [
        {"name": "q/o", "k": h, "n": q, "per_token": 2 * d["layers"], "decoder": True},
        {"name": "k/v", "k": h, "n": kv, "per_token": 2 * d["layers"], "decoder": True},
        {"name": "gate/up", "k": h, "n": i, "per_token": 2 * d["layers"], "decoder": True},
        {"name": "down", "k": i, "n": h, "per_token": d["layers"], "decoder": True},
        {"name": "lm head", "k": h, "n": d["vocab"], "per_token": 1, "decoder": False},
    ]


def _time_op(fn: Any, repeats: int, budget_s: float) -> float:
    """Median seconds of ``fn()`` after a warm-up: ``repeats`` runs, fewer (3 at least) past ``budget_s``."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if len(times) >= 3 and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times)


def _gemm_rate(
    make: Any, m: int, k: int, n: int, repeats: int, budget_s: float, max_run_s: float
) -> tuple[float, int]:
    """GFLOP/s of ``make(cols)()`` (a ``[m x k] -> [m x cols]`` GEMM or its input gradient) and the
    columns measured: all ``n``, or fewer when one full GEMM would take longer than ``max_run_s`` (a
    probe on 256 columns predicts it): a slow kernel (bf16 without hardware support) then costs seconds,
    not minutes."""
    probe_n = min(n, 256)
    probe = make(probe_n)
    probe()
    t = time.perf_counter()
    probe()
    predicted = (time.perf_counter() - t) * n / probe_n
    cols = n
    if predicted > max_run_s:
        cols = max(probe_n, int(n * max_run_s / predicted) // 64 * 64)
    secs = _time_op(make(cols), repeats, budget_s)
    return 2.0 * m * k * cols / secs / 1e9, cols


def measure_gemm(tokens: list[int], repeats: int, budget_s: float, max_run_s: float) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    d = model_dims()
    shapes = gemm_shapes(d)
    torch.manual_seed(0)
    rows = []
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for m in tokens:
            for s in shapes:
                k, n = s["k"], s["n"]
                w = torch.randn(n, k, dtype=dtype) * 0.02  # nn.Linear's layout: [out, in]
                x = torch.randn(m, k, dtype=dtype)
                dy = torch.randn(m, n, dtype=dtype)
                with torch.no_grad():
                    fwd, fwd_cols = _gemm_rate(
                        lambda c, x=x, w=w: lambda: F.linear(x, w[:c]), m, k, n, repeats, budget_s, max_run_s
                    )
                    bwd, bwd_cols = _gemm_rate(
                        lambda c, dy=dy, w=w: lambda: torch.matmul(dy[:, :c], w[:c]),
                        m, k, n, repeats, budget_s, max_run_s,
                    )  # fmt: skip
                rows.append(
                    {
                        "dtype": dtype_name,
                        "tokens": m,
                        "shape": s["name"],
                        "k": k,
                        "n": n,
                        "fwd_gflops": fwd,
                        "bwd_gflops": bwd,
                        "fwd_cols": fwd_cols,
                        "bwd_cols": bwd_cols,
                    }
                )
                print(
                    f"gemm {dtype_name} {s['name']:>7} [{m} x {k}] @ [{k} x {n}]: fwd {fwd:.1f}"
                    f"{'' if fwd_cols == n else f' (on {fwd_cols} cols)'}, bwd {bwd:.1f}"
                    f"{'' if bwd_cols == n else f' (on {bwd_cols} cols)'} GFLOP/s",
                    file=sys.stderr,
                    flush=True,
                )
                del w, x, dy
    return {
        "dims": d,
        "shapes": shapes,
        "rows": rows,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "mkldnn_bf16": bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()),
    }


def rate(gemm: dict[str, Any], dtype: str, tokens: int, shape: str, direction: str) -> float:
    for r in gemm["rows"]:
        if r["dtype"] == dtype and r["tokens"] == tokens and r["shape"] == shape:
            return float(r[f"{direction}_gflops"])
    return NAN


def aggregate(gemm: dict[str, Any], dtype: str, tokens: int, direction: str, head: bool = True) -> float:
    """GFLOP/s of a forward's GEMM mix: FLOPs over the sum of each shape's time (FLOP-weighted)."""
    flops = secs = 0.0
    for s in gemm["shapes"]:
        if not head and not s["decoder"]:
            continue
        f = 2.0 * s["k"] * s["n"] * s["per_token"]
        r = rate(gemm, dtype, tokens, s["name"], direction)
        flops, secs = flops + f, secs + f / r
    return flops / secs if secs else NAN


def mix_rate(gemm: dict[str, Any], dtype: str, tokens: int, t_dec: float, t_head: float) -> float:
    """GFLOP/s attainable on an update of ``t_dec`` decoder tokens and ``t_head`` head positions (forward
    and input-gradient GEMMs of each shape at its measured rate)."""
    flops = secs = 0.0
    for s in gemm["shapes"]:
        n_tok = t_dec if s["decoder"] else t_head
        f = 2.0 * s["k"] * s["n"] * s["per_token"] * n_tok
        for direction in ("fwd", "bwd"):
            r = rate(gemm, dtype, tokens, s["name"], direction)
            flops, secs = flops + f, secs + f / r
    return flops / secs if secs else NAN


# -- 2. the demo's steps (child, one contender) ---------------------------------------------------
class Counters:
    """Tokens through the decoder and the lm head, by phase: ``update`` (gradient on), ``old`` (the
    update's no-grad passes), generation left out (engine counters cover it)."""

    def __init__(self) -> None:
        self.in_learn = False
        self.reset()

    def reset(self) -> None:
        self.c = {
            "update_tokens": 0,
            "update_real_tokens": 0,
            "update_calls": 0,
            "update_head": 0,
            "old_tokens": 0,
            "old_calls": 0,
            "old_head": 0,
        }

    @staticmethod
    def _in_backward() -> bool:
        import torch

        try:
            return torch._C._current_graph_task_id() != -1
        except AttributeError:
            return False

    def phase(self) -> str | None:
        import torch

        if self._in_backward():
            return None  # a checkpointed forward recomputed in the backward
        if torch.is_grad_enabled():
            return "update"
        return "old" if self.in_learn else None

    def on_decoder(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        p = self.phase()
        if p is None:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            emb = kwargs.get("inputs_embeds")
            n = int(emb.shape[0] * emb.shape[1]) if emb is not None else 0
        else:
            n = int(ids.numel())
        self.c[f"{p}_tokens"] += n
        self.c[f"{p}_calls"] += 1
        mask = kwargs.get("attention_mask")
        if p == "update":
            real = int(mask.sum()) if mask is not None and getattr(mask, "dim", lambda: 0)() == 2 else n
            self.c["update_real_tokens"] += real

    def on_head(self, module: Any, args: tuple[Any, ...]) -> None:
        p = self.phase()
        if p is None or not args:
            return
        x = args[0]
        self.c[f"{p}_head"] += int(x.numel() // x.shape[-1])


def _param_counts(policy: Any) -> dict[str, int]:
    base, lora, emb = 0, 0, 0
    for name, p in policy.named_parameters():
        if "lora_" in name:
            lora += p.numel()
        elif "embed_tokens" in name or "lm_head" in name:
            emb += p.numel()
        else:
            base += p.numel()
    return {"base_non_embedding": base, "lora": lora, "embedding_and_head": emb}


def run_demo(steps: int, seed: int, batch_size: int = 4, group_size: int = 8) -> dict[str, Any]:
    """Build the demo's trainer (as ``examples/quickstart.py``), ``fit`` ``steps`` steps; per step: wall
    time, the trainer's metrics, engine token counters and the tokens through the model in the update."""
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from calc_agent import calc_agent, make_tasks

    import agentlightning_lite as agl
    from agentlightning_lite.rl.config import RolloutConfig, SampleConfig

    from .bench_grpo_step import cpu_s, peak_rss_mib

    train = make_tasks(steps * batch_size, seed=1000 + seed)
    out: dict[str, Any] = {"package": str(Path(agl.__file__).resolve().parent)}
    with tempfile.TemporaryDirectory(prefix="agl-bench-step-") as tmp:
        t0 = time.perf_counter()
        trainer = agl.Trainer(
            model=MODEL,
            algorithm=agl.GRPO(group_size=group_size, lr=2e-4, micro_batch_size=16),
            lora=agl.LoRA(r=16, alpha=32),
            air=[agl.air.ToolStatus(success=0.1, error=-0.1)],
            credit=agl.credit.Discounted(1.0),
            engine="auto",
            batch_size=batch_size,
            rollout_config=RolloutConfig(timeout=1800, async_rollouts=False),
            sample_config=SampleConfig(max_staleness=None),
            output_dir=tmp,
            seed=seed,
        )
        out["load_s"] = time.perf_counter() - t0
        policy = trainer.policy
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        counters = Counters()
        hooks = []
        try:
            hooks.append(base.get_decoder().register_forward_pre_hook(counters.on_decoder, with_kwargs=True))
            head = base.get_output_embeddings()
            hooks.append(head.register_forward_pre_hook(counters.on_head))
            out["head_weight"] = int(head.weight.numel())
        except (AttributeError, NotImplementedError) as exc:
            out["hooks_error"] = repr(exc)
        learner = getattr(trainer, "learner", None)
        if learner is not None and hasattr(learner, "learn"):
            original_learn = learner.learn

            def learn(*a: Any, **kw: Any) -> Any:
                counters.in_learn = True
                try:
                    return original_learn(*a, **kw)
                finally:
                    counters.in_learn = False

            learner.learn = learn  # type: ignore[method-assign]
        out["params"] = _param_counts(policy)
        out["dtype"] = str(next(policy.parameters()).dtype)
        autocast = getattr(trainer, "autocast", None)
        out["autocast"] = str(autocast).removeprefix("torch.") if autocast is not None else None
        out["gradient_checkpointing"] = bool(getattr(trainer, "gradient_checkpointing", False))
        out["threads"] = torch.get_num_threads()
        engine = trainer.engine
        stats = getattr(engine, "stats", None)

        marks: list[dict[str, Any]] = []
        original_log = trainer.metrics.log
        engine_prev = dict(stats) if isinstance(stats, dict) else {}
        cpu_prev = cpu_s()

        def log(step: int, metrics: dict[str, Any]) -> None:
            nonlocal engine_prev, cpu_prev
            now, cpu = time.perf_counter(), cpu_s()
            es = dict(engine.stats) if isinstance(getattr(engine, "stats", None), dict) else {}
            marks.append(
                {
                    "t": now,
                    "cpu_s": cpu - cpu_prev,
                    "counters": dict(counters.c),
                    "engine_prompt_tokens": es.get("prompt_tokens", 0) - engine_prev.get("prompt_tokens", 0),
                    "engine_generated_tokens": es.get("generated_tokens", 0)
                    - engine_prev.get("generated_tokens", 0),
                    "engine_batches": es.get("batches", 0) - engine_prev.get("batches", 0),
                    "engine_requests": es.get("requests", 0) - engine_prev.get("requests", 0),
                }
            )
            counters.reset()
            engine_prev, cpu_prev = es, cpu
            original_log(step, metrics)

        trainer.metrics.log = log  # type: ignore[method-assign]
        t_fit = time.perf_counter()
        trainer.fit(calc_agent, train, steps=steps)
        rows = [r for r in trainer.metrics.rows() if "train/rollouts" in r or "time/update_s" in r]
        for h in hooks:
            h.remove()
        trainer.close()
    per_step = []
    prev = t_fit
    for k, (row, mark) in enumerate(zip(rows, marks, strict=False)):
        per_step.append(
            {
                "step": k,
                "wall_s": mark["t"] - prev,
                **{key: v for key, v in mark.items() if key != "t"},
                "metrics": {key: v for key, v in row.items() if isinstance(v, (int, float))},
            }
        )
        prev = mark["t"]
    out["steps"] = per_step
    out["peak_rss_mib"] = peak_rss_mib()
    return out


# -- 3. derived numbers -----------------------------------------------------------------------------
def step_numbers(run: dict[str, Any], step: dict[str, Any], gemm: dict[str, Any] | None) -> dict[str, float]:
    """One step's figures for the table (NaN where unknown)."""
    m, c = step["metrics"], step["counters"]
    g = lambda k: float(m.get(k, NAN))  # noqa: E731
    p = run.get("params", {})
    n_base, n_lora, hv = p.get("base_non_embedding", 0), p.get("lora", 0), run.get("head_weight", 0)
    t_upd, t_head = float(c["update_tokens"]), float(c["update_head"])
    if not t_upd:  # no hook data: the samples' own lengths (unpadded) and trained tokens
        t_upd, t_head = g("train/sequence_tokens"), g("train/response_tokens")
    flops_est = 4.0 * n_base * t_upd + 6.0 * n_lora * t_upd + 4.0 * hv * t_head
    old_flops = 2.0 * (n_base + n_lora) * c["old_tokens"] + 2.0 * hv * c["old_head"]
    upd_s, old_s = g("timing/update"), g("timing/old_logprobs")
    flops = g("perf/update_flops") if "perf/update_flops" in m else flops_est
    out: dict[str, float] = {
        "wall_s": step["wall_s"],
        "cpu_s": step["cpu_s"],
        "rollouts_s": g("time/rollouts_s"),
        "update_s": g("time/update_s"),
        "gen_tokens": float(step["engine_generated_tokens"]),
        "prefill_tokens": float(step["engine_prompt_tokens"]),
        "engine_batches": float(step["engine_batches"]),
        "sequences": g("train/sequences"),
        "sequence_tokens": g("train/sequence_tokens"),
        "response_tokens": g("train/response_tokens"),
        "update_tokens_counted": float(c["update_tokens"]),
        "update_real_tokens": float(c["update_real_tokens"]),
        "update_forwards": float(c["update_calls"]),
        "update_head_positions": float(c["update_head"]),
        "old_tokens_counted": float(c["old_tokens"]),
        "update_flops_est": flops_est,
        "update_flops": flops,
        "update_gflops_s": flops / upd_s / 1e9 if upd_s and upd_s == upd_s else NAN,
        "old_gflops_s": old_flops / old_s / 1e9 if old_s and old_s == old_s and old_flops else NAN,
        "reward_mean": g("train/reward_mean"),
    }
    out["other_s"] = out["wall_s"] - out["rollouts_s"] - out["update_s"]
    own = "bf16" if "bfloat16" in str(run.get("autocast") or run.get("dtype")) else "fp32"
    for k, v in m.items():
        if k.startswith("timing/") or k.startswith("perf/"):
            out[k] = float(v)
    if gemm is not None and c["update_calls"]:
        per_fwd = c["update_tokens"] / c["update_calls"]
        tokens = min({r["tokens"] for r in gemm["rows"]}, key=lambda t: abs(t - per_fwd))
        for dt_name in ("fp32", "bf16"):
            peak = mix_rate(gemm, dt_name, tokens, t_upd, t_head)
            out[f"peak_{dt_name}_gflops_s"] = peak
            out[f"util_{dt_name}"] = out["update_gflops_s"] / peak if peak == peak else NAN
        out["peak_tokens"] = float(tokens)
        out["util_own"] = out[f"util_{own}"]
    return out


def summarise(runs: list[dict[str, Any]], gemm: dict[str, Any] | None) -> dict[str, Any]:
    """Medians over the reported steps (all but each process's first, unless it ran one) of every process."""
    ok = [r for r in runs if r.get("steps")]
    if not ok:
        return {}
    nums = []
    for r in ok:
        reported = r["steps"][1:] if len(r["steps"]) > 1 else r["steps"]
        nums += [step_numbers(r, s, gemm) for s in reported]
    keys = sorted({k for n in nums for k in n})
    out: dict[str, Any] = {k: med([n.get(k, NAN) for n in nums]) for k in keys}
    out["present"] = sorted({k for n in nums for k in n if k.startswith(("timing/", "perf/"))})
    out["n_steps"] = len(nums)
    out["step_min_s"] = min(n["wall_s"] for n in nums)
    out["step_max_s"] = max(n["wall_s"] for n in nums)
    out["load_s"] = med([r.get("load_s", NAN) for r in ok])
    out["cold_step_s"] = (
        med([r["steps"][0]["wall_s"] for r in ok]) if any(len(r["steps"]) > 1 for r in ok) else NAN
    )
    out["peak_rss_mib"] = med([r.get("peak_rss_mib", NAN) for r in ok])
    first = ok[0]
    out["precision"] = first.get("autocast") or first.get("dtype", "?").removeprefix("torch.")
    out["gradient_checkpointing"] = first.get("gradient_checkpointing")
    out["threads"] = first.get("threads")
    out["params"] = first.get("params")
    return out


# -- the report -------------------------------------------------------------------------------------
def _f(x: Any, fmt: str) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "n/a"
    return fmt.format(x)


def _sliced(gemm: dict[str, Any], dtype: str, tokens: int, shape: dict[str, Any], direction: str) -> str:
    """``*`` when that GEMM was measured on fewer columns than the model has (see ``_gemm_rate``)."""
    for r in gemm["rows"]:
        if r["dtype"] == dtype and r["tokens"] == tokens and r["shape"] == shape["name"]:
            return "*" if r.get(f"{direction}_cols", shape["n"]) < shape["n"] else ""
    return ""


def gemm_table(gemm: dict[str, Any]) -> list[str]:
    tokens = sorted({r["tokens"] for r in gemm["rows"]})
    head = "| shape [k -> n] | " + " | ".join(
        f"{dt_name} {m} tok fwd / bwd" for dt_name in ("fp32", "bf16") for m in tokens
    )
    lines = [head + " |", "|---|" + "---:|" * (2 * len(tokens))]
    for s in gemm["shapes"]:
        cells = [
            f"{rate(gemm, d, m, s['name'], 'fwd'):.1f}{_sliced(gemm, d, m, s, 'fwd')} / "
            f"{rate(gemm, d, m, s['name'], 'bwd'):.1f}{_sliced(gemm, d, m, s, 'bwd')}"
            for d in ("fp32", "bf16")
            for m in tokens
        ]
        lines.append(f"| {s['name']} [{s['k']} -> {s['n']}] x{s['per_token']} | " + " | ".join(cells) + " |")
    for label, head_in in (
        ("**aggregate** (FLOP-weighted, with lm head)", True),
        ("decoder layers only", False),
    ):
        cells = [
            f"{aggregate(gemm, d, m, 'fwd', head_in):.1f} / {aggregate(gemm, d, m, 'bwd', head_in):.1f}"
            for d in ("fp32", "bf16")
            for m in tokens
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


ROWS: list[tuple[str, str, str]] = [  # label, key, format; a key in "present" only when some side has it
    ("load: trainer built (s)", "load_s", "{:.1f}"),
    ("**step, wall (s)**", "wall_s", "**{:.1f}**"),
    ("fastest / slowest step (s)", "", ""),
    ("first (warm-up) step (s)", "cold_step_s", "{:.1f}"),
    ("step: process CPU time (s)", "cpu_s", "{:.1f}"),
    ("**rollouts** (`time/rollouts_s`)", "rollouts_s", "**{:.1f}**"),
    (
        "**update** (`time/update_s`: old logprobs + advantages + gradient + weights)",
        "update_s",
        "**{:.1f}**",
    ),
    ("rest of the step (samples, logging)", "other_s", "{:.2f}"),
    ("tokens generated (engine)", "gen_tokens", "{:.0f}"),
    ("prompt tokens prefilled (engine, before any prefix reuse)", "prefill_tokens", "{:.0f}"),
    ("engine batches", "engine_batches", "{:.0f}"),
    ("samples trained (`train/sequences`)", "sequences", "{:.0f}"),
    ("sequence tokens (`train/sequence_tokens`: prompt + response)", "sequence_tokens", "{:.0f}"),
    ("trained tokens (`train/response_tokens`)", "response_tokens", "{:.0f}"),
    (
        "tokens through the decoder with gradient (counted, as padded/packed)",
        "update_tokens_counted",
        "{:.0f}",
    ),
    ("... of them real (attention mask)", "update_real_tokens", "{:.0f}"),
    ("forward passes with gradient", "update_forwards", "{:.0f}"),
    ("lm-head positions with gradient", "update_head_positions", "{:.0f}"),
    ("tokens through the decoder without gradient (old logprobs)", "old_tokens_counted", "{:.0f}"),
    ("update model GFLOP, fwd + bwd (`perf/update_flops`, else counted here)", "update_flops", "{:.1f}"),
    ("update achieved GFLOP/s (FLOPs / `timing/update`)", "update_gflops_s", "{:.1f}"),
    ("attainable GFLOP/s at the update's mix, fp32", "peak_fp32_gflops_s", "{:.1f}"),
    ("attainable GFLOP/s at the update's mix, bf16", "peak_bf16_gflops_s", "{:.1f}"),
    ("**update utilisation vs the GEMM of its own precision**", "util_own", "**{:.0%}**"),
    ("update utilisation vs fp32 GEMM", "util_fp32", "{:.0%}"),
    ("update utilisation vs bf16 GEMM", "util_bf16", "{:.0%}"),
    ("old-logprob pass achieved GFLOP/s", "old_gflops_s", "{:.1f}"),
    ("mean reward (`train/reward_mean`)", "reward_mean", "{:.3f}"),
    ("peak RSS of the process (MiB)", "peak_rss_mib", "{:.0f}"),
]
SCALE = {"update_flops": 1e-9, "perf/update_flops": 1e-9, "perf/update_flops_per_s": 1e-9}
RATIO_KEYS = {"wall_s", "rollouts_s", "update_s", "cpu_s", "load_s", "cold_step_s", "timing/update"}


def step_table(
    before: dict[str, Any] | None, after: dict[str, Any] | None, labels: tuple[str, str]
) -> list[str]:
    lines = [
        f"| per step (median of the reported steps) | before ({labels[0]}) | after ({labels[1]}) "
        "| after / before |",
        "|---|---:|---:|---:|",
    ]
    sides = (before, after)

    def cell(side: dict[str, Any] | None, key: str, fmt: str) -> str:
        if not side:
            return "failed" if side is not None else "n/a"
        v = side.get(key, NAN)
        if isinstance(v, float) and key in SCALE:
            v = v * SCALE[key]
        return _f(v, fmt)

    def ratio(key: str) -> str:
        a, b = before.get(key, NAN) if before else NAN, after.get(key, NAN) if after else NAN
        return f"{b / a:.2f}x" if key in RATIO_KEYS and a == a and b == b and a else ""

    timing = sorted({k for s in sides if s for k in s.get("present", []) if k.startswith("timing/")})
    for label, key, fmt in ROWS:
        if key == "":
            cells = [f"{s['step_min_s']:.1f} / {s['step_max_s']:.1f}" if s else "n/a" for s in sides]
            lines.append(f"| {label} | {cells[0]} | {cells[1]} | |")
            continue
        lines.append(f"| {label} | {cell(before, key, fmt)} | {cell(after, key, fmt)} | {ratio(key)} |")
        if key == "other_s":
            for t in timing:
                lines.append(
                    f"| `{t}` (s) | {cell(before, t, '{:.2f}')} | {cell(after, t, '{:.2f}')} | {ratio(t)} |"
                )
            for p in PERF_KEYS:
                fmt_p = "{:.1f}" if p in SCALE else "{:.0f}"
                unit = {"perf/update_flops": " (GFLOP)", "perf/update_flops_per_s": " (GFLOP/s)"}.get(p, "")
                lines.append(f"| `{p}`{unit} | {cell(before, p, fmt_p)} | {cell(after, p, fmt_p)} | |")
    for label, key in (
        ("update precision (autocast, else weights)", "precision"),
        ("gradient checkpointing", "gradient_checkpointing"),
        ("torch threads", "threads"),
    ):
        lines.append(f"| {label} | {(before or {}).get(key, 'n/a')} | {(after or {}).get(key, 'n/a')} | |")
    return lines


def trl_summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    ok = [r for r in runs if r.get("steps")]
    steps = [s for r in ok for s in (r["steps"][1:] if len(r["steps"]) > 1 else r["steps"])]
    if not steps:
        return {}
    return {
        "wall_s": med([s["wall_s"] for s in steps]),
        "gen_s": med([s["gen_s"] for s in steps]),
        "update_s": med([s["update_s"] for s in steps]),
        "tokens": med([s["tokens"] for s in steps]),
        "load_s": med([r["load_s"] for r in ok]),
    }


# -- TRL (bench_grpo_step's worker, in a Python that has trl) -------------------------------------
def trl_python() -> str:
    """A Python with ``trl``: this one if it imports it, else /tmp/agl-trl-venv (made once: torch pinned
    first, so pip keeps the CPU build, then trl, datasets and this project's serving extras)."""
    probe = subprocess.run([sys.executable, "-c", "import trl"], capture_output=True, check=False)
    if probe.returncode == 0:
        return sys.executable
    py = TRL_VENV / "bin" / "python"
    ready = TRL_VENV / ".ready"
    if not ready.exists():
        print(f"trl is not importable here: making {TRL_VENV} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, TORCH_PIN], check=True)
        subprocess.run([*pip, TORCH_PIN, "trl", "datasets", f"{ROOT}[serve]"], check=True)
        ready.write_text("ok\n")
    return str(py)


def spawn_trl(steps: int, timeout: float) -> dict[str, Any]:
    from dataclasses import asdict

    from .bench_grpo_step import Config

    try:
        py = trl_python()
    except (OSError, subprocess.CalledProcessError) as exc:
        return {"error": f"no Python with trl: {exc}", "stderr_tail": ""}
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [py, "-m", "benchmarks.perf.bench_grpo_step", "--worker", "trl", "--json", str(out)]
    cmd += ["--config", json.dumps(asdict(Config(steps=max(steps, 1))))]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "stderr_tail": ""}
    if proc.returncode != 0 or not out.exists() or not out.read_text().strip():
        out.unlink(missing_ok=True)
        return {
            "error": f"exit status {proc.returncode}",
            "stderr_tail": (proc.stderr or proc.stdout)[-3000:],
        }
    res = json.loads(out.read_text())
    out.unlink()
    res["process_s"] = time.perf_counter() - t
    res["python"] = py
    return res


# -- main -----------------------------------------------------------------------------------------
def _versions(python: str = sys.executable) -> dict[str, str]:
    code = (
        "import json; from importlib.metadata import version as v\n"
        "out = {}\n"
        "for n in ('torch', 'transformers', 'peft'):\n"
        "    try: out[n] = v(n)\n"
        "    except Exception: out[n] = 'not installed'\n"
        "print(json.dumps(out))"
    )
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {}


def _step_desc(s: dict[str, Any]) -> str:
    """One step, one line: wall time, rollouts (TRL: generation) and update."""
    m = s.get("metrics", {})
    gen, upd = m.get("time/rollouts_s", s.get("gen_s", NAN)), m.get("time/update_s", s.get("update_s", NAN))
    return f"{s['wall_s']:.1f} s (rollouts {gen:.1f} + update {upd:.1f})"


def _fail_line(who: str, res: dict[str, Any]) -> str:
    tail = "\n".join(res.get("stderr_tail", "").strip().splitlines()[-15:])
    return f"{who} FAILED: {res.get('error')}\n{tail}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.perf.bench_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--steps", type=int, default=2, help="training steps per process (the first is warm-up)")
    ap.add_argument("--repeats", type=int, default=2, help="fresh processes per contender (interleaved)")
    ap.add_argument("--baseline-ref", default=DEFAULT_BASELINE, help="git ref of 'before'")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=4, help="tasks per step (the demo's: 4)")
    ap.add_argument("--group-size", type=int, default=8, help="rollouts per task (the demo's: 8)")
    ap.add_argument("--gemm-only", action="store_true", help="only the GEMM throughput")
    ap.add_argument("--skip-before", action="store_true", help="only this tree's steps (no baseline)")
    ap.add_argument("--skip-gemm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trl", action="store_true", help="also TRL's GRPOTrainer (bench_grpo_step's worker)")
    ap.add_argument("--gemm-tokens", default="512,2048", help="GEMM token counts (rows), comma-separated")
    ap.add_argument("--gemm-repeats", type=int, default=7, help="GEMM repeats per shape (at least 3)")
    ap.add_argument("--gemm-budget-s", type=float, default=2.0, help="stop repeating a GEMM after this")
    ap.add_argument(
        "--gemm-max-run-s",
        type=float,
        default=1.0,
        help="a GEMM that one run would take longer than this is measured on fewer columns",
    )
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per contender process")
    ap.add_argument("--keep-baseline", action="store_true", help="keep the baseline worktree under /tmp")
    ap.add_argument("--out", type=Path, default=HERE / "step_results.md")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--worker", choices=("gemm", "demo"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:  # a child: one measurement, one RESULT line
        try:
            if args.worker == "gemm":
                tokens = [int(x) for x in args.gemm_tokens.split(",") if x.strip()]
                res = measure_gemm(tokens, max(3, args.gemm_repeats), args.gemm_budget_s, args.gemm_max_run_s)
            else:
                res = run_demo(args.steps, args.seed, args.batch_size, args.group_size)
        except BaseException as exc:
            traceback.print_exc()
            res = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            res["stderr_tail"] = res["traceback"]
        emit(res)
        return res

    cmd = "python -m benchmarks.perf.bench_step" + (
        "" if not (argv or sys.argv[1:]) else " " + shlex.join(argv or sys.argv[1:])
    )
    load_start, t_all, started = load_average(), time.perf_counter(), dt.datetime.now()
    print(f"{cmd}\nload average at start: {load_start}", flush=True)
    gemm: dict[str, Any] | None = None
    if not args.skip_gemm:
        gemm = spawn(
            ["--worker", "gemm", "--gemm-tokens", args.gemm_tokens, "--gemm-repeats", str(args.gemm_repeats),
             "--gemm-budget-s", str(args.gemm_budget_s), "--gemm-max-run-s", str(args.gemm_max_run_s)],
            ROOT / "src",
            timeout=args.timeout,
        )  # fmt: skip
        if "error" in gemm:
            print(_fail_line("GEMM", gemm), flush=True)
            gemm = None
        else:
            print("\n".join(gemm_table(gemm)), flush=True)

    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": [], "trl": []}
    baseline: tuple[Path, str] | None = None
    labels = ("skipped", tree_state())
    if not args.gemm_only:
        if not args.skip_before:
            baseline = baseline_tree(args.baseline_ref)
            labels = (baseline[1][:7], labels[1])
        order = (["before"] if baseline else []) + ["after"] + (["trl"] if args.trl else [])
        demo_args = ["--worker", "demo", "--steps", str(args.steps), "--seed", str(args.seed)]
        demo_args += ["--batch-size", str(args.batch_size), "--group-size", str(args.group_size)]
        try:
            for i in range(args.repeats):
                for who in order:
                    if who == "trl":
                        res = spawn_trl(args.steps, args.timeout)
                    else:
                        src = (baseline[0] if who == "before" and baseline else ROOT) / "src"
                        res = spawn(demo_args, src, timeout=args.timeout)
                        if "package" in res and not res["package"].startswith(str(src)):
                            res = {"error": f"imported {res['package']}, not {src}", "stderr_tail": ""}
                    runs[who].append(res)
                    if "error" in res:
                        print(f"[{i + 1}/{args.repeats}] " + _fail_line(who, res), flush=True)
                        continue
                    steps = res["steps"]
                    desc = ", ".join(_step_desc(s) for s in steps)
                    print(
                        f"[{i + 1}/{args.repeats}] {who:>6}: load {res['load_s']:.1f} s; steps {desc}",
                        flush=True,
                    )
        finally:
            if baseline is not None and not args.keep_baseline:
                remove_baseline_tree(baseline[0])

    load_end = load_average()
    total_min = (time.perf_counter() - t_all) / 60
    # None: not run ("n/a" in the table); {}: every process of that side failed ("failed")
    before = summarise(runs["before"], gemm) if runs["before"] else None
    after = summarise(runs["after"], gemm) if runs["after"] else None
    trl = trl_summary(runs["trl"]) if args.trl else {}
    versions = _versions()
    threads = gemm["threads"] if gemm else (after or before or {}).get("threads", "?")
    lines = [
        "# One training step of the demo, before and after, against the machine's GEMM throughput",
        "",
        f"Command (from the repository root): `{cmd}`",
        "",
        f"Date {started:%Y-%m-%d %H:%M}; machine: {cpu_model()}, {os.cpu_count()} CPU cores; Python "
        f"{platform.python_version()}, torch {versions.get('torch', '?')} ({threads} threads, torch's "
        f"default), transformers {versions.get('transformers', '?')}, peft {versions.get('peft', '?')}. "
        f"Load average (1/5/15 min) at start: {load_start}; at end: {load_end}. Benchmark wall time "
        f"{total_min:.1f} min.",
        "",
    ]
    if gemm is not None:
        d = gemm["dims"]
        lines += [
            f"## GEMM throughput (GFLOP/s), `{MODEL}` shapes",
            "",
            f"Model dimensions from its config: hidden {d['hidden']}, intermediate {d['intermediate']}, "
            f"{d['layers']} layers, {d['heads']} heads / {d['kv_heads']} kv heads of {d['head_dim']}, vocab "
            f"{d['vocab']}. Forward `F.linear(x[tokens x k], W[n x k])`; backward the input gradient "
            "`dY[tokens x n] @ W[n x k]`. Median of up to "
            f"{args.gemm_repeats} runs after a warm-up (at least 3; fewer past {args.gemm_budget_s:g} s), "
            f"{gemm['threads']} torch threads, a fresh process. x{{count}}: GEMMs of that shape per token in "
            "a forward (the aggregate's weights: FLOPs over the sum of the shapes' times). *: one full GEMM "
            f"would have taken over {args.gemm_max_run_s:g} s (predicted from 256 columns), so it was "
            "measured on fewer output columns (forward) or fewer inner columns (backward). mkldnn bf16 "
            f"supported: {gemm['mkldnn_bf16']}; CPU flags: {cpu_flags()}.",
            "",
            *gemm_table(gemm),
            "",
        ]
    if not args.gemm_only:
        git_line = (
            f"before = `{args.baseline_ref}` ({labels[0]}, a detached worktree on `PYTHONPATH`)"
            if baseline
            else "before: skipped"
        )
        lines += [
            "## A step of the demo",
            "",
            f"{git_line}; after = this tree's `src` ({labels[1]}). `examples/quickstart.py`'s trainer "
            f"(GRPO group {args.group_size}, {args.batch_size} tasks per step, LoRA r16/alpha32, "
            "micro_batch_size 16, lr 2e-4, "
            "ToolStatus AIR, Discounted(1.0) credit, engine auto, seed "
            f"{args.seed}) and agent (`examples/calc_agent.py`, this tree's on both sides), "
            f"`trainer.fit(calc_agent, tasks, steps={args.steps})` in a fresh process per contender, "
            f"{args.repeats} per contender, interleaved (before, after, ...). Step wall time: from one "
            "step's metrics row to the next (the first from the call of `fit`); the first step of each "
            "process is a warm-up, the others are reported (medians; one step per process when "
            "`--steps 1`). Rollouts and update: the trainer's `time/rollouts_s` and `time/update_s`; the "
            "`timing/...` and `perf/...` keys as the trainer logs them in `metrics.jsonl` (n/a: not "
            "reported by that code). Tokens generated and prefilled: the engine's counters.",
            "",
            *step_table(before, after, labels),
            "",
            f"**FLOPs.** {FLOPS_NOTE}",
            "",
        ]
        for who in ("before", "after", "trl"):
            for k, r in enumerate(runs[who]):
                if "error" in r:
                    tail = "\n".join(r.get("stderr_tail", "").strip().splitlines()[-15:])
                    lines += [f"{who} process {k + 1} failed: {r['error']}", "", "```", tail, "```", ""]
        if args.trl:
            lines += [
                "## TRL GRPOTrainer (peer)",
                "",
                "`benchmarks.perf.bench_grpo_step`'s TRL worker (its own workload: 4 chat prompts x 8, "
                "32 new tokens, one call per rollout, the same model, LoRA, group and lr; fp32, gradient "
                "checkpointing off), "
                f"{args.steps} steps per process, the first a warm-up.",
                "",
                "| TRL, per step (median) | s |",
                "|---|---:|",
                *(
                    [
                        f"| step, wall | {trl['wall_s']:.1f} |",
                        f"| generation + reward | {trl['gen_s']:.1f} |",
                        f"| update | {trl['update_s']:.1f} |",
                        f"| tokens generated | {trl['tokens']:.0f} |",
                    ]
                    if trl
                    else ["| failed | |"]
                ),
                "",
            ]
        raw = []
        for who in ("before", "after"):
            for k, r in enumerate(runs[who]):
                if "steps" in r:
                    raw.append(
                        f"- {who} {k + 1}: load {r['load_s']:.1f} s; steps "
                        + ", ".join(
                            f"{s['wall_s']:.1f} s ({s['engine_generated_tokens']} tok generated)"
                            for s in r["steps"]
                        )
                    )
        if raw:
            lines += ["Per process (steps in order):", "", *raw, ""]
    text = "\n".join(lines)
    print("\n" + text)
    results = {
        "command": cmd,
        "date": started.isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "versions": versions,
        "load_average": {"start": load_start, "end": load_end},
        "baseline": {"ref": args.baseline_ref, "sha": baseline[1]} if baseline else None,
        "after": labels[1],
        "gemm": gemm,
        "summary": {"before": before, "after": after, "trl": trl},
        "runs": runs,
        "flops_formula": FLOPS_NOTE,
    }
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
        print(f"\nwrote {args.out} and {args.out.with_suffix('.json').name}")
    return results


if __name__ == "__main__":
    main()
