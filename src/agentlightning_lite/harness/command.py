"""``agl.CommandAgent``: an agent whose body is a program launched once per rollout.

The program (a coding-agent CLI such as Claude Code, Codex or opencode, or any script) runs in its
own working directory with the rollout's endpoint in the variables such programs read, so every
model call it makes lands, with token ids, in that rollout; its output and exit status are recorded
as spans and the reward comes from a Python function or a verifier command run afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from ..agent import LitAgent
from ..tracer import SpanHandle, Tracer
from ..transitions import SIDE_AGENT
from . import sandbox

__all__ = ["SIDE_AGENT", "CommandAgent", "HarnessResult", "HarnessRun"]

# SIDE_AGENT: the agent name of side calls (titles, summaries, a harness's "small model"): a harness
# is given the side model ``<model>@side``, so these calls are recorded with ``agent="side"`` and
# ``agl.transitions`` leaves them out unless asked (``side_calls=True`` or ``agents=["side"]``).

#: Variables passed from this process to the program (everything else is left out, so that the
#: user's own API keys and tokens never reach it); ``env=`` adds more.
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "USER", "LOGNAME", "SHELL")

_TAIL = 64 * 1024  # the characters of stdout/stderr kept on the span


@dataclass
class HarnessRun:
    """One launch: where it runs and what it is told (given to ``setup`` and to recipes)."""

    task: Any
    prompt: str
    rollout_id: str | None
    run_dir: Path
    workdir: Path
    home: Path
    base_url: str  #: the OpenAI base URL the program calls (``.../v1``)
    api_key: str  #: the key the program sends
    model: str  #: the policy model's name
    side_model: str  #: the name to give a harness's side ("small") model
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)  #: added to the command line (after it)

    @property
    def root_url(self) -> str:
        """The base URL without ``/v1`` (what Anthropic clients take)."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url


@dataclass
class HarnessResult:
    """What one launch did: given to the reward function, recorded on the ``harness`` span."""

    task: Any
    workdir: Path
    exit_code: int | None  #: ``None`` when it was ended by the time limit
    timed_out: bool
    duration: float
    stdout: str
    stderr: str
    verifier_exit_code: int | None = None
    verifier_output: str | None = None  #: the verifier's stdout and stderr (their tails)
    verifier_stdout: str = ""

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "duration_s": round(self.duration, 3),
            "stdout": self.stdout[-_TAIL:],
            "stderr": self.stderr[-_TAIL:],
        }
        return out


Command = str | Sequence[str]
Reward = Callable[[HarnessResult], "float | None"]


class CommandAgent(LitAgent):
    """Train any program launched per rollout: one process per rollout, its calls in that rollout.

    ``command``: the program and its arguments (a list, or a string split like a shell would). Per
    rollout it gets:

    * a working directory of its own (``cwd``): empty, or a copy of ``template`` (a directory);
    * a HOME of its own (``XDG_*`` under it), where ``setup`` (or a recipe) writes the config it reads;
    * the rollout's endpoint: ``OPENAI_BASE_URL``/``OPENAI_API_BASE`` (``.../rollout/<id>/v1``),
      ``ANTHROPIC_BASE_URL`` (the same without ``/v1``), the key in ``OPENAI_API_KEY``,
      ``ANTHROPIC_AUTH_TOKEN`` and ``AGL_API_KEY`` (the rollout's own key, ``llm.rollout_key``, when
      the server has a key: it reaches this rollout's model calls only; else ``llm.api_key``), and
      ``AGL_MODEL``, ``AGL_SIDE_MODEL``, ``AGL_ROLLOUT_ID``, ``AGL_BASE_URL``, ``AGL_TASK_FILE``;
      nothing else of this process's environment but ``PATH``, the locale and ``TERM`` (so the
      user's own keys never reach it);
    * the task: ``task_via="arg"`` (the text replaces ``{task}`` in the command, or is appended),
      ``"stdin"``, or ``"file"`` (written to ``task_file`` in the working directory; ``{task_file}``
      in the command becomes its path). A dict task gives its ``"prompt"`` (else ``str(task)``).

    ``{workdir}``, ``{model}`` and ``{side_model}`` in the command are replaced as well.

    The program runs in its own process group and, with ``network="isolated"`` (the default), in
    new network and PID namespaces holding nothing but loopback, where ``127.0.0.1:<port>`` is
    forwarded to the server's port (see :mod:`.sandbox`; Linux, ``unshare``, root or user
    namespaces). ``network="host"`` runs it on this machine's network (only for programs you trust
    not to call anything else). After ``timeout`` seconds the whole group (and namespace) is ended.

    Recorded in the rollout (when one is open, as under the trainer or ``agl-lite runner``): an
    ``agent`` span ``harness`` (input: the command, cwd; output: exit code, whether it timed out,
    the duration, the tails of stdout and stderr; status ``error`` on a non-zero exit, a timeout or
    a program that cannot start, such as a missing binary: the span is recorded and the error raised),
    and a ``tool`` span ``verifier`` for the verifier command. Every model call of the run is an
    ``llm`` span of the server, in this rollout.

    Reward: ``reward(result) -> float | None`` (a :class:`HarnessResult`), else the ``verifier``
    command run in the working directory afterwards (with the same environment and ``AGL_TASK``):
    the float on the last line of its stdout if there is one, else 1.0 for exit status 0 and 0.0
    otherwise. Neither: 1.0 when the program exited 0, else 0.0.

    ``keep_workdirs``: leave the per-rollout directories (``workdir_root`` or a temporary one).

    >>> import sys, agentlightning_lite as agl
    >>> agent = agl.CommandAgent([sys.executable, "-c", "import sys; print(sys.argv[1][::-1])", "{task}"],
    ...                          network="host", reward=lambda r: float(r.stdout.strip() == "cba"))
    >>> llm = agl.LLM(base_url="http://127.0.0.1:9/rollout/r1/v1", model="m", rollout_id="r1")
    >>> agent("abc", llm)
    1.0
    """

    def __init__(
        self,
        command: Command,
        *,
        task_via: Literal["arg", "stdin", "file"] = "arg",
        task_file: str = "TASK.md",
        template: str | os.PathLike[str] | None = None,
        timeout: float = 600.0,
        env: Mapping[str, str] | None = None,
        reward: Reward | None = None,
        verifier: Command | None = None,
        verifier_timeout: float = 120.0,
        network: Literal["isolated", "host"] = "isolated",
        setup: Callable[[HarnessRun], None] | None = None,
        workdir_root: str | os.PathLike[str] | None = None,
        keep_workdirs: bool = False,
        name: str = "harness",
    ) -> None:
        self.command = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.command:
            raise ValueError("CommandAgent needs a command")
        if task_via not in ("arg", "stdin", "file"):
            raise ValueError(f"task_via must be 'arg', 'stdin' or 'file', got {task_via!r}")
        if network not in ("isolated", "host"):
            raise ValueError(f"network must be 'isolated' or 'host', got {network!r}")
        self.task_via = task_via
        self.task_file = task_file
        self.template = None if template is None else Path(template)
        if self.template is not None and not self.template.is_dir():
            raise ValueError(f"template must be a directory: {self.template}")
        self.timeout = float(timeout)
        self.env = dict(env or {})
        self.reward = reward
        self.verifier = (
            None
            if verifier is None
            else shlex.split(verifier)
            if isinstance(verifier, str)
            else list(verifier)
        )
        self.verifier_timeout = float(verifier_timeout)
        self.network = network
        self.setup = setup
        self.workdir_root = None if workdir_root is None else Path(workdir_root)
        self.keep_workdirs = keep_workdirs
        self.name = name

    def __repr__(self) -> str:
        return f"CommandAgent({shlex.join(self.command)!r}, network={self.network!r})"

    # -- one rollout ----------------------------------------------------------------------
    def rollout(self, task: Any, llm: Any) -> float | None:
        if self.network == "isolated":
            why = _isolation_problem()
            if why is not None:
                raise RuntimeError(f"CommandAgent(network='isolated') cannot run here: {why}")
        if self.workdir_root is not None:
            self.workdir_root.mkdir(parents=True, exist_ok=True)
        rid = getattr(llm, "rollout_id", None)
        run_dir = Path(tempfile.mkdtemp(prefix=f"agl-harness-{_safe(rid or 'run')}-", dir=self.workdir_root))
        bridge: sandbox.Bridge | None = None
        try:
            run = self._prepare(task, llm, run_dir)
            if self.network == "isolated":
                host, port = _host_port(llm.base_url)
                bridge = sandbox.Bridge(sandbox.socket_path(), host, port)
            result = self._launch(run, bridge)
            if bridge is not None:
                bridge.close()
                bridge = None
            reward = self._reward(run, result)
            return reward
        finally:
            if bridge is not None:
                bridge.close()
            if not self.keep_workdirs:
                shutil.rmtree(run_dir, ignore_errors=True)

    def _prepare(self, task: Any, llm: Any, run_dir: Path) -> HarnessRun:
        workdir, home = run_dir / "work", run_dir / "home"
        if self.template is not None:
            shutil.copytree(self.template, workdir, symlinks=True)
        else:
            workdir.mkdir()
        home.mkdir()
        base_url = llm.base_url.rstrip("/")
        if self.network == "isolated":
            base_url = _on_loopback(base_url)
        model = str(llm.model)
        run = HarnessRun(
            task=task,
            prompt=prompt_of(task),
            rollout_id=getattr(llm, "rollout_id", None),
            run_dir=run_dir,
            workdir=workdir,
            home=home,
            base_url=base_url,
            api_key=str(getattr(llm, "rollout_key", None) or getattr(llm, "api_key", None) or "agl-no-key"),
            model=model,
            side_model=f"{model.rpartition('@')[0] or model}@{SIDE_AGENT}",
        )
        run.env = self._environment(run)
        if self.task_via == "file":
            (workdir / self.task_file).write_text(run.prompt)
        if self.setup is not None:
            self.setup(run)
        return run

    def _environment(self, run: HarnessRun) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.setdefault("PATH", os.defpath)
        home = str(run.home)
        env.update(
            {
                "HOME": home,
                "XDG_CONFIG_HOME": f"{home}/.config",
                "XDG_CACHE_HOME": f"{home}/.cache",
                "XDG_DATA_HOME": f"{home}/.local/share",
                "XDG_STATE_HOME": f"{home}/.local/state",
                "TMPDIR": str(run.run_dir),
                "OPENAI_BASE_URL": run.base_url,
                "OPENAI_API_BASE": run.base_url,
                "OPENAI_API_KEY": run.api_key,
                "ANTHROPIC_BASE_URL": run.root_url,
                "ANTHROPIC_AUTH_TOKEN": run.api_key,
                "AGL_BASE_URL": run.base_url,
                "AGL_API_KEY": run.api_key,
                "AGL_MODEL": run.model,
                "AGL_SIDE_MODEL": run.side_model,
                "AGL_ROLLOUT_ID": run.rollout_id or "",
                "AGL_TASK_FILE": str(run.workdir / self.task_file),
                "NO_PROXY": "*",
            }
        )
        env.update(self.env)
        return env

    def _argv(self, run: HarnessRun) -> list[str]:
        values = {
            "task": run.prompt,
            "workdir": str(run.workdir),
            "task_file": str(run.workdir / self.task_file),
            "model": run.model,
            "side_model": run.side_model,
        }
        has_task = any("{task}" in a for a in self.command)
        argv = [_fill(a, values) for a in self.command] + list(run.args)
        if self.task_via == "arg" and not has_task:
            argv.append(run.prompt)
        return argv

    def _launch(self, run: HarnessRun, bridge: sandbox.Bridge | None) -> HarnessResult:
        argv = self._argv(run)
        if bridge is not None:
            _, port = _host_port(run.base_url)
            argv = sandbox.isolated_command(argv, bridge.path, port)
        ro = Tracer.current_rollout()
        span = (
            ro.tracer.start_span(
                "agent",
                self.name,
                input={"command": self._argv(run), "cwd": str(run.workdir), "network": self.network},
                attributes={"harness": True},
                activate=True,
            )
            if ro is not None
            else None
        )
        try:
            result = self._run(run, argv, span)
        except BaseException as exc:  # recorded whatever happens: a missing binary has no exit code
            if span is not None:
                span.end(error=f"{self.command[0]}: cannot run: {type(exc).__name__}: {exc}")
            raise
        if span is not None:
            span.end()
        return result

    def _run(self, run: HarnessRun, argv: list[str], span: SpanHandle | None) -> HarnessResult:
        out_path, err_path = run.run_dir / "stdout.txt", run.run_dir / "stderr.txt"
        start = time.monotonic()
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                cwd=run.workdir,
                env=run.env,
                stdin=subprocess.PIPE if self.task_via == "stdin" else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group, ended as a whole
            )
            try:
                if self.task_via == "stdin":
                    assert proc.stdin is not None
                    with contextlib.suppress(BrokenPipeError):
                        proc.stdin.write(run.prompt.encode())
                    with contextlib.suppress(BrokenPipeError):
                        proc.stdin.close()
                proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _end_group(proc)
        result = HarnessResult(
            task=run.task,
            workdir=run.workdir,
            exit_code=None if timed_out else proc.returncode,
            timed_out=timed_out,
            duration=time.monotonic() - start,
            stdout=_tail(out_path),
            stderr=_tail(err_path),
        )
        if span is not None:
            span.set_output(result.record())
            if timed_out or result.exit_code != 0:
                why = f"timed out after {self.timeout:g} s" if timed_out else f"exit code {result.exit_code}"
                span.set_error(f"{self.command[0]}: {why}")
        return result

    def _reward(self, run: HarnessRun, result: HarnessResult) -> float | None:
        if self.verifier is not None:
            self._verify(run, result)
        if self.reward is not None:
            return self.reward(result)
        if self.verifier is not None:
            return _verifier_reward(result)
        return 1.0 if result.exit_code == 0 else 0.0

    def _verify(self, run: HarnessRun, result: HarnessResult) -> None:
        assert self.verifier is not None
        values = {
            "task": run.prompt,
            "workdir": str(run.workdir),
            "task_file": str(run.workdir / self.task_file),
        }
        argv = [_fill(a, values) for a in self.verifier]
        env = dict(run.env) | {"AGL_TASK": run.prompt, "AGL_EXIT_CODE": str(result.exit_code)}
        ro = Tracer.current_rollout()
        span = (
            ro.tracer.start_span("tool", "verifier", input={"command": argv}, activate=True)
            if ro is not None
            else None
        )
        try:
            done = subprocess.run(
                argv,
                cwd=run.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.verifier_timeout,
                start_new_session=True,
            )
            result.verifier_exit_code = done.returncode
            result.verifier_output = (
                done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
            )[-_TAIL:]
            result.verifier_stdout = done.stdout.decode(errors="replace")[-_TAIL:]
        except subprocess.TimeoutExpired:
            result.verifier_exit_code = None
            result.verifier_output = f"timed out after {self.verifier_timeout:g} s"
        except BaseException as exc:  # recorded whatever happens (a verifier that cannot start)
            if span is not None:
                span.end(error=f"verifier: {type(exc).__name__}: {exc}")
            raise
        if span is not None:
            span.set_output({"exit_code": result.verifier_exit_code, "output": result.verifier_output})
            if result.verifier_exit_code != 0:
                span.set_error(f"verifier: exit code {result.verifier_exit_code}")
            span.end()


def prompt_of(task: Any) -> str:
    """The text given to the program for ``task``: a dict's ``"prompt"``, else ``str(task)``.

    >>> prompt_of({"prompt": "fix the bug", "answer": 3}), prompt_of("hi")
    ('fix the bug', 'hi')
    """
    if isinstance(task, Mapping) and "prompt" in task:
        return str(task["prompt"])
    return str(task)


def _verifier_reward(result: HarnessResult) -> float:
    lines = [line.strip() for line in result.verifier_stdout.strip().splitlines() if line.strip()]
    if lines:
        with contextlib.suppress(ValueError):
            value = float(lines[-1])
            if value == value and abs(value) != float("inf"):
                return value
    return 1.0 if result.verifier_exit_code == 0 else 0.0


def _fill(arg: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def _tail(path: Path) -> str:
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size > 4 * _TAIL:
            f.seek(size - 4 * _TAIL)
        return f.read().decode(errors="replace")[-_TAIL:]


def _end_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """End the process group of ``proc`` (SIGTERM, then SIGKILL after ``grace`` seconds)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40]


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.hostname is None:
        raise ValueError(f"no host in {url!r}")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _on_loopback(url: str) -> str:
    """``url`` with its host replaced by ``127.0.0.1`` (inside the sandbox the bridged port is there)."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"a sandboxed program reaches its server over plain http on loopback, not {url!r}")
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{_host_port(url)[1]}"))


_ISOLATION: list[str | None] = []


def _isolation_problem() -> str | None:
    if not _ISOLATION:
        _ISOLATION.append(sandbox.isolation_available())
    return _ISOLATION[0]


def new_key() -> str:
    """A fresh random key (for a rollout's own credential)."""
    return "agl-" + secrets.token_urlsafe(24)
