"""MuSiQue-Ans data: the question files, their pooled paragraph corpus, and the download.

Splits (the official MuSiQue format, each question with its 20 paragraphs, 2-4 of them supporting):

- ``train``: ``hipporag_musique_train100.json``, 100 answerable train questions (HippoRAG's sample);
- ``dev`` (alias ``test``): ``musique_ans_dev_sample200.jsonl``, 200 answerable dev questions.

A split's corpus is the union of its questions' paragraphs, de-duplicated on (title, text), in order
of first appearance: 1890 paragraphs for train and 3141 for dev, exactly the HippoRAG train corpus and
``musique_dev200_corpus.jsonl``. Each task names its corpus file and the positions of its own 20
paragraphs (and of the supporting ones) in it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FILES", "Corpus", "download", "load_corpus", "load_split", "split_file"]

_RAW = "https://raw.githubusercontent.com"


@dataclass(frozen=True)
class _Source:
    filename: str
    url: str
    sha256_prefix: str  #: the first 16 hex digits of the file's sha256 (from the data's SOURCES.md)


#: split -> where its file comes from (public repositories, pinned commits)
FILES: dict[str, _Source] = {
    "train": _Source(
        "hipporag_musique_train100.json",
        f"{_RAW}/OSU-NLP-Group/HippoRAG/3d95d255a8db0c1699b853cfb4fbe5056708162d/data/musique_train.json",
        "bca674746844637f",
    ),
    "dev": _Source(
        "musique_ans_dev_sample200.jsonl",
        f"{_RAW}/AdelWang/MIGRES/1de6265c9ca1014054d6ba875738e785830908f8/data/musique.json",
        "bbc98ab676941cf3",
    ),
}
_ALIASES = {"test": "dev", "validation": "dev", "val": "dev"}


def download(dest: Path) -> None:
    """Fetch both splits' files into ``dest`` and check their checksums; a clear error when offline."""
    for src in FILES.values():
        target = dest / src.filename
        try:
            with urllib.request.urlopen(src.url, timeout=60) as resp:
                body = resp.read()
        except (urllib.error.URLError, TimeoutError) as exc:
            raise SystemExit(
                f"cannot download MuSiQue ({src.url}): {exc}. Offline? Pass --data-dir DIR with "
                f"{', '.join(s.filename for s in FILES.values())} (in DIR or DIR/musique)."
            ) from None
        digest = hashlib.sha256(body).hexdigest()
        if not digest.startswith(src.sha256_prefix):
            raise SystemExit(f"{src.url}: sha256 {digest[:16]}..., expected {src.sha256_prefix}...")
        target.write_bytes(body)


def split_file(split: str, data_dir: Path) -> Path:
    """The question file of ``split`` under ``data_dir`` (or ``data_dir/musique``)."""
    name = _ALIASES.get(split, split)
    if name not in FILES:
        raise ValueError(f"unknown MuSiQue split {split!r}: use train or dev (test)")
    filename = FILES[name].filename
    for folder in (data_dir / "musique", data_dir):
        if (folder / filename).is_file():
            return (folder / filename).resolve()
    raise FileNotFoundError(f"{filename} not found in {data_dir} or {data_dir / 'musique'}")


@functools.lru_cache(maxsize=4)
def _questions(path: Path) -> tuple[dict[str, Any], ...]:
    text = path.read_text(encoding="utf-8")
    rows = (
        json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x]
    )
    return tuple(rows)


@dataclass(frozen=True)
class Corpus:
    """A split's de-duplicated paragraphs; ``key`` identifies the whole content (for the index cache)."""

    titles: tuple[str, ...]
    texts: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.texts)

    @functools.cached_property
    def ids(self) -> tuple[str, ...]:
        """A content id per paragraph: the first 12 hex digits of sha1(title, text)."""
        return tuple(
            hashlib.sha1(f"{title}\x1f{text}".encode()).hexdigest()[:12]
            for title, text in zip(self.titles, self.texts, strict=True)
        )

    @functools.cached_property
    def key(self) -> str:
        """A hash of the whole corpus (its ids, in order)."""
        return hashlib.sha256(" ".join(self.ids).encode()).hexdigest()[:16]

    def render(self, i: int, words: int = 0) -> str:
        """Paragraph ``i`` as ``Title: text``, cut to its first ``words`` words (0: all of it)."""
        tokens = self.texts[i].split()
        body = " ".join(tokens[:words]) + " ..." if 0 < words < len(tokens) else " ".join(tokens)
        return f"{self.titles[i]}: {body}"


def _build(path: Path) -> tuple[Corpus, list[dict[str, Any]]]:
    index: dict[tuple[str, str], int] = {}
    tasks = []
    for q in _questions(path):
        own, supporting = [], []
        for p in q["paragraphs"]:
            pos = index.setdefault((p["title"], p["paragraph_text"]), len(index))
            own.append(pos)
            if p.get("is_supporting"):
                supporting.append(pos)
        answers = [q["answer"], *[a for a in q.get("answer_aliases") or [] if a != q["answer"]]]
        tasks.append(
            {
                "id": q["id"],
                "question": q["question"],
                "answers": answers,
                "corpus": str(path),
                "paragraphs": own,
                "supporting": supporting,
            }
        )
    titles, texts = zip(*index, strict=True) if index else ((), ())
    return Corpus(tuple(titles), tuple(texts)), tasks


@functools.lru_cache(maxsize=4)
def _cached(path: Path) -> tuple[Corpus, list[dict[str, Any]]]:
    return _build(path)


def load_corpus(path: str | Path) -> Corpus:
    """The pooled corpus of the question file at ``path`` (what a task's ``corpus`` names)."""
    return _cached(Path(path).resolve())[0]


def load_split(split: str, data_dir: Path) -> list[dict[str, Any]]:
    """The tasks of ``split``: ``id, question, answers`` (gold first, then aliases), ``corpus`` (the
    question file), ``paragraphs`` (the question's 20 corpus positions) and ``supporting``."""
    return [dict(t) for t in _cached(split_file(split, data_dir))[1]]
