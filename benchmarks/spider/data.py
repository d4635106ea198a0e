"""Spider's dev set as train/test tasks: held-out by database, with compact ``CREATE TABLE`` schemas.

The files (``dev.json``, ``dev_gold.sql``, ``tables.json``, ``database/<db>/<db>.sqlite``) come from
``--data-dir`` (a Spider directory, or a directory holding ``spider/``) or are downloaded once from the
GitHub commit named in ``SOURCE``; ``wta_1`` has no SQLite file there and is skipped.

>>> split_of("singer"), split_of("concert_singer")
('test', 'train')
"""

from __future__ import annotations

import hashlib
import json
import random
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from .. import _harness

#: the repository and commit the offline copy in ``/work/shared/data/spider`` was taken from
#: (its ``dev.json`` / ``tables.json`` are byte-identical to the official ``taoyds/spider``'s, which
#: ships no SQLite files)
SOURCE = (
    "https://raw.githubusercontent.com/hyukkyukang/text2SQL/"
    "999f5e467a3c2a263533f1dfa3d0106a18d343d1/datasets/spider/"
)
#: sha256 prefixes of the JSON/SQL files at that commit (SOURCES.md)
CHECKSUMS = {
    "dev.json": "30d64a3fccde4932",
    "dev_gold.sql": "0b14e99791ebc597",
    "tables.json": "61bb20aa401f0316",
}
#: the one dev database whose SQLite file the source never committed
MISSING_DATABASES = frozenset({"wta_1"})
#: share of databases (in tenths) that the hash in :func:`split_of` sends to the test split
TEST_TENTHS = 3

Split = Literal["train", "test"]


def split_of(db_id: str) -> Split:
    """The split of a database: a fixed hash of its name, so no test database is ever trained on.

    With the 19 dev databases this puts 5 (218 questions) in test: course_teach, orchestra,
    poker_player, singer, student_transcripts_tracking.
    """
    digest = hashlib.sha256(f"spider-split:{db_id}".encode()).hexdigest()
    return "test" if int(digest, 16) % 10 < TEST_TENTHS else "train"


def download(dest: Path) -> None:
    """Fetch the dev set and its SQLite databases into ``dest`` (``dest/dev.json``, ``dest/database/...``)."""

    def fetch(rel: str) -> bytes:
        url = SOURCE + rel
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:
                return resp.read()
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise SystemExit(
                f"cannot download Spider from {url} ({exc}). Offline? Pass --data-dir with a Spider "
                "directory (dev.json, dev_gold.sql, tables.json, database/<db>/<db>.sqlite)."
            ) from None

    for name, prefix in CHECKSUMS.items():
        data = fetch(name)
        if not hashlib.sha256(data).hexdigest().startswith(prefix):
            raise SystemExit(f"downloaded {name} does not match the expected sha256 {prefix}...")
        (dest / name).write_bytes(data)
    db_ids = sorted({ex["db_id"] for ex in json.loads((dest / "dev.json").read_text())} - MISSING_DATABASES)
    for db_id in db_ids:
        rel = f"database/{db_id}/{db_id}.sqlite"
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        print(f"downloading {rel}", flush=True)
        target.write_bytes(fetch(rel))


def spider_dir(data_dir: Path | str | None = None) -> Path:
    """The directory holding ``dev.json``: ``data_dir`` itself or its ``spider/``, else the download cache."""
    root = _harness.data_dir(Path(data_dir) if data_dir is not None else None, "spider", download)
    for candidate in (root, root / "spider"):
        if (candidate / "dev.json").is_file():
            return candidate
    raise SystemExit(f"{root}: no dev.json there or in {root / 'spider'} (expected Spider's dev set)")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def schema_text(db_path: Path) -> str:
    """A compact ``CREATE TABLE`` statement per table, read from the SQLite file itself.

    >>> print(schema_text(Path("singer.sqlite")))  # doctest: +SKIP
    CREATE TABLE singer (Singer_ID int PRIMARY KEY, Name text, Birth_Year real, ...);
    CREATE TABLE song (Song_ID int PRIMARY KEY, Title text, Singer_ID int REFERENCES singer(Singer_ID), ...);
    """
    from .readonly import connect_readonly

    con = connect_readonly(db_path)
    try:
        tables = [
            r[0]
            for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                "ORDER BY rowid"
            )
        ]
        lines = []
        for table in tables:
            refs = {
                row[3]: f"{row[2]}({row[4]})" if row[4] else row[2]
                for row in con.execute(f"PRAGMA foreign_key_list({_quote(table)})")
            }
            cols = []
            for _cid, name, ctype, _notnull, _default, pk in con.execute(
                f"PRAGMA table_info({_quote(table)})"
            ):
                col = f"{name} {ctype.lower()}".strip()
                if pk:
                    col += " PRIMARY KEY"
                if name in refs:
                    col += f" REFERENCES {refs[name]}"
                cols.append(col)
            lines.append(f"CREATE TABLE {table} ({', '.join(cols)});")
    finally:
        con.close()
    return "\n".join(lines)


def _examples(root: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    dev = json.loads((root / "dev.json").read_text())
    gold = [line.rsplit("\t", 1) for line in (root / "dev_gold.sql").read_text().splitlines() if line.strip()]
    if len(gold) != len(dev):
        raise SystemExit(f"{root}: dev_gold.sql has {len(gold)} lines for {len(dev)} questions")
    for i, (ex, (query, db_id)) in enumerate(zip(dev, gold, strict=True)):
        if db_id.strip() != ex["db_id"]:
            raise SystemExit(f"{root}: dev_gold.sql line {i + 1} is for {db_id}, dev.json says {ex['db_id']}")
        yield i, {**ex, "query": query.strip()}


def load_dataset(
    split: str,
    data_dir: Path | str | None = None,
    *,
    max_schema_chars: int | None = None,
    max_question_chars: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The tasks of ``split``: ``train``, or ``test`` (alias ``val``: the held-out databases), shuffled.

    A task is ``{"id", "db_id", "question", "query" (gold SQL), "db_path", "schema"}``. Questions on
    databases without a SQLite file are skipped. ``max_schema_chars`` / ``max_question_chars`` keep
    only tasks whose schema text / question is at most that long (short prompts for CPU runs).
    """
    if split not in ("train", "test", "val"):
        raise ValueError(f"split must be 'train', 'test' or 'val' (= test), got {split!r}")
    want: Split = "train" if split == "train" else "test"
    root = spider_dir(data_dir)
    schemas: dict[str, str | None] = {}
    tasks = []
    for i, ex in _examples(root):
        db_id = ex["db_id"]
        if split_of(db_id) != want:
            continue
        db_path = (root / "database" / db_id / f"{db_id}.sqlite").resolve()
        if db_id not in schemas:
            schemas[db_id] = schema_text(db_path) if db_path.is_file() else None
        schema = schemas[db_id]
        if schema is None:
            continue
        if max_schema_chars is not None and len(schema) > max_schema_chars:
            continue
        if max_question_chars is not None and len(ex["question"]) > max_question_chars:
            continue
        tasks.append(
            {
                "id": f"dev-{i}",
                "db_id": db_id,
                "question": ex["question"],
                "query": ex["query"],
                "db_path": str(db_path),
                "schema": schema,
            }
        )
    random.Random(seed).shuffle(tasks)
    return tasks


__all__ = ["SOURCE", "download", "load_dataset", "schema_text", "spider_dir", "split_of"]
