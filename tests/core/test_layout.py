"""Layout rules: short modules, `rl/` below `remote/`, engines used through their contract."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import agentlightning_lite

PACKAGE = Path(agentlightning_lite.__file__).parent
MAX_LINES = 500


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_longer_than_500_lines() -> None:
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


# -- the import graph: layers, no arrow back up, no circle -------------------------------------------------
#: each top-level module or package, by layer (bottom first): an import stays in its layer or goes down
LAYERS: list[set[str]] = [
    {"_compat", "_json", "_lazy", "_toolcalls", "errors", "ids", "version", "models", "agent", "types"},
    {"store"},
    {"tracer", "span_handles", "join", "credit", "air", "lora_settings"},
    {"transitions", "prompts", "otel", "sft_export", "run_settings"},
    {"serving", "adapters", "harness"},
    {"rl"},
    {"apo", "remote", "ui"},
    {"<root>"},  # the facade: its heavy names load on first use (no import statement)
    {"cli"},
]


def _runtime_imports(path: Path) -> set[str]:
    """The package's modules that ``path`` imports when it runs (in functions too; not the imports under
    ``if TYPE_CHECKING:``, which are for the type checker only)."""
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = ["agentlightning_lite", *rel.parts]
    package = parts[:-1]  # the package a relative import starts from (for __init__ too)
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                module = ".".join([*base, *([child.module] if child.module else [])])
                out.update(f"{module}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {n for n in out if n.startswith("agentlightning_lite.")}


def _module_graph() -> dict[str, set[str]]:
    names = {}
    for p in _modules(PACKAGE):
        rel = p.relative_to(PACKAGE).with_suffix("").parts
        names[".".join(["agentlightning_lite", *(rel[:-1] if rel[-1] == "__init__" else rel)])] = p
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = set()
        for imported in _runtime_imports(path):
            while imported not in names and "." in imported:  # a name inside a module: the module
                imported = imported.rsplit(".", 1)[0]
            if imported in names and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def test_the_import_graph_runs_down_its_layers() -> None:
    layer = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    graph = _module_graph()
    assert {_unit(m) for m in graph} <= set(layer), "a new top-level module: give it a layer"
    upward = sorted(
        f"{m} -> {t}" for m, targets in graph.items() for t in targets if layer[_unit(t)] > layer[_unit(m)]
    )
    assert upward == []


def test_the_import_graph_has_no_circle() -> None:
    graph = _module_graph()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for t in sorted(graph[node]):
            if state.get(t) == 1:
                circles.append([*path[path.index(t) :], t])
            elif t not in state:
                visit(t, [*path, t])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


PRIVATE = re.compile(r"\b(?:trainer|Trainer)\.(?!_generate_and_score_completions)_[a-z]\w*")  # not TRL's


def test_only_the_trainer_touches_its_private_members() -> None:
    """The step's seam is public (``trainer.rollouts``, ``trainer.learner``): nothing else reaches in."""
    root = PACKAGE.parents[1]
    files = [*_modules(PACKAGE), *_modules(root / "tests"), *_modules(root / "benchmarks")]
    found = [
        f"{p.relative_to(root)}:{i}"
        for p in files
        if p.name != "test_layout.py" and p != PACKAGE / "rl" / "trainer.py"
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert PRIVATE.search("trainer._serving()")
    assert found == []


SERVER_PRIVATE = re.compile(r"\bserver\._[a-z]\w*")


def test_only_the_server_touches_its_private_members() -> None:
    """Routes, runners and tests reach the PolicyServer's state through its public members (``rollouts``,
    ``responses``, ``uvicorn_config``...), never ``server._...``."""
    root = PACKAGE.parents[1]
    files = [*_modules(PACKAGE), *_modules(root / "tests"), *_modules(root / "benchmarks")]
    found = [
        f"{p.relative_to(root)}:{i}"
        for p in files
        if p.name != "test_layout.py" and p != PACKAGE / "serving" / "server.py"
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if SERVER_PRIVATE.search(line)
    ]
    assert SERVER_PRIVATE.search("runners.server._known_rollouts.add(rid)")
    assert found == []


def test_the_routes_see_the_server_through_its_context_protocol() -> None:
    """``serving/routes`` depends on ``serving.context.ServingContext``, not on the server (not even for
    types): the server imports its routes, never the other way round."""
    server = "agentlightning_lite.serving.server"
    back = {
        str(p.relative_to(PACKAGE)): sorted(
            n for n in _imports(p) if n == server or n.startswith(server + ".")
        )
        for p in _modules(PACKAGE / "serving" / "routes")
    }
    assert len(back) >= 7  # the walk found the routes
    assert {k: v for k, v in back.items() if v} == {}
