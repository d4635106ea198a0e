"""Data-parallel updates on several local devices, on PyTorch's own ``torch.distributed``.

A script (or ``agl-lite train``) started by ``torchrun --nproc_per_node N`` or ``accelerate launch``
runs N ranks. Rank 0 owns the rollouts, the store, the serving, the weight hand-over and the
checkpoints; each step it broadcasts its samples to the other ranks (:meth:`DataParallel.broadcast_samples`).
Every rank then builds the same micro-batches with the same loss weights (the weights of a
micro-batch are relative to its whole mini-batch, see ``micro_batch_weights``), runs forward and
backward only on its own share of each mini-batch (:func:`partition_by_tokens`: greedy, longest first,
by padded tokens), and the trainable gradients (LoRA, PPO's value head) are summed across ranks
before the clip and the optimiser step. Because each micro-batch's loss already carries its share of
the mini-batch, the sum is the gradient of the whole mini-batch: a 2-rank step equals a 1-process step
on the same samples (up to the order of float additions), and every rank takes the same step.

Nothing here is imported by a single-process run: ``torch.distributed`` is touched only when the
launcher's variables say there are several ranks (:func:`detect`).
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import AGLError
from .batching import Sample
from .weights import WeightHandOver

__all__ = [
    "DataParallel",
    "DistributedError",
    "Launch",
    "TrainOnly",
    "detect",
    "end_cleanly_at_exit",
    "leave_after_launch",
    "partition_by_tokens",
    "samples_from_json",
    "samples_to_json",
    "token_imbalance",
]

log = logging.getLogger(__name__)

_ACTIVE: DataParallel | None = None  # this process's rank, while its process group is up


def leave_after_launch() -> None:
    """End a process that a launcher started (``torchrun``, ``accelerate launch``) after a successful
    run, with status 0: close the SQLite stores still open, leave the process group together with the
    other ranks, flush the logs and the output, and skip the interpreter's teardown, where a gloo rank
    sometimes aborts after its work is done ("terminate called without an active exception"), which
    the launcher reports as a failed run.
    Outside a launcher it does nothing. ``agl-lite train`` calls it; a training script can end with it.

    >>> leave_after_launch()  # not under a launcher: returns
    """
    if detect() is None:
        return
    from ..store.sqlite import close_open_stores  # what the skipped teardown would have closed

    close_open_stores()
    if (dp := DataParallel.active()) is not None:
        dp.close()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_EXIT_HOOK: list[bool] = []  # [failed?] once the hook below is installed


def end_cleanly_at_exit() -> None:
    """Under a launcher, make a successful run's process end with status 0 at the interpreter's exit,
    as :func:`leave_after_launch` does, without the script calling it. ``Trainer.fit`` installs it
    when it starts a data-parallel run. At exit, unless an exception escaped the script (then the
    interpreter's own exit and status stand), it closes the SQLite stores still open, leaves the
    process group together with the other ranks, flushes the logs and the output and ends the
    process with status 0. A script that must end with another status after a run calls
    ``os._exit(status)`` itself: ``sys.exit(n)`` does not reach this hook. Outside a launcher it
    does nothing.

    >>> end_cleanly_at_exit()  # not under a launcher: returns
    """
    if detect() is None or _EXIT_HOOK:
        return
    _EXIT_HOOK.append(False)
    previous = sys.excepthook

    def record(kind: Any, value: Any, tb: Any) -> None:
        _EXIT_HOOK[0] = True
        previous(kind, value, tb)

    sys.excepthook = record
    atexit.register(_leave_at_exit)  # registered last, so run first, while the interpreter is whole


def _leave_at_exit() -> None:
    if not _EXIT_HOOK[0]:  # nothing escaped the script
        leave_after_launch()


class DistributedError(AGLError, RuntimeError):
    """A collective failed: another rank died, or did not answer within the process group's timeout."""


@dataclass(frozen=True)
class Launch:
    """Where this process sits in a ``torchrun`` / ``accelerate launch`` job (from its environment)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def detect(env: Mapping[str, str] | None = None) -> Launch | None:
    """The launch this process belongs to, or ``None`` for a plain single-process run.

    torchrun and accelerate launch both set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
    and ``MASTER_PORT``; a world of one is a single-process run.

    >>> detect({}) is None
    True
    >>> detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1"}).rank
    1
    """
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return None
    try:
        world, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
        local = int(env.get("LOCAL_RANK", env["RANK"]))
    except ValueError as e:
        raise DistributedError(f"malformed launcher variables RANK/WORLD_SIZE/LOCAL_RANK: {e}") from e
    if world <= 1:
        return None
    if not 0 <= rank < world:
        raise DistributedError(f"RANK={rank} is outside WORLD_SIZE={world}")
    return Launch(rank, world, local, env.get("MASTER_ADDR", "127.0.0.1"), env.get("MASTER_PORT", "29500"))


def partition_by_tokens(sizes: Sequence[int], parts: int) -> list[list[int]]:
    """Indices of ``sizes`` split into ``parts`` lists of near-equal total: greedy, longest first,
    each item to the currently lightest part (ties: the lowest part). Deterministic, so every rank
    computes the same split. Each part's indices are in ascending order.

    >>> partition_by_tokens([5, 1, 4, 2], 2)
    [[0, 1], [2, 3]]
    """
    if parts < 1:
        raise ValueError("parts must be >= 1")
    loads = [0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        k = min(range(parts), key=lambda k: (loads[k], k))
        out[k].append(i)
        loads[k] += sizes[i]
    return [sorted(p) for p in out]


def token_imbalance(sizes: Sequence[int], split: Sequence[Sequence[int]]) -> float:
    """The heaviest part's tokens over the mean part's (1.0 is perfect balance).

    >>> token_imbalance([5, 1, 4, 2], [[0, 1], [2, 3]])
    1.0
    """
    loads = [sum(sizes[i] for i in p) for p in split]
    mean = sum(loads) / max(len(loads), 1)
    return max(loads) / mean if mean > 0 else 1.0


def _sample_dict(s: Sample) -> dict[str, Any]:
    d = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
    d["parts"] = None if s.parts is None else [_sample_dict(p) for p in s.parts]
    if isinstance(s.group, tuple):
        d["group"] = {"__tuple__": list(s.group)}
    return d


def _sample_from(d: dict[str, Any]) -> Sample:
    d = dict(d)
    if d.get("parts") is not None:
        d["parts"] = [_sample_from(p) for p in d["parts"]]
    g = d.get("group")
    if isinstance(g, dict) and set(g) == {"__tuple__"}:
        d["group"] = tuple(g["__tuple__"])
    return Sample(**d)


def samples_to_json(samples: Iterable[Sample]) -> str:
    """Samples as JSON text (what rank 0 broadcasts); their ``meta`` must be JSON-safe."""
    return json.dumps([_sample_dict(s) for s in samples], allow_nan=True)


def samples_from_json(text: str) -> list[Sample]:
    """The inverse of :func:`samples_to_json`."""
    return [_sample_from(d) for d in json.loads(text)]


class TrainOnly(WeightHandOver):
    """The weight hand-over of a rank other than 0: it trains its own copy of the model but never
    hands it to an engine it does not share (a vLLM server): rank 0 alone loads each new adapter.

    >>> from agentlightning_lite.serving.engines import ScriptedEngine
    >>> seen = []
    >>> TrainOnly(ScriptedEngine(["hi"]), model="the model").apply(seen.append)
    >>> seen
    ['the model']
    """

    def apply(self, update: Callable[[Any], None], adapters: Sequence[str | None] = (None,)) -> None:
        if self.in_place:  # the engine's module is this rank's own training model (HFEngine)
            super().apply(update, adapters)
        else:
            update(self.model)

    def push(self, adapters: Sequence[str | None] = (None,)) -> None:
        return None


class DataParallel:
    """This rank's side of a data-parallel update (see the module's docstring).

    ``UpdateSettings(data_parallel=...)`` gives it to the update, which asks it which micro-batches
    of a mini-batch are this rank's (:meth:`mine`) and to sum the trainable gradients
    (:meth:`all_reduce_grads`) before clipping and stepping.
    """

    def __init__(self, launch: Launch, *, backend: str | None = None, timeout_s: float = 600.0) -> None:
        import torch.distributed as dist

        self.launch = launch
        self.rank, self.world_size = launch.rank, launch.world_size
        self.imbalance: list[float] = []
        #: set by :func:`.fsdp.shard_base`: one idle forward/backward, for a rank with fewer micro-batches
        self.lockstep: Callable[[], None] | None = None
        self._owed = 0  # idle passes this rank owes before the next all-reduce of the gradients
        self._idle = 0
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.backend = backend
        self.device = torch.device("cuda", launch.local_rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group(
                backend,
                init_method="env://",
                rank=launch.rank,
                world_size=launch.world_size,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
        log.info("rank %d of %d on %s (%s)", self.rank, self.world_size, self.device, backend)
        global _ACTIVE
        _ACTIVE = self

    @classmethod
    def from_env(cls, **kwargs: Any) -> DataParallel | None:
        """The data-parallel side of this process when a launcher started several ranks, else ``None``."""
        launch = detect()
        return None if launch is None else cls(launch, **kwargs)

    @staticmethod
    def active() -> DataParallel | None:
        """This process's rank while its process group is up (``None`` in a single-process run)."""
        return _ACTIVE

    @staticmethod
    def start(learner: Any, resume: Callable[[], None] | None = None) -> DataParallel | None:
        """The start of ``Trainer.fit``: under a launcher, check ``learner`` (a
        :class:`~.learner.Learner`) and keep a rank other than 0 from handing weights to a shared
        engine; ``resume()`` when given; then wait until every rank has resumed (or not). Returns
        this rank (``None`` in a single process): rank 0 runs the step loop (rollouts, store, serving,
        hand-over, checkpoints, evaluation), every other rank :meth:`follow`."""
        dp = DataParallel.active() or DataParallel.from_env()
        if dp is not None:
            end_cleanly_at_exit()
            dp.check_learner(learner)
            if not dp.is_main:  # only rank 0 hands new weights to a separate engine
                learner.train_only()
        if resume is not None:
            resume()
        if dp is not None:
            dp.barrier()  # rank 0's rollouts start once every rank has loaded its checkpoint
        return dp

    def check_learner(self, learner: Any) -> None:
        """Refuse, on every rank alike, a learner this launch cannot train: its model on another GPU
        than this rank's, or a sharded model (:func:`.fsdp.shard_base`) that the in-process engine
        generates from."""
        device = learner.device
        if self.backend == "nccl" and device is not None and torch.device(device) != self.device:
            raise DistributedError(
                f"rank {self.rank}'s training model is on {device}, its GPU is {self.device} (LOCAL_RANK="
                f"{self.launch.local_rank}): call DataParallel.from_env() (or "
                "torch.cuda.set_device(LOCAL_RANK)) before building the Trainer, so that each rank loads "
                "its model on its own GPU"
            )
        if self.lockstep is not None and learner.weights.in_place:
            raise DistributedError(
                "the policy's decoder layers are sharded (shard_base) but the in-process engine generates "
                "from that same model on rank 0 alone, which would wait for the other ranks forever: serve "
                "with an engine that holds its own weights (engine='vllm' with url=[...]) or do not shard"
            )

    @staticmethod
    def shared(build: Callable[..., tuple[list[Sample], dict[str, float]]]) -> Callable[..., Any]:
        """``build`` (rank 0's sample building) followed, under a launcher, by the broadcast of its
        samples to the other ranks (which receive them in :meth:`follow`)."""

        def run(*args: Any, **kwargs: Any) -> tuple[list[Sample], dict[str, float]]:
            samples, stats = build(*args, **kwargs)
            dp = DataParallel.active()
            return (samples if dp is None else dp.broadcast_samples(samples)), stats

        return run

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _collective(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # gloo/nccl raise RuntimeError (or DistBackendError) on a dead peer or timeout
            raise DistributedError(
                f"rank {self.rank}: {what} across {self.world_size} ranks failed "
                f"(another rank died or did not answer in time): {e}"
            ) from e

    def broadcast_samples(self, samples: list[Sample] | None) -> list[Sample]:
        """Rank 0's samples on every rank (the others pass ``None``).

        They travel as JSON text: ``broadcast_object_list`` pickles the one ``str`` rank 0 made from
        its own samples, and the receivers parse JSON, so nothing from a network is unpickled.
        """
        import torch.distributed as dist

        box: list[Any] = [samples_to_json(samples or []) if self.is_main else None]
        self._collective("broadcast of the samples", dist.broadcast_object_list, box, src=0)
        return list(samples or []) if self.is_main else samples_from_json(box[0])

    def follow(self, learner: Any, step: int, total: int) -> dict[str, Any]:
        """A rank other than 0, from ``step`` until step ``total``: each step rank 0's samples (their
        advantages are computed here the same way), then ``learner``'s share of every policy's update."""
        last: dict[str, Any] = {}
        for k in range(step, total):
            last = learner.learn(self.broadcast_samples(None), step=k)
        return last

    def mine(self, sizes: Sequence[int]) -> set[int]:
        """Which of a mini-batch's micro-batches (``sizes``: their padded tokens) this rank computes;
        records the split's :func:`token_imbalance`."""
        split = partition_by_tokens(sizes, self.world_size)
        self.imbalance.append(token_imbalance(sizes, split))
        if self.lockstep is not None:  # sharded layers: every rank runs as many passes
            self._owed = max(len(p) for p in split) - len(split[self.rank])
        return set(split[self.rank])

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` across ranks (a rank without a gradient adds zeros), as one
        flat buffer. Each micro-batch's loss already carries its weight in the whole mini-batch, so
        the sum, not the mean, is the mini-batch's gradient."""
        import torch.distributed as dist

        ps = [p for p in params if p.requires_grad]
        while self._owed > 0 and self.lockstep is not None:
            self._owed -= 1
            self._idle += 1
            self.lockstep()
        if not ps:
            return
        # one flag per parameter rides along: a parameter no rank has a gradient for (another
        # adapter's) keeps ``grad=None`` so the optimiser skips it, as in a single process
        flags = torch.tensor([0.0 if p.grad is None else 1.0 for p in ps], device=self.device)
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float().to(self.device)
                for p in ps
            ]
            + [flags]
        ).to(self.device)
        self._collective("all-reduce of the gradients", dist.all_reduce, flat, op=dist.ReduceOp.SUM)
        seen = flat[-len(ps) :].cpu()
        off = 0
        for i, p in enumerate(ps):
            n = p.numel()
            g = flat[off : off + n].view_as(p).to(device=p.device, dtype=p.dtype)
            off += n
            if seen[i] == 0:
                p.grad = None
            elif p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)

    def gather_logs(self, logs: dict[str, list[float]]) -> dict[str, list[float]]:
        """Every rank's per-micro-batch values of the update's metrics, key by key (the grad norm is
        taken after the all-reduce, the same on every rank: this rank's)."""
        import torch.distributed as dist

        got: list[Any] = [None] * self.world_size
        self._collective("gather of the update's metrics", dist.all_gather_object, got, logs)
        out: dict[str, list[float]] = {}
        for rank_logs in got:
            for k, v in rank_logs.items():
                out.setdefault(k, []).extend(v)
        out["train/grad_norm"] = logs["train/grad_norm"]
        return out

    def sum_across(self, values: Sequence[float]) -> list[float]:
        """``values`` summed element-wise across ranks (every rank passes as many, in the same order).

        SFT's loss of a mini batch is the sum of its micro-batches' losses, which the ranks share.
        """
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        self._collective("all-reduce of the losses", dist.all_reduce, t, op=dist.ReduceOp.SUM)
        return [float(x) for x in t.cpu()]

    def metrics(self) -> dict[str, float]:
        """``dist/token_imbalance``: the worst mini-batch split since the last call (max/mean tokens)."""
        out = {"dist/world_size": float(self.world_size)}
        if self.imbalance:
            out["dist/token_imbalance"] = max(self.imbalance)
        if self.lockstep is not None:
            out["dist/idle_passes"] = float(self._idle)
        self.imbalance, self._idle = [], 0
        return out

    @staticmethod
    def checksum(params: Iterable[tuple[str, torch.Tensor]]) -> str:
        """A SHA-256 of named tensors (e.g. the adapter's), to check that every rank holds the same."""
        h = hashlib.sha256()
        for name, t in sorted(params, key=lambda kv: kv[0]):
            h.update(name.encode())
            h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()

    def all_equal(self, digest: str) -> bool:
        """Whether every rank passed the same ``digest``."""
        import torch.distributed as dist

        got: list[Any] = [None] * self.world_size
        self._collective("gather of the checksums", dist.all_gather_object, got, digest)
        return all(g == got[0] for g in got)

    def barrier(self) -> None:
        import torch.distributed as dist

        self._collective("barrier", dist.barrier)

    def close(self) -> None:
        """Leave the process group together (a rank that leaves while another still talks to it
        can make that one abort)."""
        import torch.distributed as dist

        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        if dist.is_initialized():
            self.barrier()
            dist.destroy_process_group()
