"""Exact BM25 top-k with dynamic pruning (MaxScore-style), in numpy over the CSC postings.

``pruned_top_k`` returns exactly what ``SearchEngine.search_exact`` returns (same documents, same order,
ties to the lower document number) while touching a fraction of the postings of a query's common terms.

Why it is exact
---------------
* Per-term upper bounds: term ``t`` (repeated ``c`` times in the query) adds at most ``ub_t = c * max
  weight of t`` to any document. Terms are processed by ``ub`` descending (rarest first, in practice);
  ``R[i]`` is the sum of the bounds of terms ``i..m-1`` (padded up by a relative 1e-9 so float64
  rounding never makes it a little too small).
* ``theta`` is always a lower bound on the k-th best exact score: it is the k-th largest of partial or
  full scores of k distinct documents (each at most that document's exact score), scaled down by 1e-9.
* Essential terms: a document containing none of the first ``j`` terms scores at most ``R[j]``; once
  ``R[j] < theta`` only the postings of the first ``j`` terms can hold a top-k document (usually j = 1).
* A candidate whose partial score over the terms seen so far plus ``R`` of the terms still to see is below
  ``theta`` cannot reach the top k and is dropped; the bound is strict, so documents tied with the k-th
  score always survive.
* The survivors' scores are then recomputed term by term in the query's own order, the same float64
  additions ``np.bincount`` makes in the exact path, so scores, ties and order are bit-identical.

How it is fast
--------------
The first terms (rare) are accumulated by walking their postings through a per-thread document ->
candidate-slot map; before the first term whose postings are much longer than the candidate list, a
*lookahead* computes the full scores of the ``LOOKAHEAD_SEEDS`` best partial candidates, whose k-th best
gives a theta close to the final one, so the expensive common terms are looked up only for the few
hundred candidates that survive. A look-up is a binary search into the term's postings, or, for terms in
>= 1/16 of the documents, one read of a per-term bitmap plus a popcount (``DenseTerm``, built on first
use): a binary search into a 500k-posting list misses the cache at most of its ~20 probes. Queries whose
essential terms cover too much of the corpus fall back to the exact path.
"""

from __future__ import annotations

import threading

import numpy as np

LOOKAHEAD_SEEDS = 512     # candidates whose full scores give the early theta
LOOKAHEAD_DF_RATIO = 6.0  # look ahead before the first term with > 6x as many postings as candidates
FALLBACK_FRACTION = 0.25  # essential postings above this share of the documents: exact path is cheaper
DENSE_FRACTION = 16       # terms in >= 1/16 of the documents get a bitmap + rank index (see DenseTerm)
_SLACK = 1e-9
_ONE = np.uint64(1)


def _popcount_swar(x: np.ndarray) -> np.ndarray:
    """Bits set in each uint64 (numpy < 2 has no ``np.bitwise_count``)."""
    x = x - ((x >> _ONE) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


_popcount = getattr(np, "bitwise_count", _popcount_swar)


class DenseTerm:
    """Constant-time "where is document d in this term's postings" for a common term.

    A binary search into a long posting list costs ~20 cache-missing probes per document; a bitmap of
    the documents (1 bit each) plus the number of postings before each 64-bit word (``rank``) answers
    it with one word read and a popcount. Built only for terms in >= 1/``DENSE_FRACTION`` of the
    documents, so it takes at most 3/16 byte per document and term, under 0.4x those terms' postings.
    """

    def __init__(self, post: np.ndarray, num_docs: int):
        bits = np.zeros(-(-num_docs // 64) * 64, dtype=bool)
        bits[post] = True
        self.words = np.packbits(bits, bitorder="little").view("<u8").astype(np.uint64, copy=False)
        self.rank = np.zeros(len(self.words), dtype=np.int32)
        np.cumsum(_popcount(self.words[:-1]), dtype=np.int32, out=self.rank[1:])

    def find(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in ``docs`` of the documents in this term, their positions in its posting list)."""
        word_ix = docs >> 6
        word = self.words[word_ix]
        bit = _ONE << (docs & 63).astype(np.uint64)
        hit = np.flatnonzero(word & bit)
        return hit, self.rank[word_ix[hit]] + _popcount(word[hit] & (bit[hit] - _ONE)).astype(np.int32)


class PruningState:
    """Per-engine lazily filled data: the max posting weight of each term, the dense terms' bitmaps,
    and per-thread scratch."""

    def __init__(self, num_docs: int):
        self.num_docs = num_docs
        self.max_weight: dict[int, float] = {}
        self.dense: dict[int, DenseTerm] = {}
        self._local = threading.local()

    def dense_term(self, t: int, indices: np.ndarray, lo: int, hi: int) -> DenseTerm | None:
        """Term ``t``'s bitmap index (built on first use), or None for a term too rare to need one."""
        d = self.dense.get(t)
        if d is None and (hi - lo) * DENSE_FRACTION >= self.num_docs:
            d = self.dense[t] = DenseTerm(indices[lo:hi], self.num_docs)
        return d

    def dense_nbytes(self) -> int:
        """Memory held by the bitmaps built so far (benchmarks report it)."""
        return sum(d.words.nbytes + d.rank.nbytes for d in list(self.dense.values()))

    def posmap(self) -> np.ndarray:
        """This thread's document -> 1 + candidate position map (all 0, "not a candidate", between queries)."""
        m = getattr(self._local, "posmap", None)
        if m is None:
            m = self._local.posmap = np.zeros(self.num_docs, dtype=np.int32)
        return m

    def drop_posmap(self) -> None:
        self._local.posmap = None

    def __getstate__(self) -> dict:  # picklable (the per-thread scratch is not carried over)
        return {"num_docs": self.num_docs, "max_weight": dict(self.max_weight)}

    def __setstate__(self, state: dict) -> None:
        self.num_docs, self.max_weight = state["num_docs"], state["max_weight"]
        self.dense = {}
        self._local = threading.local()


def _kth(values: np.ndarray, k: int) -> float:
    """k-th largest of ``values`` (0 when there are fewer than k)."""
    n = len(values)
    return float(np.partition(values, n - k)[n - k]) if n >= k else 0.0


def _lookup(indices: np.ndarray, data: np.ndarray, lo: int, hi: int, dense: DenseTerm | None, docs: np.ndarray):
    """Positions in ``docs`` (sorted) that term postings ``[lo, hi)`` contain, and their weights."""
    if dense is not None:
        hit, pos = dense.find(docs)
        return hit, data[lo:hi][pos]  # (int32 pos + a large lo could overflow)
    post = indices[lo:hi]
    if hi == lo or len(docs) == 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=data.dtype)
    pos = np.searchsorted(post, docs)
    pos[pos == len(post)] = 0
    hit = np.flatnonzero(post[pos] == docs)
    return hit, data[lo + pos[hit]]


def _walk_is_cheaper(df: int, n_cand: int, dense: bool) -> bool:
    """Walking df postings through the map (~6 ns each) vs n_cand look-ups: bitmap (~8 ns each) or
    binary search (~3-4 ns per level)."""
    return 6 * df < (8 * n_cand if dense else 3.5 * n_cand * np.log2(df + 1))


def _span(indices: np.ndarray, indptr: np.ndarray, t: int, state: PruningState):
    """(start, end, bitmap index or None) of term ``t``'s postings."""
    lo, hi = int(indptr[t]), int(indptr[t + 1])
    return lo, hi, state.dense_term(t, indices, lo, hi)


def _one_pass(data, indices, spans, mults, R, cand, P, start, theta, k, posmap, stats):
    """Score candidates ``cand`` (sorted document numbers) over terms ``start..`` with pruning.

    ``P[1 + c]`` holds the partial score of ``cand[c]``; ``P[0]`` is a dummy slot that absorbs walked
    postings of documents outside ``cand`` (the map sends them to 0). Pruned candidates keep their slots
    (so the map, once set, never changes) and leave ``alive``. Returns the candidates that can still
    reach the top k, their full scores (summation order not the exact path's) and the updated theta.
    """
    m = len(spans)
    n0 = len(cand)
    alive = np.arange(1, n0 + 1)  # slots of the candidates still in the running
    looked = mapped = False
    try:
        for i in range(start, m):
            lo, hi, dense = spans[i]
            df = hi - lo
            if not looked and df > LOOKAHEAD_DF_RATIO * n0:
                looked = True
                theta = max(theta, _lookahead(data, indices, spans[i:], mults[i:], cand, P, alive, k))
                stats["lookahead_at"] = i
            if looked:
                alive = alive[P[alive] + R[i] >= theta]
            if _walk_is_cheaper(df, len(alive), dense is not None):
                if not mapped:
                    mapped = True
                    posmap[cand] = np.arange(1, n0 + 1, dtype=np.int32)
                w = data[lo:hi]
                P += np.bincount(np.take(posmap, indices[lo:hi]), weights=w if mults[i] == 1 else w * mults[i],
                                 minlength=len(P))
            else:
                hit, w = _lookup(indices, data, lo, hi, dense, cand[alive - 1])
                P[alive[hit]] += w * mults[i]
    finally:
        if mapped:
            posmap[cand] = 0
    P = P[alive]
    theta = max(theta, _kth(P, k) * (1 - _SLACK))
    keep = theta <= P
    return cand[alive[keep] - 1], P[keep], theta


def _lookahead(data, indices, spans, mults, cand, P, alive, k) -> float:
    """A lower bound on the k-th best score: the full scores of the ``LOOKAHEAD_SEEDS`` best partial
    scores (``spans`` are the terms not yet added), k-th best, scaled down by the slack."""
    n = len(alive)
    s = min(LOOKAHEAD_SEEDS, n)
    top = np.sort(alive[np.argpartition(P[alive], n - s)[n - s:]]) if s < n else alive
    seeds, full = cand[top - 1], P[top]
    for (lo, hi, dense), mult in zip(spans, mults, strict=True):
        hit, w = _lookup(indices, data, lo, hi, dense, seeds)
        full[hit] += w * mult
    return _kth(full, k) * (1 - _SLACK)


def pruned_top_k(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, query_ids: list[int], k: int,
                 state: PruningState, exact, stats: dict | None = None) -> list[int]:
    """Top-``k`` documents for the query term ids ``query_ids`` (repeats kept), identical to ``exact()``.

    ``exact`` is called (no arguments) when pruning would not pay; ``stats``, if given, receives
    diagnostics (``path``: 'pruned' or 'exact'; candidate and survivor counts).
    """
    stats = {} if stats is None else stats
    num_docs = state.num_docs
    if not query_ids or k <= 0:
        stats["path"] = "empty"
        return []
    if k >= num_docs:
        stats["path"] = "exact"
        return exact()
    uniq, mult = np.unique(np.asarray(query_ids, dtype=np.int64), return_counts=True)
    df = (indptr[uniq + 1] - indptr[uniq]).astype(np.int64)
    ub = np.empty(len(uniq))
    for n, (t, c) in enumerate(zip(uniq.tolist(), mult.tolist(), strict=True)):
        mw = state.max_weight.get(t)
        if mw is None:
            lo, hi = int(indptr[t]), int(indptr[t + 1])
            mw = state.max_weight[t] = float(data[lo:hi].max()) if hi > lo else 0.0
        ub[n] = c * mw
    order = np.lexsort((df, -ub))
    terms, ub, df = uniq[order], ub[order], df[order]
    mults = mult[order].astype(np.float64)
    spans = [_span(indices, indptr, t, state) for t in terms.tolist()]
    m = len(terms)
    R = np.zeros(m + 1)
    R[:m] = np.cumsum(ub[::-1])[::-1] * (1 + _SLACK)
    cum_df = np.cumsum(df)

    posmap = state.posmap()
    theta, j, passes = 0.0, 1, 0
    try:
        while True:
            passes += 1
            if cum_df[j - 1] > FALLBACK_FRACTION * num_docs:
                stats.update(path="exact", essential=j, passes=passes)
                return exact()
            if j == 1:
                lo, hi, _ = spans[0]
                cand = indices[lo:hi]
                P = np.empty(len(cand) + 1)
                P[0] = 0.0
                P[1:] = data[lo:hi]
                P[1:] *= mults[0]
                start = 1
            else:
                cand = np.unique(np.concatenate([indices[lo:hi] for lo, hi, _ in spans[:j]]))
                P = np.zeros(len(cand) + 1)
                start = 0
            stats["candidates"] = len(cand)
            cand, P, theta = _one_pass(data, indices, spans, mults, R, cand, P, start, theta, k, posmap, stats)
            if j == m:
                break
            if theta > 0:
                need = int(np.flatnonzero(theta > R)[0])  # R[m] = 0 < theta
            else:  # fewer than k documents seen so far: widen until k documents can be seen
                need = max(j + 1, int(np.searchsorted(cum_df, k)) + 1)
            if need <= j:
                break
            j = min(need, m)
    except BaseException:
        state.drop_posmap()  # an interrupted pass may leave stale slots; a fresh map is built next time
        raise
    stats.update(path="pruned", essential=j, passes=passes, survivors=len(cand))

    # exact scores of the survivors, summed in the query's order exactly as np.bincount does
    scores = np.zeros(len(cand))
    by_term = dict(zip(terms.tolist(), spans, strict=True))
    for t in query_ids:
        hit, w = _lookup(indices, data, *by_term[t], cand)
        scores[hit] += w
    top = np.lexsort((cand, -scores))[:k]
    return cand[top].tolist()
