"""The package's promises to tools: type information ships with it, each module logs under its own name."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import agentlightning_lite

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    tomllib = None

PACKAGE = Path(agentlightning_lite.__file__).parent
ROOT = PACKAGE.parent.parent


def test_package_is_marked_typed() -> None:
    # PEP 561: without py.typed a user's type checker treats every agentlightning_lite name as Any
    assert (PACKAGE / "py.typed").is_file()
    if tomllib is not None:
        config = tomllib.loads((ROOT / "pyproject.toml").read_text())
        assert "py.typed" in config["tool"]["setuptools"]["package-data"]["agentlightning_lite"]


def _logger_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, source) of every ``logging.getLogger(...)`` call whose argument is not ``__name__``."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "logging"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("agentlightning_lite")
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_every_module_logs_under_its_own_name() -> None:
    # logging.getLogger(__name__): `agentlightning_lite.store` configures the store modules' loggers,
    # `agentlightning_lite.rl` the trainer's, whatever module logs
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50
    wrong = {
        str(path.relative_to(PACKAGE)): names
        for path in modules
        if (names := _logger_names(ast.parse(path.read_text(), str(path))))
    }
    assert wrong == {}
