"""Our remote rollout loop and span ingestion against Agent Lightning 0.3.0's client-server store.

Three workloads, each side with a fresh server process and a separate client process:

1. ``loop``: the remote rollout loop. The server queues ``--rollouts`` rollouts in-process (ours:
   ``RemoteRunners.run``; theirs: ``enqueue_many_rollouts`` on the store behind a
   ``LightningStoreServer``) and times until each has its outcome; the client runs ``--workers``
   workers that each claim a rollout (ours: ``RunnerClient.claim`` under a lease; theirs:
   ``LightningStoreClient.dequeue_rollout``, polled every 10 ms when the queue is empty), send
   ``--spans-per-rollout`` spans (ours: span rows through a ``RemoteStore``, as a runner does;
   theirs: ``add_span`` with sequence ids numbered locally, which spares them the
   ``/spans/next`` request their tracer makes per span) and report the result (ours:
   ``finish_rollout`` with the reward, which carries the rollout's buffered spans and asks for
   the worker's next rollout, as ``agl.remote.Runner`` does; theirs:
   ``update_attempt(status="succeeded")``).
   ``--workers`` rollouts run first as a warm-up, untimed.
2. ``native``: raw span ingestion, ``--spans`` spans into one rollout through each side's own
   client (ours: ``RunnerClient.add_rows`` in batches of ``--batch``; theirs: ``add_many_spans``).
3. ``otlp``: the same spans as OTLP/HTTP protobuf (``POST /v1/traces``, batches of ``--batch``), the
   same bytes to both, sent by plain ``httpx``.

Per workload and side: the median over ``--repeats`` interleaved repetitions (ours, theirs, ours,
...), each server's and client's peak RSS (``VmHWM``) and CPU seconds, and the HTTP requests the
server received in the timed phase (counted by an ASGI wrapper around each server's app), per
rollout for the loop.

    python -m benchmarks.perf.bench_vs_agl --repeats 3          # builds /tmp/agl030 if missing
    python -m benchmarks.perf.bench_vs_agl --agl-python /tmp/agl030/bin/python --workloads loop
    python -m benchmarks.perf.bench_vs_agl --profile-client /tmp/prof.txt   # cProfile of our loop client
    python -m benchmarks.perf.bench_vs_agl --workloads loop --baseline-src /tmp/main/src  # + older code

``--baseline-src`` adds our loop run from another checkout's ``src`` (``git archive main | tar -x``),
interleaved with the others, so a change is compared with the code before it under the same load.
The file written keeps any section a person added below the generated table (from the first
``## `` heading on).

This file is run by both interpreters: it imports neither package at module level.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
AGL_VERSION = "0.3.0"
DEFAULT_VENV = Path("/tmp/agl030")
PROMPT = [{"role": "user", "content": "What is 12 * 7 + 3? Use the calculator."}]
COUNTS: Counter[str] = Counter()  # requests the server received, by method and path pattern
# ids in paths, not "v1": long segments with a digit, or a two-letter prefix and hex digits (AGL's
# "ro-..." rollout and "at-edccdaad" attempt ids, which may have no digit at all)
_ID = re.compile(r"/(?:(?=[^/]*\d)[^/]{9,}|[a-z]{2}-[0-9a-f]{6,})(?=/|$)")


# -- measuring inside a process ----------------------------------------------------------------
def proc_stats() -> dict[str, float]:
    """This process's peak RSS (MB) and CPU seconds so far."""
    hwm = float("nan")
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    t = os.times()
    return {"peak_rss_mb": hwm, "cpu_s": t.user + t.system}


def count_requests() -> None:
    """Wrap every uvicorn app started in this process with a request counter (``COUNTS``)."""
    import uvicorn

    original = uvicorn.Config.__init__

    def counting(app: Any) -> Any:
        async def wrapped(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                COUNTS[scope["method"] + " " + _ID.sub("/{id}", scope["path"])] += 1
            await app(scope, receive, send)

        return wrapped

    def init(self: Any, app: Any, *args: Any, **kwargs: Any) -> None:
        original(self, counting(app), *args, **kwargs)

    uvicorn.Config.__init__ = init  # type: ignore[method-assign]


def say(tag: str, payload: Any = None) -> None:
    print(tag if payload is None else f"{tag} {json.dumps(payload)}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llm_fields(i: int) -> bool:
    return i % 2 == 0


def otlp_payloads(rid: str, attempt_id: str, n: int, batch: int) -> list[bytes]:
    """``n`` spans (half chat calls with 64 prompt token ids) as OTLP protobuf requests of ``batch``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def kv(key: str, value: str) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(string_value=value))

    out = []
    for k in range(0, n, batch):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(
            [kv("agentlightning.rollout_id", rid), kv("agentlightning.attempt_id", attempt_id)]
        )
        ss = rs.scope_spans.add()
        for i in range(k, min(n, k + batch)):
            llm = llm_fields(i)
            p = ss.spans.add()
            p.trace_id = (i // 1000 + 1).to_bytes(16, "big")
            p.span_id = (i + 1).to_bytes(8, "big")
            p.name = "chat" if llm else "calc"
            p.start_time_unix_nano = int((1.7e9 + i) * 1e9)
            p.end_time_unix_nano = int((1.7e9 + i + 0.5) * 1e9)
            inp = PROMPT if llm else {"expr": "12*7+3"}
            p.attributes.extend(
                [
                    kv("gen_ai.operation.name", "chat" if llm else "execute_tool"),
                    kv("gen_ai.input.messages", json.dumps(inp)),
                    kv("gen_ai.output.messages", json.dumps("87")),
                ]
            )
            if llm:
                ids = p.attributes.add()
                ids.key = "agentlightning.prompt_token_ids"
                ids.value.array_value.values.extend(AnyValue(int_value=t) for t in range(1000, 1064))
        out.append(req.SerializeToString())
    return out


def post_all(url: str, bodies: list[bytes]) -> float:
    """POST the OTLP bodies in order on one connection; seconds taken."""
    import httpx

    with httpx.Client(base_url=url, headers={"content-type": "application/x-protobuf"}, timeout=120) as h:
        t0 = time.perf_counter()
        for body in bodies:
            h.post("/v1/traces", content=body).raise_for_status()
        return time.perf_counter() - t0


# -- our side ----------------------------------------------------------------------------------
def ours_server(workload: str, store_kind: str, n: int, warmup: int) -> None:
    import tempfile

    import agentlightning_lite as agl
    from agentlightning_lite.serving.engines import ScriptedEngine

    count_requests()
    with tempfile.TemporaryDirectory() as tmp:
        store = agl.SQLiteStore(Path(tmp) / "s.db") if store_kind == "sqlite" else agl.MemoryStore()
        runners = agl.RemoteRunners(port=0)
        server = runners.serve(ScriptedEngine(["87"], tokenizer="bytes"), store)
        say("URL", runners.url)
        assert sys.stdin.readline().strip() == "go"
        COUNTS.clear()
        if workload == "loop":
            jobs = runners.run([(i, "train", {}) for i in range(warmup)])
            COUNTS.clear()
            t0 = time.perf_counter()
            jobs = runners.run([(i, "train", {}) for i in range(n)])
            elapsed = time.perf_counter() - t0
            requests = sum(COUNTS.values())
            ok = all(j.status == "succeeded" and j.reward == 1.0 for j in jobs)
            say("RESULT", {"elapsed_s": elapsed, "ok": ok, "requests": requests, "by_path": dict(COUNTS)})
        assert sys.stdin.readline().strip() == "stop"
        stored = sum(1 for _ in store.rollouts())
        say("STATS", {**proc_stats(), "requests": sum(COUNTS.values()), "rollouts_stored": stored})
        runners.stop()
        server.stop()


def ours_client(workload: str, url: str, n: int, workers: int, spans: int, batch: int) -> None:
    import agentlightning_lite as agl  # noqa: F401  (the import a runner pays)
    from agentlightning_lite.remote.client import RunnerClient
    from agentlightning_lite.remote.remote_store import RemoteStore
    from agentlightning_lite.store.rows import span_to_row
    from agentlightning_lite.types import Rollout, Span

    def make_rows(rid: str, k: int, offset: int = 0) -> list[Any]:
        rows = []
        for i in range(offset, offset + k):
            llm = llm_fields(i)
            s = Span(
                span_id=f"{rid}:{i}",
                rollout_id=rid,
                kind="llm" if llm else "tool",
                name="chat" if llm else "calc",
                start_time=1.7e9 + i,
                end_time=1.7e9 + i + 0.5,
                input=PROMPT if llm else {"expr": "12*7+3"},
                output="87",
                attributes={"i": i},
                model="policy" if llm else None,
                prompt_token_ids=list(range(1000, 1064)) if llm else None,
                response_token_ids=list(range(2000, 2032)) if llm else None,
                response_logprobs=[-0.25] * 32 if llm else None,
            )
            rows.append(span_to_row(s))
        return rows

    client = RunnerClient(url)
    if workload == "loop":
        store = RemoteStore(client)
        done = [0]
        lock = threading.Lock()

        chain = hasattr(store, "claim_with_result")  # the next claim rides on the result (as a Runner)

        def work(wid: str) -> None:
            claimed = None
            while True:
                with lock:
                    if done[0] >= n:  # never with a claim in hand: that rollout is not done
                        return
                if claimed is None:
                    claimed = client.claim(wid, wait=1.0)
                    if claimed is None:
                        continue
                rid = claimed["rollout_id"]
                store.register(Rollout(rollout_id=rid, start_time=0.0, mode="train"), claimed["lease"])
                store.add_span_rows(make_rows(rid, spans))
                if chain:
                    store.claim_with_result(rid, wid)
                store.finish_rollout(rid, "succeeded", reward=1.0)
                claimed = store.take_claim(rid) if chain else None
                store.forget(rid)
                with lock:
                    done[0] += 1

        profile_to = os.environ.get("AGL_BENCH_PROFILE")  # cProfile of the worker threads, merged
        profiles: list[Any] = []

        def run(wid: str) -> None:
            if not profile_to:
                return work(wid)
            import cProfile

            prof = cProfile.Profile()
            profiles.append(prof)
            prof.runcall(work, wid)

        say("READY")
        assert sys.stdin.readline().strip() == "go"
        threads = [threading.Thread(target=run, args=(f"w{i}",)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        store.close()
        if profile_to:
            import io
            import pstats

            out = io.StringIO()
            stats = pstats.Stats(profiles[0], stream=out)
            for prof in profiles[1:]:
                stats.add(prof)
            stats.sort_stats("tottime").print_stats(25)
            stats.sort_stats("cumulative").print_stats(30)
            Path(profile_to).write_text(out.getvalue())
        say("STATS", {**proc_stats(), "dropped": store.dropped})
        return
    rid = client.start_rollout({"task": "t", "mode": "trace"})["rollout_id"]
    if workload == "native":
        rows = [list(r) for r in make_rows(rid, spans)]
        say("READY")
        assert sys.stdin.readline().strip() == "go"
        t0 = time.perf_counter()
        accepted = sum(client.add_rows(rows[k : k + batch]) for k in range(0, spans, batch))
        elapsed = time.perf_counter() - t0
    else:
        bodies = otlp_payloads(rid, "a-0", spans, batch)
        say("READY")
        assert sys.stdin.readline().strip() == "go"
        elapsed = post_all(url, bodies)
        accepted = len(client.spans(rid))
    say("RESULT", {"elapsed_s": elapsed, "ok": accepted == spans, "accepted": accepted})
    say("STATS", proc_stats())


# -- Agent Lightning's side --------------------------------------------------------------------
def agl_server(workload: str, n: int, warmup: int) -> None:
    count_requests()
    from agentlightning.store import InMemoryLightningStore
    from agentlightning.store.client_server import LightningStoreServer
    from agentlightning.types import EnqueueRolloutRequest

    async def main() -> None:
        store = InMemoryLightningStore()
        port = free_port()
        server = LightningStoreServer(store, host="127.0.0.1", port=port)
        await server.start()
        say("URL", f"http://127.0.0.1:{port}")
        loop = asyncio.get_running_loop()
        line = await loop.run_in_executor(None, sys.stdin.readline)
        assert line.strip() == "go"
        COUNTS.clear()

        async def run(k: int) -> list[Any]:
            ros = await store.enqueue_many_rollouts(
                [EnqueueRolloutRequest(input=i, mode="train") for i in range(k)]
            )
            ids = [r.rollout_id for r in ros]
            while True:
                finished = await store.wait_for_rollouts(rollout_ids=ids, timeout=0.05)
                if len(finished) == len(ids):
                    return finished

        if workload == "loop":
            await run(warmup)
            COUNTS.clear()
            t0 = time.perf_counter()
            finished = await run(n)
            elapsed = time.perf_counter() - t0
            ok = all(r.status == "succeeded" for r in finished)
            requests = sum(COUNTS.values())
            say("RESULT", {"elapsed_s": elapsed, "ok": ok, "requests": requests, "by_path": dict(COUNTS)})
        line = await loop.run_in_executor(None, sys.stdin.readline)
        assert line.strip() == "stop"
        say("STATS", {**proc_stats(), "requests": sum(COUNTS.values())})
        await server.stop()

    asyncio.run(main())


def agl_client(workload: str, url: str, n: int, workers: int, spans: int, batch: int) -> None:
    from agentlightning.store.client_server import LightningStoreClient
    from agentlightning.types import OtelResource, Span, TraceStatus

    def make_spans(rid: str, aid: str, k: int) -> list[Any]:
        out = []
        for i in range(k):
            llm = llm_fields(i)
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": "chat" if llm else "execute_tool",
                "input": json.dumps(PROMPT if llm else {"expr": "12*7+3"}),
                "output": json.dumps("87"),
                "i": i,
            }
            if llm:
                attrs["model"] = "policy"
                attrs["prompt_token_ids"] = list(range(1000, 1064))
                attrs["response_token_ids"] = list(range(2000, 2032))
                attrs["response_logprobs"] = [-0.25] * 32
            out.append(
                Span(
                    rollout_id=rid,
                    attempt_id=aid,
                    sequence_id=i,
                    trace_id=f"{i // 1000 + 1:032x}",
                    span_id=f"{i + 1:016x}",
                    parent_id=None,
                    name="chat" if llm else "calc",
                    status=TraceStatus(status_code="OK"),
                    attributes=attrs,
                    events=[],
                    links=[],
                    start_time=1.7e9 + i,
                    end_time=1.7e9 + i + 0.5,
                    context=None,
                    parent=None,
                    resource=OtelResource(attributes={}, schema_url=""),
                )
            )
        return out

    async def main() -> None:
        client = LightningStoreClient(url)
        loop = asyncio.get_running_loop()
        if workload == "loop":
            done = [0]

            async def work(wid: str) -> None:
                while done[0] < n:
                    ar = await client.dequeue_rollout(worker_id=wid)
                    if ar is None:
                        await asyncio.sleep(0.01)
                        continue
                    aid = ar.attempt.attempt_id
                    for s in make_spans(ar.rollout_id, aid, spans):
                        await client.add_span(s)
                    await client.update_attempt(ar.rollout_id, aid, status="succeeded")
                    done[0] += 1

            say("READY")
            assert (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go"
            await asyncio.gather(*(work(f"w{i}") for i in range(workers)))
            await client.close()
            say("STATS", proc_stats())
            return
        ar = await client.start_rollout(input="t")
        rid, aid = ar.rollout_id, ar.attempt.attempt_id
        if workload == "native":
            objs = make_spans(rid, aid, spans)
            say("READY")
            assert (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go"
            t0 = time.perf_counter()
            accepted = len(await client.add_many_spans(objs))
            elapsed = time.perf_counter() - t0
        else:
            bodies = otlp_payloads(rid, aid, spans, batch)
            say("READY")
            assert (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go"
            elapsed = await loop.run_in_executor(None, post_all, url, bodies)
            accepted = len(await client.query_spans(rid))
        await client.close()
        say("RESULT", {"elapsed_s": elapsed, "ok": accepted == spans, "accepted": accepted})
        say("STATS", proc_stats())

    asyncio.run(main())


# -- the orchestrator --------------------------------------------------------------------------
def ensure_agl(python: str | None) -> str:
    """The interpreter with ``agentlightning==0.3.0``: ``python``, or a venv built at /tmp/agl030."""
    if python:
        return python
    py = DEFAULT_VENV / "bin" / "python"
    probe = [str(py), "-c", "import agentlightning, sys; sys.stdout.write(agentlightning.__version__)"]
    if py.exists() and subprocess.run(probe, capture_output=True, text=True).stdout == AGL_VERSION:
        return str(py)
    subprocess.run([sys.executable, "-m", "venv", str(DEFAULT_VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    dry = subprocess.run(
        [*pip, "--dry-run", f"agentlightning=={AGL_VERSION}"], capture_output=True, text=True, check=True
    ).stdout
    if "torch-" in dry:  # its CPU build first, pinned, rather than whatever the resolver picks
        subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, f"agentlightning=={AGL_VERSION}"], check=True)
    return str(py)


def _expect(proc: subprocess.Popen[str], tag: str) -> Any:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process {proc.args!r} exited before {tag} (rc={proc.wait()})")
        if line.startswith(tag):
            rest = line[len(tag) :].strip()
            return json.loads(rest) if rest.startswith(("{", "[", '"')) else rest


def _send(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def run_one(side: str, workload: str, args: argparse.Namespace, store_kind: str = "memory") -> dict[str, Any]:
    """One fresh server and one client for ``workload``; what both measured."""
    py = args.agl_python if side == "agl" else sys.executable
    src = args.baseline_src if side == "base" else ROOT / "src"
    env = {**os.environ, "PYTHONPATH": str(src) + os.pathsep + str(ROOT)}
    role_side = "ours" if side == "base" else side
    if side == "agl":
        env.pop("PYTHONPATH")
        env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # its import would fetch a price list (offline here)
    me = str(Path(__file__).resolve())
    n = args.rollouts if workload == "loop" else args.spans
    log = open(args.log, "a")
    pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": log, "text": True}
    server = subprocess.Popen(
        [py, me, "--_role", f"{role_side}-server", workload, store_kind, str(n), str(args.workers)],
        env=env,
        **pipes,
    )
    client = None
    try:
        url = _expect(server, "URL")
        total = n + args.workers if workload == "loop" else n  # the warm-up rollouts as well
        ccmd = [py, me, "--_role", f"{role_side}-client", workload, url, str(total), str(args.workers)]
        ccmd += [str(args.spans_per_rollout if workload == "loop" else args.spans), str(args.batch)]
        cenv = dict(env)
        if side == "ours" and workload == "loop" and args.profile_client:
            cenv["AGL_BENCH_PROFILE"] = str(args.profile_client)
        client = subprocess.Popen(ccmd, env=cenv, **pipes)
        _expect(client, "READY")
        _send(server, "go")
        _send(client, "go")
        result = _expect(server if workload == "loop" else client, "RESULT")
        client_stats = _expect(client, "STATS")
        client.wait(120)
        _send(server, "stop")
        server_stats = _expect(server, "STATS")
        server.wait(60)
    finally:
        for p in (client, server):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        log.close()
    if not result.get("ok"):
        raise RuntimeError(f"{side} {workload}: the workload did not complete correctly: {result}")
    per_s = n / result["elapsed_s"]
    return {
        "per_s": per_s,
        "elapsed_s": result["elapsed_s"],
        "server": server_stats,
        "client": client_stats,
        "requests": result.get("requests", server_stats["requests"]),
        "by_path": result.get("by_path", {}),
    }


def role(argv: list[str]) -> None:
    name, workload, *rest = argv
    if name == "ours-server":
        ours_server(workload, rest[0], int(rest[1]), int(rest[2]))
    elif name == "agl-server":
        agl_server(workload, int(rest[1]), int(rest[2]))
    else:
        url, n, workers, spans, batch = rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[4])
        fn = ours_client if name == "ours-client" else agl_client
        fn(workload, url, n if workload == "loop" else spans, workers, spans, batch)


CONTENDERS = [
    ("loop", "ours", "memory"),
    ("loop", "agl", "memory"),
    ("loop", "ours", "sqlite"),
    ("native", "ours", "memory"),
    ("native", "agl", "memory"),
    ("otlp", "ours", "memory"),
    ("otlp", "agl", "memory"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--agl-python", help="an interpreter with agentlightning==0.3.0 (default: build /tmp/agl030)"
    )
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (median reported)")
    ap.add_argument("--rollouts", type=int, default=500)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--spans-per-rollout", type=int, default=6)
    ap.add_argument("--spans", type=int, default=2000, help="spans per ingestion workload")
    ap.add_argument("--batch", type=int, default=500, help="spans per request (ours, and OTLP for both)")
    ap.add_argument("--workloads", default="loop,native,otlp")
    ap.add_argument("--out", type=Path, default=HERE / "vs_agl_results.md")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    ap.add_argument("--log", default="/tmp/bench_vs_agl.log", help="the servers' and clients' stderr")
    ap.add_argument("--profile-client", type=Path, help="cProfile our loop client's workers, write here")
    ap.add_argument(
        "--baseline-src", type=Path, help="also run our loop from this src folder (the code before a change)"
    )
    ap.add_argument("--_role", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._role:
        role(args._role)
        return
    args.agl_python = ensure_agl(args.agl_python)
    wanted = set(args.workloads.split(","))
    todo = [c for c in CONTENDERS if c[0] in wanted]
    if args.baseline_src and "loop" in wanted:
        todo.insert(1, ("loop", "base", "memory"))
    args.load_before = _uptime()
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {c: [] for c in todo}
    for rep in range(args.repeats):
        for c in todo:
            r = run_one(c[1], c[0], args, c[2])
            runs[c].append(r)
            print(f"rep {rep + 1} {c}: {r['per_s']:,.0f}/s, {r['requests']} requests", flush=True)
    med = {c: _median(rs) for c, rs in runs.items()}
    text = report(med, runs, args)
    print(text)
    if not args.no_write:
        old = args.out.read_text() if args.out.exists() else ""
        kept = old[old.index("\n## ") :] if "\n## " in old else ""  # sections added by hand
        args.out.write_text(text + kept)
        args.out.with_suffix(".json").write_text(
            json.dumps({" ".join(c): rs for c, rs in runs.items()}, indent=1) + "\n"
        )


def _median(rs: list[dict[str, Any]]) -> dict[str, Any]:
    def m(f: Any) -> float:
        return float(statistics.median(f(r) for r in rs))

    return {
        "per_s": m(lambda r: r["per_s"]),
        "server_rss": m(lambda r: r["server"]["peak_rss_mb"]),
        "client_rss": m(lambda r: r["client"]["peak_rss_mb"]),
        "server_cpu": m(lambda r: r["server"]["cpu_s"]),
        "client_cpu": m(lambda r: r["client"]["cpu_s"]),
        "requests": m(lambda r: r["requests"]),
        "elapsed": m(lambda r: r["elapsed_s"]),
    }


def report(
    med: dict[Any, dict[str, Any]], runs: dict[Any, list[dict[str, Any]]], args: argparse.Namespace
) -> str:
    names = {
        "loop": f"rollout loop, rollouts/s ({args.rollouts}, {args.workers} workers, "
        f"{args.spans_per_rollout} spans each)",
        "native": f"raw span ingestion, spans/s ({args.spans} spans, each side's own client)",
        "otlp": f"OTLP/HTTP protobuf ingestion, spans/s ({args.spans} spans, {args.batch} per request)",
    }
    lines = [
        "| workload | side, store | per s (median) | all runs | ratio | server peak RSS MB | "
        "client peak RSS MB | server CPU s | client CPU s | requests | per rollout |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, m in med.items():
        workload, side, store = c
        theirs = med.get((workload, "agl", "memory"))
        ratio = m["per_s"] / theirs["per_s"] if theirs else float("nan")
        per_ro = f"{m['requests'] / args.rollouts:.1f}" if workload == "loop" else "-"
        label = {
            "ours": "agentlightning-lite",
            "base": f"agentlightning-lite before (`{args.baseline_src}`)",
            "agl": f"Agent Lightning {AGL_VERSION}",
        }[side] + f", {store}"
        every = ", ".join(f"{r['per_s']:,.0f}" for r in runs[c])
        lines.append(
            f"| {names[workload]} | {label} | {m['per_s']:,.0f} | {every} | {ratio:.2f}x | "
            f"{m['server_rss']:.0f} | {m['client_rss']:.0f} | {m['server_cpu']:.2f} | "
            f"{m['client_cpu']:.2f} | {m['requests']:.0f} | {per_ro} |"
        )
    by_path = []
    for c, rs in runs.items():
        if c[0] == "loop":
            paths = ", ".join(f"`{p}` {v / args.rollouts:.2f}" for p, v in sorted(rs[-1]["by_path"].items()))
            by_path.append(f"- {c[1]}, {c[2]}: {paths}")
    load = _uptime()
    cmd = "python -m benchmarks.perf.bench_vs_agl " + " ".join(sys.argv[1:])
    return (
        f"# agentlightning-lite against Agent Lightning {AGL_VERSION}: remote rollouts and span ingestion\n\n"
        f"Command: `{cmd}`  \n"
        f"Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}; `uptime` at the start: "
        f"`{args.load_before}`, at the end: `{load}`  \n"
        f"Repetitions: {args.repeats}, interleaved, a fresh server and client process per run; medians.  \n"
        "Measured on a shared machine under the load above: absolute figures are low and noisy, "
        "the ratios are what to read.\n\n"
        "Ratio: ours over Agent Lightning's (InMemoryLightningStore) for the same workload. CPU seconds: "
        "the whole process, warm-up and imports included. Requests: what the server received in the "
        "timed phase (an ASGI counter around each app); per rollout for the loop.\n\n"
        + "\n".join(lines)
        + "\n\nRequests per rollout by route (the last run):\n\n"
        + "\n".join(by_path)
        + "\n"
    )


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()
