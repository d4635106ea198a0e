"""Layout rules: short modules, `rl/` below `remote/`, engines used through their contract."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import agentlightning_lite

PACKAGE = Path(agentlightning_lite.__file__).parent
MAX_LINES = 600


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_longer_than_600_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in _modules(PACKAGE)
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert len(_modules(PACKAGE)) > 50  # the walk found the package
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def _imported(source: str, package: list[str]) -> set[str]:
    """The absolute names of the modules ``source`` (a module of ``package``) imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


def _imports(path: Path) -> set[str]:
    package = ["agentlightning_lite", *path.relative_to(PACKAGE).parent.parts]
    return _imported(path.read_text(encoding="utf-8"), package)


def test_relative_imports_are_resolved() -> None:
    rl = ["agentlightning_lite", "rl"]
    assert "agentlightning_lite.remote.ray_runners" in _imported("from ..remote.ray_runners import X", rl)
    assert "agentlightning_lite.remote.runners" in _imported("from ..remote import runners", rl)
    assert "agentlightning_lite.rl.grpo" in _imported("from .grpo import GRPO", rl)
    assert "agentlightning_lite.remote" in _imported("import agentlightning_lite.remote", rl)
    in_function = "def f():\n    from ...agentlightning_lite import remote\n"
    assert _imported(in_function, ["pkg", "a", "b"]) >= {"pkg.agentlightning_lite.remote"}


def test_nothing_in_rl_imports_remote() -> None:
    upward = {
        str(p.relative_to(PACKAGE)): sorted(
            n
            for n in _imports(p)
            if n == "agentlightning_lite.remote" or n.startswith("agentlightning_lite.remote.")
        )
        for p in _modules(PACKAGE / "rl")
    }
    assert {k: v for k, v in upward.items() if v} == {}


PROBE = re.compile(r"\b(?:getattr|hasattr)\(\s*[\w.]*engine\b")


def test_engines_are_never_probed_for_attributes() -> None:
    """Code asks an engine what it can do through the protocols of ``serving.engines.contract``."""
    probes = [
        f"{p.relative_to(PACKAGE)}:{i}: {line.strip()}"
        for p in _modules(PACKAGE)
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if PROBE.search(line)
    ]
    assert PROBE.search('getattr(server.engine, "version", 0)')  # the pattern catches the probes it is for
    assert probes == []
