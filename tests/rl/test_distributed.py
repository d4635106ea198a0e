"""Data-parallel updates on torch.distributed (gloo, CPU, the tiny Llama): 2 ranks == 1 process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from agentlightning_lite.rl.batching import Sample
from agentlightning_lite.rl.distributed import (
    DistributedError,
    detect,
    partition_by_tokens,
    samples_from_json,
    samples_to_json,
    token_imbalance,
)

WORKER = Path(__file__).with_name("_dist_worker.py")
ROOT = Path(__file__).resolve().parents[2]
#: a 2-rank update and a 1-process update on the same samples agree to this (float32 sums in another order)
ATOL = 1e-5


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src"), **extra})
    return env


def _read(out: Path, rank: int) -> dict[str, Any]:
    return json.loads((out / f"rank{rank}.json").read_text())


def _diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((torch.tensor(a[n]) - torch.tensor(b[n])).abs().max()) for n in a)


def test_detect_reads_the_launchers_variables() -> None:
    assert detect({}) is None
    assert detect({"RANK": "0", "WORLD_SIZE": "1"}) is None  # a world of one is a plain run
    env = {
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.2",
        "MASTER_PORT": "1234",
    }
    got = detect(env)
    assert got is not None and (got.rank, got.world_size, got.local_rank, got.is_main) == (1, 4, 1, False)
    assert (got.master_addr, got.master_port) == ("10.0.0.2", "1234")
    with pytest.raises(DistributedError, match="outside WORLD_SIZE"):
        detect({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(DistributedError, match="malformed"):
        detect({"RANK": "x", "WORLD_SIZE": "2"})


def test_partition_balances_tokens_longest_first() -> None:
    sizes = [100, 10, 60, 50, 40, 30]
    split = partition_by_tokens(sizes, 2)
    assert sorted(i for p in split for i in p) == list(range(6))  # each micro-batch exactly once
    assert [sum(sizes[i] for i in p) for p in split] == [150, 140]
    assert token_imbalance(sizes, split) == pytest.approx(150 / 145)
    assert partition_by_tokens([5], 3) == [[0], [], []]  # more ranks than micro-batches: some idle
    assert token_imbalance([5], [[0], [], []]) == pytest.approx(3.0)


def test_samples_round_trip_through_json() -> None:
    part = Sample([1], [2, 3], [-0.5, -0.25], 1.0, "g", temperature=0.7, rollout_id="a")
    s = Sample(
        [1, 2],
        [3, 4, 5],
        None,
        0.5,
        ("task", 1),
        advantage=-1.5,
        rollout_id="a",
        index=2,
        agent="x",
        meta={"policy": "p"},
        parts=[part, part],
        offsets=[0, 1],
    )
    back = samples_from_json(samples_to_json([s, part]))
    assert back == [s, part]
    assert back[0].group == ("task", 1) and isinstance(back[0].parts[0], Sample)  # type: ignore[index]


#: the updates the 2-rank tests compare with one process: data parallel (DDP) and FSDP2-sharded base weights
DDP_JOBS = ["grpo", "grpo-rollout", "ppo", "sft"]
FSDP_JOBS = ["grpo,fsdp", "grpo-odd,fsdp", "sft,fsdp", "grpo-odd,fsdp,gc"]


@pytest.fixture(scope="module")
def updates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every job of DDP_JOBS and FSDP_JOBS, run once in one process (``one/JOB``) and once on 2 ranks under
    one ``torchrun`` launch (``two/JOB``): the jobs run one after the other in the launch's process group,
    each on a fresh model, so the start-up of the launcher and its ranks (interpreter, torch,
    transformers: most of a launch's time on 2 cores) is paid once, not once per job."""
    root = tmp_path_factory.mktemp("updates")
    jobs = DDP_JOBS + FSDP_JOBS
    ref = subprocess.run(
        [sys.executable, str(WORKER), str(root / "one"), *jobs],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr"]
    cmd += ["127.0.0.1", "--master_port", str(_port()), str(WORKER), str(root / "two"), *jobs]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_single_process_update_never_starts_a_process_group(updates: Path) -> None:
    ref = _read(updates / "one" / "grpo", 0)
    assert ref["process_group"] is False  # torch.distributed was never initialised
    assert "dist/token_imbalance" not in ref["metrics"]
    assert _read(updates / "two" / "grpo", 0)["process_group"] is True  # (as it is under the launcher)


@pytest.mark.parametrize("algo", DDP_JOBS)
@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_two_ranks_under_torchrun_equal_one_process(updates: Path, algo: str) -> None:
    """GRPO (2 epochs x 2 mini-batches of 2 micro-batches), GRPO weighing rollouts with a KL term,
    PPO (its value head all-reduced too) and SFT (2 epochs x 2 shuffled mini-batches): the adapter
    after a 2-rank update equals the single-process one within ATOL, both ranks hold the same bytes,
    and the update moved the adapter far more than ATOL."""
    one, two = updates / "one" / algo, updates / "two" / algo
    ref, r0, r1 = _read(one, 0), _read(two, 0), _read(two, 1)
    assert r0["samples"] == r1["samples"] == 8  # rank 1 got rank 0's samples by broadcast
    assert _diff(ref["state"], r0["state"]) < ATOL
    assert r0["checksum"] == r1["checksum"] and r0["all_equal"] and r1["all_equal"]
    assert r0["state"] == r1["state"]
    assert r0["metrics"]["dist/world_size"] == 2.0
    assert 1.0 <= r0["metrics"]["dist/token_imbalance"] < 2.0
    assert r0["metrics"]["train/grad_norm"] == pytest.approx(ref["metrics"]["train/grad_norm"], rel=1e-4)
    keys = ("train/loss",) if algo == "sft" else ("train/loss", "train/pg_loss", "train/clip_frac")
    for key in keys:  # every rank's micro-batches, on rank 0
        assert r0["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-4, abs=1e-6), key
    assert ref["moved"] > 100 * ATOL  # the update moved the adapter far more than the tolerance
    if algo == "ppo":
        assert any(v != 0 for v in ref["state"]["value_head.v.weight"][0])


@pytest.mark.parametrize("job", FSDP_JOBS)
@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_fsdp2_sharded_base_on_two_ranks_equals_one_process(updates: Path, job: str) -> None:
    """FSDP2 (fully_shard, gloo, CPU) of the tiny Llama's decoder layers: each rank holds half of their
    frozen weights, and the LoRA adapter after the 2-rank update equals the unsharded single-process
    one within ATOL (the reference ignores ``fsdp``: it has no ranks). With 3 micro-batches per mini-batch
    (grpo-odd) the rank with fewer runs idle passes to keep the layers' all-gathers in step (else it would
    hang); gc: with gradient checkpointing on both sides."""
    algo, *extra = job.split(",")
    ref, r0, r1 = (
        _read(updates / "one" / job, 0),
        _read(updates / "two" / job, 0),
        _read(updates / "two" / job, 1),
    )
    assert ref["layer_numel"] == ref["base_numel"]
    assert ref["checkpointing"] == r0["checkpointing"] == ("gc" in extra)
    assert r0["layer_numel"] == r1["layer_numel"] == ref["base_numel"] // 2  # sharded in two
    assert _diff(ref["state"], r0["state"]) < ATOL
    assert r0["checksum"] == r1["checksum"] and r0["all_equal"]
    assert ref["moved"] > 100 * ATOL
    idle = r0["metrics"]["dist/idle_passes"] + r1["metrics"]["dist/idle_passes"]
    assert idle == (2 if algo == "grpo-odd" else 0)  # 2 epochs x one mini-batch of 3 micro-batches


def test_shard_base_refuses_4bit_weights_and_a_single_process() -> None:
    from agentlightning_lite.rl.fsdp import decoder_layers, shard_base

    from .._helpers import tiny_llama

    model = tiny_llama()
    assert len(decoder_layers(model)) == 2
    with pytest.raises(DistributedError, match="needs several ranks"):
        shard_base(model)
    with pytest.raises(DistributedError, match="no decoder layers"):
        decoder_layers(torch.nn.Linear(2, 2))

    class Params4bit(torch.nn.Parameter):  # bitsandbytes' packed 4-bit weights go by this name
        pass

    quantised = tiny_llama()
    layer = quantised.model.layers[0].self_attn
    layer.q_proj.weight = Params4bit(layer.q_proj.weight.detach(), requires_grad=False)
    with pytest.raises(DistributedError, match="QLoRA with FSDP2 is not supported"):
        shard_base(quantised)


@pytest.mark.slow
def test_accelerate_launch_runs_the_same_script_on_two_cpu_ranks(updates: Path, tmp_path: Path) -> None:
    """``accelerate launch --multi_gpu --num_processes 2`` on a machine without GPUs starts torchrun's
    launcher: the same worker runs 2 gloo ranks, whose adapter equals the 1-process one. (Its
    ``--cpu --num_processes 2`` starts one plain process unless given an MPI hostfile.)"""
    accelerate = Path(sys.executable).with_name("accelerate")
    if not accelerate.exists():
        pytest.skip("accelerate is not installed")
    one, two = updates / "one" / "grpo", tmp_path / "two"
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_port())]
    proc = subprocess.run(
        [*cmd, str(WORKER), str(two), "grpo"], env=_env(), capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref, r0, r1 = _read(one, 0), _read(two / "grpo", 0), _read(two / "grpo", 1)
    assert r0["metrics"]["dist/world_size"] == 2.0
    assert _diff(ref["state"], r0["state"]) < ATOL
    assert r0["checksum"] == r1["checksum"] and r0["all_equal"]


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_a_rank_killed_mid_step_makes_the_other_fail_fast(tmp_path: Path) -> None:
    """Rank 1 dies between its backward and the all-reduce; rank 0 raises DistributedError naming the
    all-reduce and exits non-zero within the process group's timeout (10 s) instead of hanging."""
    port = str(_port())
    procs = []
    for rank in (0, 1):
        env = _env(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            AGL_TEST_PG_TIMEOUT="10",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), str(tmp_path), "grpo,die"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    t0 = time.monotonic()
    try:
        _, err0 = procs[0].communicate(timeout=90)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[1].wait(timeout=10) == 3
    assert procs[0].returncode != 0
    assert "DistributedError" in err0 and "all-reduce of the gradients" in err0, err0[-2000:]
    assert time.monotonic() - t0 < 90
    assert not (tmp_path / "grpo,die" / "rank0.json").exists()


def _torchrun(
    script: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_addr", "127.0.0.1", "--master_port", str(_port()), str(script), *args]
    return subprocess.run(cmd, env=env or _env(), capture_output=True, text=True, timeout=240)


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_trainer_fit_under_torchrun_then_resumes(tmp_path: Path) -> None:
    """Trainer.fit (GRPO, real rollouts on the tiny Llama served by rank 0) on 2 ranks: both ranks end
    every run with the same adapter; run again with resume=True, both load rank 0's step-2 checkpoint
    (rank 1's adapter would differ otherwise) and train step 3; the metrics are rank 0's, once per step."""
    script = WORKER.with_name("_dist_fit_worker.py")
    for steps, extra in (("2", []), ("3", ["resume"])):
        proc = _torchrun(script, str(tmp_path), steps, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        r0, r1 = (json.loads((tmp_path / f"fit-rank{r}.json").read_text()) for r in (0, 1))
        assert r0["step"] == r1["step"] == int(steps)
        assert r0["checksum"] == r1["checksum"]
        assert r0["metrics"]["dist/world_size"] == r1["metrics"]["dist/world_size"] == 2.0
        assert r1["metrics"]["train/sequences"] == r0["metrics"]["train/sequences"] > 0  # the same samples
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-000001",
        "step-000002",
        "step-000003",
    ]


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_trainer_fit_sft_under_torchrun(tmp_path: Path) -> None:
    """Trainer.fit with SFT (the policy's own replies) on 2 ranks: no longer refused; both ranks train
    the same 2 steps on rank 0's samples and end with the same adapter and loss; rank 0 alone logs the
    metrics and writes each checkpoint, once."""
    script = WORKER.with_name("_dist_fit_worker.py")
    proc = _torchrun(script, str(tmp_path), "2", "sft")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"fit-rank{r}.json").read_text()) for r in (0, 1))
    assert r0["step"] == r1["step"] == 2
    assert r0["checksum"] == r1["checksum"]
    assert r0["metrics"]["dist/world_size"] == r1["metrics"]["dist/world_size"] == 2.0
    assert r0["metrics"]["sft/updates"] == r1["metrics"]["sft/updates"] == 2.0  # 8 calls, mini-batches of 4
    assert r1["metrics"]["train/loss"] == pytest.approx(r0["metrics"]["train/loss"], rel=1e-5)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000001", "step-000002"]


def test_only_rank_0_hands_new_weights_to_a_separate_engine() -> None:
    """Ranks other than 0 train their own copy (TrainOnly) and never load adapters into a vLLM-like
    engine they do not share; rank 0's WeightHandOver does, once per update."""
    from peft import LoraConfig, get_peft_model

    from agentlightning_lite.rl.distributed import TrainOnly
    from agentlightning_lite.rl.weights import WeightHandOver
    from agentlightning_lite.serving.engines import ScriptedEngine

    from .._helpers import tiny_llama

    class Served(ScriptedEngine):  # a trainable engine with its own copy of the weights (as VLLMEngine)
        def __init__(self) -> None:
            super().__init__(["ok"])
            self.loaded: list[Any] = []

        def update_weights(self, source: Any, adapter: str | None = None) -> int:
            self.loaded.append(source)
            return len(self.loaded)

    model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"]))
    trained: list[Any] = []
    rank0, rank1 = Served(), Served()
    WeightHandOver(rank0, model).apply(trained.append)
    TrainOnly(rank1, model).apply(trained.append)
    TrainOnly(rank1, model).push()
    assert trained == [model, model]  # both ranks ran their update
    assert len(rank0.loaded) == 1 and any("lora_A" in k for k in rank0.loaded[0])
    assert rank1.loaded == []


def test_a_trainer_the_launch_cannot_train_is_refused_with_what_to_do() -> None:
    """On GPUs each rank's model must be on its own GPU (LOCAL_RANK), and a sharded policy cannot be
    served by the in-process engine (rank 0 would generate alone from layers the others hold)."""
    from types import SimpleNamespace

    from agentlightning_lite.rl.distributed import DataParallel, Launch

    dp = object.__new__(DataParallel)  # the checks only, without a process group
    dp.launch, dp.rank, dp.world_size = Launch(1, 2, 1, "127.0.0.1", "29500"), 1, 2
    dp.backend, dp.device, dp.lockstep = "nccl", torch.device("cuda", 1), None
    on_gpu0 = SimpleNamespace(device=torch.device("cuda", 0), weights=SimpleNamespace(in_place=True))
    with pytest.raises(DistributedError, match=r"on cuda:0, its GPU is cuda:1.*from_env"):
        dp.check_learner(on_gpu0)
    dp.check_learner(SimpleNamespace(device=torch.device("cuda", 1), weights=on_gpu0.weights))  # fine
    dp.backend, dp.device, dp.lockstep = "gloo", torch.device("cpu"), lambda: None
    cpu = SimpleNamespace(device=torch.device("cpu"), weights=SimpleNamespace(in_place=True))
    with pytest.raises(DistributedError, match=r"sharded.*in-process engine"):
        dp.check_learner(cpu)
    dp.check_learner(SimpleNamespace(device=torch.device("cpu"), weights=SimpleNamespace(in_place=False)))


SERVER = """
import sys
sys.path.insert(0, {root!r})
import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import HFEngine
engine = HFEngine(sys.argv[1], model_name=sys.argv[1], num_threads=1, seed=0)
PolicyServer(engine, agl.MemoryStore(), port=int(sys.argv[2])).serve_forever()
"""


@pytest.mark.slow
def test_fit_on_two_ranks_with_a_separate_server_and_a_sharded_base(tmp_path: Path) -> None:
    """Trainer.fit on 2 ranks with the vLLM engine attached (url=) to a server holding its own weights
    (a PolicyServer over the HF engine, speaking vLLM's routes), the training copy's decoder layers
    sharded with FSDP2 on both ranks: 2 GRPO steps, the same adapter on both ranks, and only rank 0
    handed adapters to the server (its engine reached version 2, rank 1's stayed at 0)."""
    from .._helpers import tiny_smol_dir

    model_dir = tiny_smol_dir(tmp_path / "tiny-smol")
    script = tmp_path / "server.py"
    script.write_text(SERVER.format(root=str(ROOT / "src")))
    port = _port()
    server = subprocess.Popen(
        [sys.executable, str(script), str(model_dir), str(port)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, server.communicate()[1][-3000:]
                time.sleep(0.5)
        out = tmp_path / "run"
        proc = _torchrun(
            WORKER.with_name("_dist_fit_worker.py"), str(out), "2", f"served={url},{model_dir}", "fsdp"
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    r0, r1 = (json.loads((out / f"fit-rank{r}.json").read_text()) for r in (0, 1))
    assert r0["step"] == r1["step"] == 2
    assert r0["sharded"] and r1["sharded"]
    assert r0["checksum"] == r1["checksum"]
    assert (r0["engine_version"], r1["engine_version"]) == (2, 0)
    assert r0["metrics"]["train/sequences"] == r1["metrics"]["train/sequences"] > 0


@pytest.mark.slow
def test_under_a_launcher_only_rank_0_starts_the_vllm_server(tmp_path: Path) -> None:
    """engine="vllm" on 2 ranks: rank 0 starts one server (a stand-in `vllm` on PATH) and hands it
    each adapter; rank 1 starts none (it would take the same GPUs) and only trains its copy; both end
    with the same adapter after 2 GRPO steps."""
    from .._helpers import fake_vllm, tiny_smol_dir

    model_dir = tiny_smol_dir(tmp_path / "tiny-smol")
    bin_dir = fake_vllm(tmp_path)  # records each start in $AGL_TEST_LAUNCHES
    launches = tmp_path / "launches.jsonl"
    env = _env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", AGL_TEST_LAUNCHES=str(launches))
    out = tmp_path / "run"
    proc = _torchrun(
        WORKER.with_name("_dist_fit_worker.py"), str(out), "2", f"served=launch,{model_dir}", env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    started = [json.loads(line) for line in launches.read_text().splitlines()]
    assert [s["rank"] for s in started] == ["0"]  # one server, started by rank 0 (it inherits RANK)
    r0, r1 = (json.loads((out / f"fit-rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["engine"], r0["servers_started"]) == ("VLLMEngine", 1)
    assert (r1["engine"], r1["servers_started"]) == ("NotServing", 0)
    assert r0["step"] == r1["step"] == 2
    assert r0["checksum"] == r1["checksum"]
    assert (r0["engine_version"], r1["engine_version"]) == (2, 0)


def test_each_rank_computes_the_old_logprobs_of_its_own_micro_batches_only(monkeypatch: Any) -> None:
    """Under a data-parallel GRPO update a rank runs the no-grad passes (old and reference logprobs)
    for the micro-batches whose loss it computes, not for every one; with old_logprobs="auto" each
    rank checks the engine's logprobs of those micro-batches' calls (the decision is per call, so
    the ranks need not agree on one). PPO (its advantages need
    every old value) and sharded layers run them all."""
    import contextlib
    from types import SimpleNamespace

    import agentlightning_lite as agl
    from agentlightning_lite.rl import update

    calls: list[int] = []

    def forward(model: Any, batch: Any, value_head: Any, autocast: Any) -> Any:
        calls.append(batch.index)
        return torch.zeros(1, 3), None

    monkeypatch.setattr(update, "forward_logprobs", forward)
    model = SimpleNamespace(eval=lambda: None, disable_adapter=contextlib.nullcontext)
    sizes = [40, 10, 30, 20, 25, 5, 15, 35]  # padded tokens of 8 micro-batches, 4 per mini-batch
    batches = [
        SimpleNamespace(index=i, input_ids=torch.zeros(1, n), response_mask=torch.ones(1, 3))
        for i, n in enumerate(sizes)
    ]

    def run(algo: Any, rank: int, lockstep: Any = None, engine_from: int = 99) -> Any:
        calls.clear()
        chunks = [[SimpleNamespace(token_engine_logprobs=lambda i=i: [0.0] * 3 if i >= engine_from else None)]
                  for i in range(8)]  # fmt: skip
        dp = SimpleNamespace(rank=rank, world_size=2, lockstep=lockstep)
        cfg = update.UpdateSettings(device=torch.device("cpu"), data_parallel=dp)
        return update._reference(model, chunks, batches, algo, None, cfg)  # type: ignore[arg-type]

    grpo = agl.GRPO(group_size=2, micro_batch_size=1, mini_batch_size=4, kl_coef=0.1)
    # each mini-batch splits by tokens, longest first: [40, 10, 30, 20] -> {40, 10} and {30, 20},
    # [25, 5, 15, 35] -> {35, 5} and {25, 15}
    ref = run(grpo, 0)
    assert calls == [0, 0, 1, 1, 5, 5, 7, 7]  # old and reference logprobs of its own four
    assert [lp is not None for lp in ref.old_lp] == [i in (0, 1, 5, 7) for i in range(8)]
    run(grpo, 1)
    assert sorted(set(calls)) == [2, 3, 4, 6]
    # engine logprobs from micro-batch 3 on: each rank checks the calls of its own micro-batches
    # (every one recomputed) and keeps the engine's where they agree
    r0 = run(grpo, 0, engine_from=3)
    assert calls == [0, 0, 1, 1, 5, 5, 7, 7]
    assert r0.engine_share == 0.5 and r0.ref[3] is None and r0.mismatch_n == 6 and r0.fallbacks == 0
    r1 = run(grpo, 1, engine_from=3)
    assert calls == [2, 2, 3, 3, 4, 4, 6, 6]
    assert r1.engine_share == 0.75 and r1.mismatch_n == 9
    run(agl.PPO(micro_batch_size=1, mini_batch_size=4), 1)
    assert sorted(set(calls)) == list(range(8))
    run(grpo, 1, lockstep=lambda: None)
    assert sorted(set(calls)) == list(range(8))


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_a_successful_run_under_a_launcher_ends_with_status_0() -> None:
    """``leave_after_launch`` (what ``agl-lite train`` ends with) skips the interpreter's teardown, where a
    gloo rank sometimes aborts: the launcher sees status 0, with the output flushed."""
    import subprocess

    code = (
        "import os, sys, atexit\n"
        "from agentlightning_lite.rl.distributed import leave_after_launch\n"
        "atexit.register(lambda: os._exit(7))  # a failing teardown (as gloo's abort)\n"
        "print('written', end='')\n"
        "leave_after_launch()\n"
        "raise SystemExit(3)\n"
    )
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout) == (0, "written"), out.stderr
    env.pop("WORLD_SIZE")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 7  # not under a launcher: nothing changes, the teardown runs


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_a_script_that_trains_under_a_launcher_ends_with_status_0_without_asking(tmp_path: Path) -> None:
    """``Trainer.fit`` under a launcher installs ``end_cleanly_at_exit``: a script that just returns
    ends with status 0 even when a later part of the teardown would fail, with its store flushed;
    a script whose exception escapes keeps the interpreter's failure status."""
    import subprocess

    import agentlightning_lite as agl

    code = (
        "import os, sys, atexit, pathlib\n"
        "import agentlightning_lite as agl\n"
        "from agentlightning_lite.rl.distributed import end_cleanly_at_exit\n"
        "atexit.register(lambda: os._exit(7))  # a failing teardown (as gloo's abort)\n"
        "db = pathlib.Path(sys.argv[1])\n"
        "store = agl.SQLiteStore(db)\n"
        "store.start_rollout({'q': 1}, rollout_id='r1')\n"
        "end_cleanly_at_exit()\n"
        "print('written', end='')\n"
        "if sys.argv[2] == 'fail':\n"
        "    raise RuntimeError('the run failed')\n"
    )
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    db = tmp_path / "runs.db"
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code, *a], env=env, capture_output=True, text=True, timeout=120
    )
    out = run(str(db), "ok")
    assert (out.returncode, out.stdout) == (0, "written"), out.stderr
    assert [r.rollout_id for r in agl.SQLiteStore(db).rollouts()] == ["r1"]  # the store was closed
    out = run(str(tmp_path / "failed.db"), "fail")
    assert out.returncode == 7 and "the run failed" in out.stderr, out.stderr  # the usual teardown ran
