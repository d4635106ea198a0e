"""Remote runners against in-process rollouts; span ingestion over HTTP against the in-process store.

1. Rollouts per second, a trivial agent (one chat call to the scripted engine, reward 1.0), 16
   rollouts at a time: in-process (``run_rollouts``: threads of the trainer) against remote (an
   ``agl-lite runner --workers 16`` process claiming from the trainer's queue over HTTP).
2. Spans per second into the trainer's SQLiteStore: a sender process posting batches of native
   span rows (``/agl/v1/spans``) or OTLP protobuf (``/v1/traces``), against the tracer writing
   the same spans into an in-process SQLiteStore.
3. The runner's memory: its RSS after the rollouts, less that of a process that imports the
   agent (and ``openai``) and makes one call (the agent's own).
4. Per-request latency: the median of sequential small requests on one connection (a chat
   completion; a batch of 10 native span rows), as a lone agent or runner sees it.

The server's event loop is ``--loop`` (``auto``: uvloop when installed; ``asyncio``: plain asyncio,
what installs without uvloop get).

    python -m benchmarks.perf.bench_remote     # prints a table, writes remote_results.md and .json
    python -m benchmarks.perf.bench_remote --loop asyncio --latency-only   # section 4 alone, no files
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agentlightning_lite as agl
from agentlightning_lite.store.rows import span_to_row

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROMPT = [{"role": "user", "content": "What is 12 * 7 + 3? Use the calculator."}]


def trivial_agent(task: Any, llm: agl.LLM) -> float:
    """One chat call, reward 1.0: the cost of the path, not of an agent."""
    llm.openai_client(max_retries=0).chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": str(task)}]
    )
    return 1.0


LOOP = "auto"  # the PolicyServer's event loop (--loop)


def _engine() -> Any:
    from agentlightning_lite.serving.engines import ScriptedEngine

    return ScriptedEngine(["87"], tokenizer="bytes")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- 1. rollouts -------------------------------------------------------------------------------
def rollouts_in_process(n: int, workers: int, db: Path) -> float:
    from agentlightning_lite.rl.rollouts import RolloutSpec, run_rollouts

    with agl.SQLiteStore(db) as store, agl.PolicyServer(_engine(), store, loop=LOOP) as server:
        tracer = agl.Tracer(store)
        run_rollouts(trivial_agent, [RolloutSpec(i) for i in range(workers)], tracer, server.llm, workers)
        t0 = time.perf_counter()
        res = run_rollouts(trivial_agent, [RolloutSpec(i) for i in range(n)], tracer, server.llm, workers)
        dt_ = time.perf_counter() - t0
        assert all(r.status == "succeeded" for r in res), res[:3]
    return n / dt_


def rollouts_remote(n: int, workers: int, db: Path) -> tuple[float, float]:
    """Rollouts/s through a runner process, and that process's RSS (MB) afterwards."""
    with agl.SQLiteStore(db) as store:
        runners = agl.RemoteRunners(port=0)
        server = runners.serve(_engine(), store, server_options={"loop": LOOP})
        cmd = [sys.executable, "-m", "agentlightning_lite.cli", "runner"]
        cmd += ["benchmarks.perf.bench_remote:trivial_agent", "--server", runners.url]
        cmd += ["--workers", str(workers), "--log-level", "warning"]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            runners.run([(i, "train", {}) for i in range(workers)])  # warm-up: imports, connections
            t0 = time.perf_counter()
            jobs = runners.run([(i, "train", {}) for i in range(n)])
            dt_ = time.perf_counter() - t0
            assert all(j.status == "succeeded" for j in jobs)
            rss = _rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
            runners.stop()
            server.stop()
    return n / dt_, rss


def agent_baseline_rss() -> float:
    """RSS of a process that imports the agent (openai, httpx, pydantic) and makes one call."""
    with agl.MemoryStore() as store, agl.PolicyServer(_engine(), store, loop=LOOP) as server:
        code = (
            "import sys\nfrom benchmarks.perf.bench_remote import trivial_agent\n"
            "from agentlightning_lite.serving.llm import LLM\n"
            f"trivial_agent('x', LLM(base_url={server.base_url!r}, model='scripted'))\n"
            "print('ready', flush=True)\nsys.stdin.readline()\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        rss = _rss_mb(proc.pid)
        proc.communicate("\n", timeout=30)
    return rss


# -- 2. spans ----------------------------------------------------------------------------------
def make_spans(rollout_id: str, n: int) -> list[agl.Span]:
    out = []
    for i in range(n):
        llm = i % 2 == 0
        out.append(
            agl.Span(
                span_id=f"{rollout_id[:8]}{i:012x}",
                rollout_id=rollout_id,
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
        )
    return out


def spans_in_process(n: int, db: Path) -> float:
    with agl.SQLiteStore(db) as store:
        rid = store.start_rollout("t").rollout_id
        rows = [span_to_row(s) for s in make_spans(rid, n)]
        t0 = time.perf_counter()
        for k in range(0, n, 500):
            store.add_span_rows(rows[k : k + 500])
        store.flush()
        return n / (time.perf_counter() - t0)


def _otlp_payloads(rid: str, spans: list[agl.Span], batch: int) -> list[bytes]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def kv(key: str, value: str) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(string_value=value))

    out = []
    for k in range(0, len(spans), batch):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.append(kv("agentlightning.rollout_id", rid))
        ss = rs.scope_spans.add()
        for s in spans[k : k + batch]:
            p = ss.spans.add()
            p.trace_id = bytes.fromhex(rid[:32].ljust(32, "0"))
            p.span_id = os.urandom(8)
            p.name = s.name
            p.start_time_unix_nano = int(s.start_time * 1e9)
            p.end_time_unix_nano = int((s.end_time or s.start_time) * 1e9)
            op = "chat" if s.kind == "llm" else "execute_tool"
            p.attributes.extend(
                [kv("gen_ai.operation.name", op), kv("gen_ai.input.messages", json.dumps(s.input))]
            )
            p.attributes.append(kv("gen_ai.output.messages", json.dumps(s.output)))
            if s.prompt_token_ids:
                ids = p.attributes.add()
                ids.key = "agentlightning.prompt_token_ids"
                ids.value.array_value.values.extend(AnyValue(int_value=t) for t in s.prompt_token_ids)
        out.append(req.SerializeToString())
    return out


def sender(url: str, kind: str, rid: str, n: int, batch: int) -> None:
    """(In a subprocess) post ``n`` spans in batches; prints spans/s as seen by the sender."""
    import httpx

    spans = make_spans(rid, n)
    if kind == "native":
        bodies = [
            json.dumps({"rows": [list(span_to_row(s)) for s in spans[k : k + batch]]}).encode()
            for k in range(0, n, batch)
        ]
        path, ctype = "/agl/v1/spans", "application/json"
    else:
        bodies = _otlp_payloads(rid, spans, batch)
        path, ctype = "/v1/traces", "application/x-protobuf"
    with httpx.Client(base_url=url, headers={"content-type": ctype}, timeout=60) as http:
        t0 = time.perf_counter()
        for body in bodies:
            r = http.post(path, content=body)
            r.raise_for_status()
        print(n / (time.perf_counter() - t0))


def spans_remote(kind: str, n: int, batch: int, db: Path) -> float:
    with agl.SQLiteStore(db) as store:
        runners = agl.RemoteRunners(port=0)
        server = runners.serve(_engine(), store, server_options={"loop": LOOP})
        rid = store.start_rollout("t").rollout_id
        try:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.perf.bench_remote",
                    "--_send",
                    kind,
                    runners.url,
                    rid,
                    str(n),
                    str(batch),
                ],
                cwd=ROOT,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            store.flush()
            assert len(store.spans(rid)) == n
        finally:
            runners.stop()
            server.stop()
    return float(out.stdout.strip().splitlines()[-1])


# -- 4. latency -------------------------------------------------------------------------------
def latency_ms(n: int = 50) -> dict[str, float]:
    """Median ms of ``n`` sequential requests on one keep-alive connection (after one warm-up)."""
    import statistics

    import httpx

    with agl.MemoryStore() as store:
        runners = agl.RemoteRunners(port=0)
        server = runners.serve(_engine(), store, server_options={"loop": LOOP})
        rid = store.start_rollout("t").rollout_id
        chat = {"model": server.model_name, "messages": PROMPT, "max_tokens": 8}
        spans = make_spans(rid, 10 * (n + 1))
        rows = [list(span_to_row(s)) for s in spans]
        batches = [{"rows": rows[k : k + 10]} for k in range(0, len(rows), 10)]
        out: dict[str, float] = {}
        try:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                chat_path = f"/rollout/{rid}/v1/chat/completions"
                for name, send in (
                    ("chat_completion", lambda i: http.post(chat_path, json=chat)),
                    ("span_batch_10", lambda i: http.post("/agl/v1/spans", json=batches[i])),
                ):
                    send(n).raise_for_status()
                    times = []
                    for i in range(n):
                        t0 = time.perf_counter()
                        send(i).raise_for_status()
                        times.append(time.perf_counter() - t0)
                    out[name] = 1000 * statistics.median(times)
        finally:
            runners.stop()
            server.stop()
    return out


# -- the table ---------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=400, help="rollouts per contender")
    ap.add_argument("--workers", type=int, default=16, help="rollouts at a time")
    ap.add_argument("--spans", type=int, default=20000, help="spans per ingestion contender")
    ap.add_argument("--batch", type=int, default=500, help="spans per HTTP request")
    ap.add_argument("--out", type=Path, default=HERE / "remote_results.md")
    ap.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto", help="server event loop")
    ap.add_argument("--latency-only", action="store_true", help="print section 4 alone; write no files")
    ap.add_argument("--_send", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global LOOP
    LOOP = args.loop
    if args.latency_only:
        lat = latency_ms()
        print(", ".join(f"{k}: {v:.2f} ms" for k, v in lat.items()) + f" (median of 50, loop={LOOP})")
        return
    if args._send:
        kind, url, rid, n, batch = args._send
        sender(url, kind, rid, int(n), int(batch))
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        r_local = rollouts_in_process(args.rollouts, args.workers, d / "a.db")
        r_remote, runner_rss = rollouts_remote(args.rollouts, args.workers, d / "b.db")
        baseline = agent_baseline_rss()
        s_local = spans_in_process(args.spans, d / "c.db")
        s_native = spans_remote("native", args.spans, args.batch, d / "d.db")
        s_otlp = spans_remote("otlp", args.spans, args.batch, d / "e.db")
        lat = latency_ms()
    ratio = r_remote / r_local
    overhead = runner_rss - baseline
    results = {
        "command": "python -m benchmarks.perf.bench_remote " + " ".join(sys.argv[1:]),
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "rollouts": args.rollouts,
        "workers": args.workers,
        "rollouts_per_s": {"in_process": r_local, "remote": r_remote, "ratio": ratio},
        "spans_per_s": {"in_process_sqlite": s_local, "http_native": s_native, "http_otlp_protobuf": s_otlp},
        "runner_rss_mb": runner_rss,
        "agent_baseline_rss_mb": baseline,
        "runner_overhead_mb": overhead,
        "server_loop": LOOP,
        "latency_ms_median": lat,
        "targets": {
            "remote_rollouts_ratio>=0.5": ratio >= 0.5,
            "remote_spans_per_s>=20000": s_native >= 20000,
            "runner_overhead_mb<50": overhead < 50,
        },
    }
    rows = [
        (
            f"rollouts/s, trivial agent, {args.workers} at a time",
            f"{r_local:,.1f}",
            f"{r_remote:,.1f}",
            f"{ratio:.2f}",
        ),
        (
            "spans/s into SQLiteStore, native rows over HTTP",
            f"{s_local:,.0f}",
            f"{s_native:,.0f}",
            f"{s_native / s_local:.2f}",
        ),
        (
            "spans/s into SQLiteStore, OTLP protobuf over HTTP",
            f"{s_local:,.0f}",
            f"{s_otlp:,.0f}",
            f"{s_otlp / s_local:.2f}",
        ),
        (f"runner RSS, MB (agent alone: {baseline:.0f} MB)", "-", f"{runner_rss:.0f}", f"+{overhead:.0f} MB"),
        ("ms per request, one chat completion (median of 50)", "-", f"{lat['chat_completion']:.2f}", "-"),
        ("ms per request, a batch of 10 span rows (median of 50)", "-", f"{lat['span_batch_10']:.2f}", "-"),
    ]
    table = "| measurement | in-process | remote | ratio |\n|---|---:|---:|---:|\n" + "".join(
        "| " + " | ".join(r) + " |\n" for r in rows
    )

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    verdict = (
        f"Targets: remote rollouts >= 0.5x in-process at {args.workers} workers: {ratio:.2f}x "
        f"({met(ratio >= 0.5)}); remote span ingestion >= 20,000 spans/s: {s_native:,.0f} native, "
        f"{s_otlp:,.0f} OTLP ({met(s_native >= 20000)}); runner < 50 MB beyond the agent: "
        f"+{overhead:.0f} MB ({met(overhead < 50)})."
    )
    header = (
        "# Remote runners and span ingestion\n\n"
        f"Command: `{results['command']}`  \nDate: {results['date']}; machine: {results['machine']} "
        "(shared with other jobs).  \n"
        f"Workload: {args.rollouts} rollouts of a trivial agent (one chat call to the scripted engine) per "
        f"contender, {args.workers} at a time, store SQLite; {args.spans} spans (half LLM calls with 64+32 "
        f"token ids and logprobs, half tool calls) in batches of {args.batch} per request, sent by another "
        f"process. The remote runner is an `agl-lite runner` process. Server event loop: `{LOOP}` "
        "(`auto`: uvloop when installed).\n\n"
    )
    print(table + "\n" + verdict)
    args.out.write_text(header + table + "\n" + verdict + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
