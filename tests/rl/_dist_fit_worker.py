"""One rank of ``Trainer.fit`` under torchrun (run by tests/rl/test_distributed.py).

``python -m torch.distributed.run --nproc_per_node 2 _dist_fit_worker.py OUT STEPS [resume] [sft]
[served=URL,MODEL_DIR | served=launch,MODEL_DIR] [fsdp]``: GRPO
(or SFT on the policy's own replies) on the tiny Llama served in-process, a checkpoint every step
into ``OUT``; writes ``OUT/fit-rank<r>.json`` (the step reached, the adapter's checksum, the last
metrics). It ends as a user's script does, with no call to end the process: ``Trainer.fit`` under a
launcher makes a successful run end with status 0 (``distributed.end_cleanly_at_exit``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests._helpers

from tests._helpers import tiny_llama

import agentlightning_lite as agl
from agentlightning_lite.rl.config import CheckpointConfig, LoggingConfig, UpdateConfig
from agentlightning_lite.rl.distributed import DataParallel, detect
from agentlightning_lite.serving.engines import HFEngine
from agentlightning_lite.serving.tokenizer import ByteTokenizer


def varied(task: dict, llm: agl.LLM) -> float:
    """Rewards replies with more distinct characters: a spread in every group, so GRPO has a gradient."""
    reply = llm.openai_client().chat.completions.create(
        model=llm.model, max_tokens=8, temperature=1.0, messages=[{"role": "user", "content": task["q"]}]
    )
    return len(set(reply.choices[0].message.content or "")) / 8.0


def main() -> None:
    out, steps, extra = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    resume = "resume" in extra
    algorithm: agl.GRPO | agl.SFT = agl.GRPO(group_size=4, lr=1e-2, micro_batch_size=2)
    if "sft" in extra:
        algorithm = agl.SFT(group_size=4, lr=1e-2, micro_batch_size=2, mini_batch_size=4)
    launch = detect()
    rank = launch.rank if launch else 0
    lora = agl.LoRA(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    served = next((a.split("=", 1)[1].split(",") for a in extra if a.startswith("served=")), None)
    engine: Any
    dp = None
    if served is None:  # the HF engine serves the training model itself
        engine = HFEngine(
            tiny_llama(), tokenizer=ByteTokenizer(), lora=lora, seed=0, model_name="tiny", num_threads=1
        )
        options: dict[str, Any] = {"engine": engine}
    elif served[0] == "launch":  # engine="vllm" starts its server (a stand-in `vllm` on PATH)
        dp = DataParallel.from_env()
        engine = None
        options = {
            "model": served[1],
            "engine": "vllm",
            "lora": lora,
            "engine_options": {"check_version": False, "max_model_len": 512, "log_dir": str(out / "logs")},
        }
    else:  # a server with its own weights (the vLLM engine attached to a PolicyServer) serves
        url, model_dir = served
        dp = DataParallel.from_env()  # before the Trainer, as on GPUs
        engine = None
        options = {
            "model": model_dir,
            "engine": "vllm",
            "lora": lora,
            "engine_options": {"url": [url], "check_version": False, "max_model_len": 512},
        }
    trainer = agl.Trainer(
        **options,
        algorithm=algorithm,
        batch_size=2,
        store=agl.MemoryStore(),
        output_dir=out,
        logging_config=LoggingConfig(loggers=[]),
        checkpoint_config=CheckpointConfig(save_every=1),
        update_config=UpdateConfig(old_logprobs="recompute"),
    )
    if "fsdp" in extra:
        from agentlightning_lite.rl.fsdp import shard_base

        shard_base(trainer.policy, dp)
    tasks = [{"q": f"Tell me about {i}."} for i in range(4)]
    try:
        last = trainer.fit(varied, tasks, steps=steps, resume=resume)
        lora_state = [(n, p) for n, p in trainer.policy.named_parameters() if "lora_" in n]
        digest = DataParallel.checksum(lora_state)
        (out / f"fit-rank{rank}.json").write_text(
            json.dumps(
                {
                    "step": trainer.step,
                    "checksum": digest,
                    "metrics": last,
                    "engine_version": int(trainer.engine.version),  # adapters this rank handed over
                    "engine": type(trainer.engine).__name__,
                    "servers_started": len(getattr(trainer.engine, "processes", [])),
                    "sharded": any(hasattr(p, "to_local") for p in trainer.policy.parameters()),
                }
            )
        )
    finally:
        trainer.close()
        if engine is not None:
            engine.close()
        if (dp := DataParallel.active()) is not None:
            dp.close()


if __name__ == "__main__":
    main()  # a bare script: Trainer.fit under the launcher makes the process end with status 0
