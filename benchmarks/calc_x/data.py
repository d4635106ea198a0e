"""Calc-X data: the agent-lightning Calc-X split (8192 train / 500 test questions), loaded and selected.

The rows are MU-NLPC Calc-X rows (``id``, ``question``, ``chain``: a worked solution with calculator
calls, ``result``) as agent-lightning's Calc-X example trains on them. ``--data-dir`` points at a folder
holding ``calcx_agentlightning_{train,test}.jsonl`` (directly or in ``calcx/``); without it the two
Parquet files are downloaded once from GitHub at a fixed commit and converted (this needs ``pyarrow``).
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["SPLITS", "URLS", "download", "find_file", "load_dataset", "select"]

NAME = "calc_x"
SPLITS = ("train", "test")
#: the agent-lightning Calc-X files (a fork of microsoft/agent-lightning that commits them), pinned
COMMIT = "d5d2fcd64b7f68edf256054c02510f93bc08d39c"
URLS = {
    split: f"https://raw.githubusercontent.com/IsaacGHX/agent-lightning/{COMMIT}/data/{split}.parquet"
    for split in SPLITS
}


def _file_name(split: str) -> str:
    return f"calcx_agentlightning_{split}.jsonl"


def download(dest: Path) -> None:
    """Fetch both splits' Parquet files into ``dest`` as ``calcx_agentlightning_<split>.jsonl``."""
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow comes with the training extras
        raise SystemExit(
            "downloading Calc-X needs pyarrow (pip install pyarrow), or pass --data-dir"
        ) from None
    for split, url in URLS.items():
        raw = dest / f"{split}.parquet"
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:
                raw.write_bytes(resp.read())
        except (urllib.error.URLError, OSError) as exc:
            raise SystemExit(
                f"cannot download Calc-X from {url} ({exc}); pass --data-dir with "
                f"{_file_name('train')} and {_file_name('test')}"
            ) from None
        with (dest / _file_name(split)).open("w") as out:
            for row in pq.read_table(raw).to_pylist():
                row.pop("extra_info", None)
                row["source_ds"] = row["id"].split("__", 1)[0]
                out.write(json.dumps(row) + "\n")
        raw.unlink()


def find_file(split: str, data_dir: Path) -> Path:
    """The JSONL file of ``split`` in ``data_dir`` or ``data_dir/calcx``."""
    for folder in (data_dir / "calcx", data_dir):
        if (folder / _file_name(split)).is_file():
            return folder / _file_name(split)
    raise FileNotFoundError(f"no {_file_name(split)} in {data_dir} or {data_dir / 'calcx'}")


def load_dataset(split: str, data_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """All rows of ``split`` (``"train"`` or ``"test"``) in file order, as agent tasks.

    A task is ``{"id", "question", "result", "source_ds", "calc_steps", "chain"}``: ``calc_steps`` counts
    the calculator calls of the reference solution ``chain`` (0 for the multiple-choice rows that solve
    in prose).

    >>> tasks = load_dataset("test", SHARED_DATA)  # doctest: +SKIP
    >>> len(tasks), sorted(tasks[0])  # doctest: +SKIP
    (500, ['calc_steps', 'chain', 'id', 'question', 'result', 'source_ds'])
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    from .. import _harness

    folder = _harness.data_dir(Path(data_dir) if data_dir is not None else None, NAME, download)
    tasks = []
    with find_file(split, folder).open() as f:
        for line in f:
            row = json.loads(line)
            tasks.append(
                {
                    "id": row["id"],
                    "question": row["question"],
                    "result": row["result"],
                    "source_ds": row.get("source_ds") or row["id"].split("__", 1)[0],
                    "calc_steps": row["chain"].count('<gadget id="calculator">'),
                    "chain": row.get("chain") or "",
                }
            )
    return tasks


def select(tasks: list[dict[str, Any]], n: int, how: str) -> list[dict[str, Any]]:
    """``n`` tasks: ``"first"`` in file order; ``"easiest"``: numeric answers, fewest reference
    calculator steps (at least one), then shortest question (ties by id; deterministic);
    ``"word-problems"``: numeric answers, one reference calculator step, questions of at least
    :data:`WORD_PROBLEM_WORDS` words (stories, not bare sums), in a fixed pseudo-random order of their
    ids (not the shortest first; in the train split almost all ape210k); ``"english"``: numeric answers, one
    reference calculator step, from the English-language story sources (:data:`ENGLISH_SOURCES`: MAWPS,
    ASDiv, SVAMP, GSM8K, the held-out set's main sources), shortest question first. The train split holds
    few of them (38): ape210k's translated problems make up the rest of its one-step questions.

    >>> rows = [{"id": "a", "question": "long question?", "result": "4", "calc_steps": 1},
    ...         {"id": "b", "question": "short?", "result": "4", "calc_steps": 2},
    ...         {"id": "c", "question": "q?", "result": "C", "calc_steps": 1}]
    >>> [t["id"] for t in select(rows, 2, "easiest")]
    ['a', 'b']
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if how == "first":
        return tasks[:n]
    if how == "easiest":
        numeric = [t for t in tasks if t["calc_steps"] >= 1 and t["result"] not in ("A", "B", "C", "D", "E")]
        return sorted(numeric, key=lambda t: (t["calc_steps"], len(t["question"]), t["id"]))[:n]
    if how == "word-problems":
        stories = [
            t
            for t in tasks
            if t["calc_steps"] == 1
            and t["result"] not in ("A", "B", "C", "D", "E")
            and len(t["question"].split()) >= WORD_PROBLEM_WORDS
        ]
        return sorted(stories, key=lambda t: hashlib.sha256(t["id"].encode()).hexdigest())[:n]
    if how == "english":
        english = [
            t
            for t in tasks
            if t["calc_steps"] == 1
            and t["result"] not in ("A", "B", "C", "D", "E")
            and t.get("source_ds") in ENGLISH_SOURCES
        ]
        return sorted(english, key=lambda t: (len(t["question"]), t["id"]))[:n]
    raise ValueError(f"selection must be 'first', 'easiest', 'word-problems' or 'english', got {how!r}")


#: the ways :func:`select` picks questions
SELECTIONS = ("easiest", "first", "word-problems", "english")

#: the English-language story sources of Calc-X (the ``"english"`` selection)
ENGLISH_SOURCES = frozenset({"mawps", "asdiv_a", "svamp", "gsm8k"})

#: the fewest words of a ``"word-problems"`` question
WORD_PROBLEM_WORDS = 12
