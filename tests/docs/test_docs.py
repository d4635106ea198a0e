"""Every ```python block in README.md and docs/**/*.md runs, so the documentation cannot go stale.

Markers, an HTML comment on the line(s) right before a block:

* ``<!-- docs-test: skip REASON -->``: not run (keep these few: a GPU, a long training run).
* ``<!-- docs-test: requires MODULE[, MODULE...] -->``: skipped when a module is not installed
  (the framework adapters' pages).

Each block runs on its own (fresh globals, in an empty temporary directory), so every block must be
self-contained. Blocks that load the embedded model (``Trainer(``, ``HFEngine(``) or start an MCP server
(``stdio_client(``) are marked slow.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
_MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|requires)\s*(.*?)\s*-->")
_SLOW = ("Trainer(", "HFEngine(", "evaluate(", "stdio_client(")  # load the model; start an MCP server

#: pages whose blocks are known not to run yet; xfail (not skip) so they show up
PENDING: dict[str, str] = {}


@dataclass
class Block:
    path: str
    line: int
    code: str
    skip: str | None
    requires: list[str]


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The python blocks of one markdown file, with the markers right before each."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip().splitlines()
        skip, requires = None, []
        while before and _MARKER.search(before[-1]):  # markers stacked right above the fence
            kind, arg = _MARKER.search(before.pop()).groups()  # type: ignore[union-attr]
            if kind == "skip":
                skip = arg or "marked skip"
            else:
                requires += [x.strip() for x in arg.split(",") if x.strip()]
        line = text.count("\n", 0, m.start()) + 1
        out.append(Block(str(path.relative_to(ROOT)), line, m.group(1), skip, requires))
    return out


def _params() -> list[object]:
    params = []
    for f in doc_files():
        for b in blocks(f):
            marks = []
            if any(s in b.code for s in _SLOW):
                marks.append(pytest.mark.slow)
            if b.path in PENDING:
                marks.append(pytest.mark.xfail(reason=PENDING[b.path], strict=False))
            params.append(pytest.param(b, id=f"{b.path}:{b.line}", marks=marks))
    return params


def test_the_docs_have_blocks_and_few_skips() -> None:
    all_blocks = [b for f in doc_files() for b in blocks(f)]
    assert len(all_blocks) >= 10
    skipped = [b for b in all_blocks if b.skip]
    assert len(skipped) <= max(2, len(all_blocks) // 5), [f"{b.path}:{b.line}" for b in skipped]


def test_marker_parsing(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "text\n\n<!-- docs-test: skip needs a GPU -->\n```python\nraise SystemExit\n```\n\n"
        "<!-- docs-test: requires langchain_core, agents -->\n```python\nx = 1\n```\n```python\ny = 2\n```\n"
    )
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        got = [(b.line, b.skip, b.requires, b.code) for b in blocks(md)]
    finally:
        ROOT = old
    assert got == [
        (4, "needs a GPU", [], "raise SystemExit\n"),
        (9, None, ["langchain_core", "agents"], "x = 1\n"),
        (12, None, [], "y = 2\n"),
    ]


@pytest.mark.parametrize("block", _params())
def test_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.skip:
        pytest.skip(f"{block.path}:{block.line}: {block.skip}")
    for module in block.requires:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{block.path}:{block.line} needs {module}, which is not installed")
    monkeypatch.chdir(tmp_path)
    code = compile(block.code, f"{block.path}:{block.line}", "exec")
    namespace: dict[str, object] = {"__name__": "__docs__"}
    try:
        exec(code, namespace)
    finally:
        for value in list(namespace.values()):  # release servers, stores and trainers the block left open
            close = (
                getattr(value, "close", None) if type(value).__module__.startswith("agentlightning") else None
            )
            if callable(close):
                try:
                    close()
                except Exception:
                    pass
