"""In-process BM25 search standing in for WebShop's pyserini/Lucene index (no Java).

* Text analysis mirrors Lucene's English analyzer that pyserini uses: Unicode word tokens (``.`` and
  ``'`` join letters/digits, ``,`` joins digits), English possessive ``'s`` removed, lower-case, Lucene's
  33 English stop words, Porter stemming.
* Scoring is Lucene's BM25 with pyserini's defaults k1 = 0.9, b = 0.4; ties go to the lower document
  number, as in Lucene. ``search_exact`` scores every matching document (the reference path);
  ``search`` uses exact top-k with dynamic pruning (``pruned.py``) on catalogs of >= 50k documents and
  returns the same documents in the same order. Lucene's one-byte document-length norms are not
  reproduced (exact lengths are used), so near-tied scores can order differently.
* The index is a ``bm25s.BM25`` object (its CSC score matrix, vocabulary and save/load format). We fill
  its matrix with a vectorized builder, because bm25s's own indexer loops over documents in Python and
  the bridge must index synthetic catalogs of 1M+ products in seconds; a test checks both agree.
* One engine per catalog per process (``get_engine``); for big catalogs it is cached on disk
  (``bm25s`` format, memory-mapped on load).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .pruned import PruningState, pruned_top_k
from .stemmer import porter_stem


def _import_bm25s():
    """Import bm25s without JAX.

    When JAX is installed, bm25s imports it at import time and runs a ``top_k`` to probe the backend
    (seconds per process; it initializes XLA in env worker processes, and in a trainer process it would start
    JAX's backends before a multi-process job could form). We never use that path, so JAX is hidden for the
    duration of the import, loaded or not.
    """
    if "bm25s" in sys.modules:
        import bm25s

        return bm25s
    hidden = {name: sys.modules.get(name) for name in ("jax", "jax.lax")}
    sys.modules.update(dict.fromkeys(hidden))  # a None entry makes `import jax` raise ImportError
    try:
        import bm25s
    finally:
        for name, module in hidden.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return bm25s


bm25s = _import_bm25s()

SEARCH_RETURN_N = 50
K1, B = 0.9, 0.4
ANALYZER_VERSION = "lucene-en-porter-1"
DISK_CACHE_MIN_DOCS = 50_000
PRUNE_MIN_DOCS = 50_000  # below ~45k synthetic products scoring every match is as fast (< 1 ms)

LUCENE_STOP_WORDS = frozenset((  # Lucene's EnglishAnalyzer stop set
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not",
    "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
    "will", "with",
))
_TOKEN = re.compile(r"[^\W_]+(?:(?:[.'](?=[^\W_])|(?<=\d),(?=\d))[^\W_]+)*")


def analyze(text: str) -> list[str]:
    """Lucene-English-like analysis of ``text`` into index terms (see module docstring)."""
    out = []
    for tok in _TOKEN.findall(text.lower()):
        if tok.endswith("'s"):
            tok = tok[:-2]
        if tok and tok not in LUCENE_STOP_WORDS:
            out.append(porter_stem(tok))
    return out


def default_cache_dir() -> Path:
    """``$ESJAX_CACHE_DIR/webshop`` or ``~/.cache/esjax/webshop``."""
    root = os.environ.get("ESJAX_CACHE_DIR")
    return Path(root) / "webshop" if root else Path.home() / ".cache" / "esjax" / "webshop"



class SearchEngine:
    """BM25 over a fixed corpus; ``search(query)`` returns document numbers, best first."""

    def __init__(self, retriever: bm25s.BM25):
        self.retriever = retriever
        s = retriever.scores
        self._data = np.asarray(s["data"])
        self._indices = np.asarray(s["indices"])
        self._indptr = np.asarray(s["indptr"])
        self.num_docs = int(s["num_docs"])
        self.vocab: dict[str, int] = retriever.vocab_dict
        self.pruning = self.num_docs >= PRUNE_MIN_DOCS  # False: every search takes the exact path
        self._pruning_state = PruningState(self.num_docs)

    # -------------------------------------------------------------------------------- building
    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> SearchEngine:
        """Analyze and index raw document texts."""
        vocab: dict[str, int] = {}
        term_ids: list[int] = []
        lengths = np.zeros(len(texts), dtype=np.int64)
        for i, text in enumerate(texts):
            terms = analyze(text)
            lengths[i] = len(terms)
            term_ids.extend(vocab.setdefault(t, len(vocab)) for t in terms)
        doc_ids = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
        return cls.from_postings(doc_ids, np.asarray(term_ids, dtype=np.int64), vocab, len(texts))

    @classmethod
    def from_postings(cls, doc_ids: np.ndarray, term_ids: np.ndarray, vocab: dict[str, int],
                      num_docs: int) -> SearchEngine:
        """Index from one (document, term) entry per token occurrence."""
        doc_ids = np.asarray(doc_ids, dtype=np.int64)
        n = max(num_docs, 1)
        keys, tf = np.unique(np.asarray(term_ids, dtype=np.int64) * n + doc_ids, return_counts=True)
        doc_len = np.bincount(doc_ids, minlength=num_docs)
        return cls.from_term_counts(keys % n, keys // n, tf, doc_len, vocab)

    @classmethod
    def from_term_counts(cls, post_doc: np.ndarray, post_term: np.ndarray, tf: np.ndarray,
                         doc_len: np.ndarray, vocab: dict[str, int]) -> SearchEngine:
        """Index from unique (document, term, count) triples in any order."""
        order = np.lexsort((np.asarray(post_doc), np.asarray(post_term)))
        df = np.bincount(np.asarray(post_term)[order], minlength=len(vocab))
        return cls.from_csc(np.asarray(post_doc)[order], np.asarray(tf)[order], df, doc_len, vocab)

    @classmethod
    def from_csc(cls, post_doc: np.ndarray, tf: np.ndarray, df: np.ndarray, doc_len: np.ndarray,
                 vocab: dict[str, int]) -> SearchEngine:
        """Index from postings already in bm25s's CSC order (term-major, documents ascending).

        ``post_doc``/``tf``: one entry per (term, document) pair; ``df[t]``: the number of entries of term
        ``t``. Weights are Lucene's BM25, idf * tf / (tf + k1 * (1 - b + b * len / avg_len)) with
        idf = ln(1 + (N - df + 0.5) / (df + 0.5)), computed in blocks to bound memory.
        """
        num_docs = len(doc_len)
        n_vocab = len(vocab)
        df = np.asarray(df, dtype=np.int64)
        doc_len = np.asarray(doc_len, dtype=np.float32)
        avg_len = float(doc_len.mean()) if num_docs else 0.0
        norm_by_doc = (K1 * ((1 - B) + B * doc_len / max(avg_len, 1e-12))).astype(np.float32)
        idf = np.log1p((num_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
        indptr = np.zeros(n_vocab + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        post_doc = np.asarray(post_doc, dtype=np.int32)
        data = np.empty(len(post_doc), dtype=np.float32)
        block = 1 << 22
        for lo in range(0, len(post_doc), block):
            hi = min(lo + block, len(post_doc))
            term = np.searchsorted(indptr, np.arange(lo, hi), side="right") - 1
            f = np.asarray(tf[lo:hi], dtype=np.float32)
            data[lo:hi] = idf[term] * (f / (norm_by_doc[post_doc[lo:hi]] + f))
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        retriever.scores = {"data": data, "indices": post_doc, "indptr": indptr, "num_docs": int(num_docs)}
        retriever.vocab_dict = dict(vocab)
        retriever.unique_token_ids_set = set(vocab.values())
        retriever.nonoccurrence_array = None
        return cls(retriever)

    # ------------------------------------------------------------------------------- disk cache
    def save(self, directory: str | os.PathLike) -> None:
        """Write atomically in bm25s's format (a half-written cache is never picked up)."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=directory.parent))
        try:
            self.retriever.save(str(tmp), show_progress=False)
            if directory.exists():
                shutil.rmtree(directory, ignore_errors=True)
            os.replace(tmp, directory)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, directory: str | os.PathLike, mmap: bool = True) -> SearchEngine:
        return cls(bm25s.BM25.load(str(directory), mmap=mmap, show_progress=False))

    # -------------------------------------------------------------------------------- querying
    def query_ids(self, query: str) -> list[int]:
        """Term ids of the analyzed query, repeats kept (Lucene's bag-of-words query weights them)."""
        return [self.vocab[t] for t in analyze(query) if t in self.vocab]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (float64)."""
        ids = self.query_ids(query)
        if not ids:
            return np.zeros(self.num_docs)
        idx = np.concatenate([self._indices[self._indptr[t]:self._indptr[t + 1]] for t in ids])
        val = np.concatenate([self._data[self._indptr[t]:self._indptr[t + 1]] for t in ids])
        return np.bincount(idx, weights=val, minlength=self.num_docs)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Top-``k`` matching documents (score desc, then document number asc).

        Pruned (``search_pruned``) when ``self.pruning`` is set, else exact; both return the same list.
        """
        return self.search_pruned(query, k) if self.pruning else self.search_exact(query, k)

    def search_exact(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Top-``k`` by scoring every matching document: the reference path."""
        scores = self.scores(query)
        n = len(scores)
        kth = np.partition(scores, n - k)[n - k] if 0 < k < n else 0.0
        # every document tied with the k-th score is a candidate, so ties can go to the lower number
        cand = np.flatnonzero(scores >= kth) if kth > 0 else np.flatnonzero(scores)
        order = np.lexsort((cand, -scores[cand]))[:k]
        return cand[order].tolist()

    def search_pruned(self, query: str, k: int = SEARCH_RETURN_N, stats: dict | None = None) -> list[int]:
        """Top-``k`` with MaxScore-style pruning: identical to ``search_exact`` (see ``pruned.py``).

        ``stats``, if given, receives which path ran and how many candidates were scored.
        """
        ids = self.query_ids(query)
        return pruned_top_k(self._data, self._indices, self._indptr, ids, k, self._pruning_state,
                            lambda: self.search_exact(query, k), stats)


# ------------------------------------------------------------------------------ per-process cache
_ENGINES: dict[str, SearchEngine] = {}
_LOCK = threading.Lock()


def get_engine(key: str, build, num_docs: int, cache_dir: str | os.PathLike | None | bool = None) -> SearchEngine:
    """The engine for corpus ``key``: from this process's cache, else the disk cache, else ``build()``.

    ``cache_dir``: None -> the default directory, used only for corpora of >= 50k documents;
    a path -> always used; False -> never touch the disk.
    """
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is not None:
            return engine
        directory = None
        if cache_dir is not False and (cache_dir is not None or num_docs >= DISK_CACHE_MIN_DOCS):
            directory = Path(cache_dir if cache_dir else default_cache_dir()) / f"bm25-{key}"
        if directory is not None and (directory / "params.index.json").exists():
            try:
                engine = SearchEngine.load(directory)
            except Exception:
                engine = None  # a corrupt cache is rebuilt, never fatal
        if engine is None:
            engine = build()
            if num_docs >= DISK_CACHE_MIN_DOCS:
                _release_freed_memory()
            if directory is not None:
                with contextlib.suppress(OSError):  # a read-only cache location just means no caching
                    engine.save(directory)
        _ENGINES[key] = engine
        return engine


def _release_freed_memory() -> None:
    """Hand the index build's freed temporaries back to the OS (glibc keeps them otherwise, which leaves
    a 1M-product process 100-300 MiB above what it holds). A no-op off glibc."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def clear_engine_cache() -> None:
    """Forget this process's engines (tests and benchmarks use it to time a cold build)."""
    with _LOCK:
        _ENGINES.clear()
