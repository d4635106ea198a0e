"""One rank of data-parallel updates on fixed samples (run by tests/rl/test_distributed.py).

``python _dist_worker.py OUT JOB [JOB ...]`` under ``torchrun`` (or with RANK/WORLD_SIZE/MASTER_* set by
hand), or alone for the single-process reference. A JOB is an algorithm and its options joined by commas
(``grpo``, ``grpo-odd,fsdp``, ``sft,fsdp,gc``, ``grpo,die``); the jobs run one after the other in one
launch (one process group), each on a fresh model. Each writes ``OUT/JOB/rank<r>.json``: the adapter (and
value head) after the update, its checksum, whether all ranks agreed, and the update's metrics.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests._helpers

from tests._helpers import leave_after_launch, tiny_llama

from agentlightning_lite.rl._runtime import is_checkpointing
from agentlightning_lite.rl.batching import Sample
from agentlightning_lite.rl.distributed import DataParallel
from agentlightning_lite.rl.grpo import GRPO
from agentlightning_lite.rl.policies import ValueHead
from agentlightning_lite.rl.ppo import PPO
from agentlightning_lite.rl.sft import SFT, sft_update
from agentlightning_lite.rl.update import UpdateSettings, optimise


def samples() -> list[Sample]:
    """Eight calls of four rollouts, of uneven lengths (so the token split has work to do)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(8):
        p = int(torch.randint(3, 12, (1,), generator=g))
        r = int(torch.randint(2, 15, (1,), generator=g))
        out.append(
            Sample(
                prompt_ids=torch.randint(0, 256, (p,), generator=g).tolist(),
                response_ids=torch.randint(0, 256, (r,), generator=g).tolist(),
                engine_logprobs=None,
                reward=float(i % 2),
                group=("task", i // 4),
                advantage=(1.0 if i % 2 else -1.0) * (0.5 + 0.1 * i),
                rollout_id=f"r{i // 2}",
                index=i % 2,
                meta={"policy": "policy"},
            )
        )
    return out


def main() -> None:
    out, jobs = Path(sys.argv[1]), sys.argv[2:]
    dp = DataParallel.from_env(timeout_s=float(os.environ.get("AGL_TEST_PG_TIMEOUT", "20")))
    for job in jobs:
        run(out / job, job.split(","), dp)
    if dp:
        dp.close()


def run(out_dir: Path, job: list[str], dp: DataParallel | None) -> None:
    algo_name, options = job[0], job[1:]
    die = "die" in options
    rank = dp.rank if dp else 0
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(3)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.02)  # a live adapter, not the zero init
    base_numel = sum(p.numel() for n, p in model.named_parameters() if "layers" in n and "lora_" not in n)
    if "gc" in options:  # non-reentrant checkpointing, as UpdateConfig(gradient_checkpointing=True)
        from agentlightning_lite.rl._runtime import enable_gradient_checkpointing

        enable_gradient_checkpointing(model)
    if "fsdp" in options and dp is not None:
        from agentlightning_lite.rl.fsdp import shard_base

        shard_base(model, dp)  # each rank keeps half of every decoder layer's frozen weights
    layer_numel = sum(  # what this rank holds of them: a DTensor's local shard
        (p.to_local() if hasattr(p, "to_local") else p).numel()
        for n, p in model.named_parameters()
        if "layers" in n and "lora_" not in n
    )
    algo = {
        "grpo": lambda: GRPO(micro_batch_size=2, mini_batch_size=4, epochs=2, lr=1e-2),
        "grpo-odd": lambda: GRPO(micro_batch_size=3, epochs=2, lr=1e-2),  # 3 micro-batches on 2 ranks
        "grpo-rollout": lambda: GRPO(
            micro_batch_size=1, epochs=1, lr=1e-2, loss_agg="rollout-mean-token-mean", kl_coef=0.05
        ),
        "ppo": lambda: PPO(micro_batch_size=2, mini_batch_size=4, epochs=2, lr=1e-2),
        "sft": lambda: SFT(micro_batch_size=2, mini_batch_size=4, epochs=2, lr=1e-2),
    }[algo_name]()
    head = ValueHead(32) if getattr(algo, "needs_values", False) else None
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    params = [p for p in model.parameters() if p.requires_grad] + (list(head.parameters()) if head else [])
    opt = torch.optim.AdamW(params, lr=algo.lr, weight_decay=0.01)
    # rank 0 makes the samples; the others get them by broadcast
    mine = samples() if rank == 0 else None
    batch = dp.broadcast_samples(mine) if dp else mine
    assert batch is not None
    if die and rank == 1:

        def dead(_params: object) -> None:
            os._exit(3)  # killed mid-step: after its forward/backward, before the all-reduce

        dp.all_reduce_grads = dead  # type: ignore[union-attr,method-assign]
    if isinstance(algo, SFT):  # the active DataParallel is picked up, as under Trainer.fit
        metrics = sft_update(model, opt, batch, algo, pad_id=257, seed=5)
    else:
        cfg = UpdateSettings(device=torch.device("cpu"), pad_id=257, data_parallel=dp)
        metrics = optimise(model, batch, algo, opt, head, cfg)
    state = {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}
    if head is not None:
        state.update({f"value_head.{n}": p.detach() for n, p in head.named_parameters()})
    digest = dp.checksum(state.items()) if dp else ""
    agree = dp.all_equal(digest) if dp else True
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "state": {n: t.tolist() for n, t in state.items()},
                "moved": max(float((state[n] - before[n]).abs().max()) for n in before),
                "checksum": digest,
                "all_equal": agree,
                "metrics": metrics,
                "samples": len(batch),
                "checkpointing": is_checkpointing(model),
                "layer_numel": layer_numel,  # this rank's decoder-layer frozen weights
                "base_numel": base_numel,  # all of them
                "process_group": torch.distributed.is_initialized(),
            }
        )
    )


if __name__ == "__main__":
    main()
    leave_after_launch()
