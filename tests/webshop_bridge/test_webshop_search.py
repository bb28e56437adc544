"""BM25 search: analyzer, stemmer, agreement with bm25s's own indexer, ranking rules, caching, and the
pruned top-k path returning exactly the exact path's results."""

from __future__ import annotations

import bm25s
import numpy as np
import pytest

import envs.webshop_bridge.synthetic as synthetic_module
from envs.webshop_bridge import SearchEngine, SyntheticCatalog, analyze
from envs.webshop_bridge.search import PRUNE_MIN_DOCS, clear_engine_cache, get_engine
from envs.webshop_bridge.stemmer import porter_stem
from envs.webshop_bridge.synthetic import SyntheticGoals

CORPUS = [
    "acme running shoes, black, size 9 rubber sole",
    "zed trail sneakers: waterproof and breathable",
    "the women's running shoe with arch support",
    "kitchen mug 12 oz ceramic, dishwasher safe",
    "running running running fast shoes",
    "wireless earbuds bluetooth 5.0 with charging case",
]


def test_analyzer_like_lucene_english():
    assert analyze("The Women's Running-Shoes, 3.5 oz!") == ["women", "run", "shoe", "3.5", "oz"]
    assert analyze("a an and the of with is") == []  # Lucene's English stop words
    assert analyze("black,white 1,000 u.s.a") == ["black", "white", "1,000", "u.s.a"]
    assert analyze("") == [] and analyze("☃★") == []


def test_porter_stemmer_reference_cases():
    cases = {"caresses": "caress", "ponies": "poni", "agreed": "agre", "plastered": "plaster", "motoring": "motor",
             "hopping": "hop", "filing": "file", "happy": "happi", "relational": "relat", "generalization": "gener",
             "oscillators": "oscil", "electrical": "electr", "adjustable": "adjust", "controll": "control",
             "sky": "sky", "as": "as", "shoes": "shoe", "running": "run", "washable": "washabl"}
    assert {w: porter_stem(w) for w in cases} == cases


def test_scores_equal_bm25s_own_indexer():
    engine = SearchEngine.from_texts(CORPUS)
    reference = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    reference.index([analyze(t) for t in CORPUS], show_progress=False)
    for query in ["running shoes", "waterproof sneakers", "mug", "shoes shoes black", "bluetooth 5.0 case"]:
        ours = engine.scores(query)
        theirs = reference.get_scores(analyze(query))
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_ranking_rules():
    engine = SearchEngine.from_texts(CORPUS)
    hits = engine.search("running shoes")
    assert hits[0] == 4 and set(hits) == {0, 2, 4}  # only documents with a query term are returned
    assert engine.search("nothing matches here") == []
    tied = SearchEngine.from_texts(["same text"] * 80)
    assert tied.search("same") == list(range(50))  # 50 hits, ties by document number
    assert tied.search("same", k=5) == [0, 1, 2, 3, 4]


def test_synthetic_index_equals_indexing_rendered_text(monkeypatch):
    monkeypatch.setattr(synthetic_module, "CHUNK", 333)  # exercise the chunk merge
    catalog = SyntheticCatalog(1500, seed=5)
    fast = catalog.build_search_engine()
    slow = SearchEngine.from_texts([catalog[i].index_text() for i in range(len(catalog))])
    assert set(fast.vocab) == set(slow.vocab)
    for term in list(slow.vocab)[:: max(1, len(slow.vocab) // 60)]:
        a, b = fast.vocab[term], slow.vocab[term]
        np.testing.assert_array_equal(fast._indices[fast._indptr[a]:fast._indptr[a + 1]],
                                      slow._indices[slow._indptr[b]:slow._indptr[b + 1]])
        np.testing.assert_allclose(fast._data[fast._indptr[a]:fast._indptr[a + 1]],
                                   slow._data[slow._indptr[b]:slow._indptr[b + 1]], rtol=1e-6)
    for i in (0, 7, 1499):
        q = catalog[i].instruction_text
        assert fast.search(q) == slow.search(q)


def test_engine_built_once_per_process_and_cached_on_disk(tmp_path):
    clear_engine_cache()
    calls = []

    def build():
        calls.append(1)
        return SearchEngine.from_texts(CORPUS)

    first = get_engine("test-key", build, len(CORPUS), cache_dir=tmp_path)
    assert get_engine("test-key", build, len(CORPUS), cache_dir=tmp_path) is first and len(calls) == 1
    assert (tmp_path / "bm25-test-key" / "params.index.json").exists()
    clear_engine_cache()
    loaded = get_engine("test-key", build, len(CORPUS), cache_dir=tmp_path)
    assert len(calls) == 1 and loaded is not first  # came from disk (memory-mapped)
    assert loaded.search("running shoes") == first.search("running shoes")
    clear_engine_cache()
    get_engine("other-key", build, 10, cache_dir=None)  # small corpora never touch the default cache
    assert len(calls) == 2
    clear_engine_cache()


def test_corrupt_disk_cache_is_rebuilt(tmp_path):
    clear_engine_cache()
    directory = tmp_path / "bm25-k"
    directory.mkdir()
    (directory / "params.index.json").write_text("{broken")
    engine = get_engine("k", lambda: SearchEngine.from_texts(CORPUS), len(CORPUS), cache_dir=tmp_path)
    assert engine.search("mug") == [3]
    clear_engine_cache()
    assert get_engine("k", lambda: pytest.fail("should load"), 6, cache_dir=tmp_path).search("mug") == [3]
    clear_engine_cache()


# --------------------------------------------------------------------------- pruned top-k == exact
def _assert_pruned_matches_exact(engine, queries, ks=(50,)):
    paths = {}
    for q in queries:
        for k in ks:
            stats = {}
            got = engine.search_pruned(q, k, stats=stats)
            assert got == engine.search_exact(q, k), (q, k, stats)
            paths[stats["path"]] = paths.get(stats["path"], 0) + 1
    return paths


def test_pruned_search_identical_to_exact_on_synthetic_goals():
    """The pruned path returns exact BM25's top-k (same documents, same order, same tie
    breaks) on a synthetic catalog's goal instructions, and it really prunes."""
    catalog = SyntheticCatalog(30_000, seed=3)
    engine = catalog.build_search_engine()
    assert engine.pruning == (len(catalog) >= PRUNE_MIN_DOCS)  # big catalogs only: small ones are fast anyway
    engine.pruning = True  # `search` takes the pruned path
    goals = SyntheticGoals(catalog, 3)
    rng = np.random.default_rng(0)
    queries = [goals[int(g)].instruction_text.lower() for g in rng.choice(len(goals), 600, replace=False)]
    paths = {}
    for q in queries:
        stats = {}
        got = engine.search(q)
        assert got == engine.search_exact(q) == engine.search_pruned(q, stats=stats), q
        paths[stats["path"]] = paths.get(stats["path"], 0) + 1
        if stats["path"] == "pruned":
            assert stats["survivors"] < stats["candidates"]
    assert paths.get("pruned", 0) >= 0.9 * len(queries)
    # other cut-offs, and queries of a few words from the catalog's own titles (common terms, repeats)
    titles = [catalog[int(i)].name.lower() for i in rng.choice(len(catalog), 60, replace=False)]
    short = [" ".join(rng.choice(t.split(), size=min(3, len(t.split())))) for t in titles]
    _assert_pruned_matches_exact(engine, queries[:60] + titles + short, ks=(1, 7, 50, 200))


def test_pruned_search_ties_and_edge_cases():
    tied = SearchEngine.from_texts(["same text"] * 80 + ["same same text"] * 3 + ["other words"] * 5)
    _assert_pruned_matches_exact(tied, ["same", "same text", "text same same", "other", "nothing", ""],
                                 ks=(0, 1, 3, 4, 50, 87, 88, 100))
    engine = SearchEngine.from_texts(CORPUS)
    _assert_pruned_matches_exact(engine, ["running shoes", "mug mug", "bluetooth case shoes"], ks=(1, 2, 6))


def test_pruned_search_random_corpora():
    """Zipf-distributed random corpora, queries with repeated and absent words, many cut-offs."""
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(300)]
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    for _ in range(12):
        n = int(rng.integers(50, 3000))
        texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 25)), p=p)) for _ in range(n)]
        engine = SearchEngine.from_texts(texts)
        queries = [" ".join(rng.choice(words, size=int(rng.integers(1, 12)), p=p ** 0.3 / (p ** 0.3).sum()))
                   for _ in range(25)] + ["w0 w0 w1", "w299 nothing", "w5 w5 w5 w5"]
        _assert_pruned_matches_exact(engine, queries, ks=(1, 10, 50))


def test_pruned_search_threads_and_interrupted_passes(monkeypatch):
    import concurrent.futures

    import envs.webshop_bridge.pruned as pruned

    catalog = SyntheticCatalog(20_000, seed=4)
    engine = catalog.build_search_engine()
    goals = SyntheticGoals(catalog, 4)
    queries = [goals[g].instruction_text.lower() for g in range(0, 4000, 40)]
    expected = [engine.search_exact(q) for q in queries]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # one candidate map per thread
        assert list(pool.map(engine.search_pruned, queries)) == expected
    slots = engine._pruning_state.posmap
    assert not slots().any()  # every pass clears the slots it set

    calls = {"n": 0}
    real = pruned._walk_is_cheaper

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # a pass interrupted half-way leaves candidate slots in the map
        return real(*args)

    monkeypatch.setattr(pruned, "_walk_is_cheaper", flaky)
    with pytest.raises(KeyboardInterrupt):
        for q in queries:
            engine.search_pruned(q)
    monkeypatch.setattr(pruned, "_walk_is_cheaper", real)
    assert not slots().any()  # the half-filled map was dropped
    assert [engine.search_pruned(q) for q in queries] == expected  # the map was rebuilt, not reused


def _with_copies(engine: SearchEngine, copies: int) -> SearchEngine:
    """The same index with every document repeated ``copies`` times (ids d*copies .. d*copies+copies-1):
    every score is tied ``copies`` ways, so each top-k cut falls inside a tie."""
    old, new = engine.retriever, bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    indices = (engine._indices.astype(np.int64)[:, None] * copies + np.arange(copies)).ravel().astype(np.int32)
    new.scores = {"data": np.repeat(engine._data, copies), "indices": indices, "indptr": engine._indptr * copies,
                  "num_docs": engine.num_docs * copies}
    new.vocab_dict, new.unique_token_ids_set, new.nonoccurrence_array = old.vocab_dict, old.unique_token_ids_set, None
    return SearchEngine(new)


@pytest.mark.parametrize("dense_fraction", [0, 16, 10**9])  # no bitmaps, the default, every term a bitmap
def test_pruned_search_identical_on_tied_catalog_with_and_without_bitmaps(monkeypatch, dense_fraction):
    """Issue 20: the fast path's top-k is exact BM25's (documents, order, ties to the lower number) on
    hundreds of goal queries, whichever look-up (bitmap or binary search) each term takes."""
    import envs.webshop_bridge.pruned as pruned

    monkeypatch.setattr(pruned, "DENSE_FRACTION", dense_fraction)
    catalog = SyntheticCatalog(6_000, seed=5)
    engine = _with_copies(catalog.build_search_engine(), 4)
    goals = SyntheticGoals(catalog, 5)
    queries = [goals[g].instruction_text.lower() for g in range(0, len(goals), len(goals) // 300)]
    assert len(queries) >= 300
    paths = _assert_pruned_matches_exact(engine, queries, ks=(1, 50, 51))
    assert paths.get("pruned", 0) >= 0.9 * sum(paths.values())
    assert (len(engine._pruning_state.dense) > 0) == (dense_fraction > 0)
    assert engine.search(queries[0], 4) == engine.search_exact(queries[0], 4)  # one document's 4 copies
    assert len(set(np.asarray(engine.search_exact(queries[0], 4)) // 4)) == 1


def test_dense_term_finds_what_binary_search_finds():
    from envs.webshop_bridge.pruned import DenseTerm, _popcount, _popcount_swar

    rng = np.random.default_rng(2)
    words = rng.integers(0, 2**64, size=1000, dtype=np.uint64)
    words[:3] = [0, 2**64 - 1, 2**63]
    assert (_popcount_swar(words) == np.array([bin(int(w)).count("1") for w in words])).all()
    assert (np.asarray(_popcount(words), dtype=np.int64) == _popcount_swar(words)).all()
    for num_docs in (1, 63, 64, 65, 1000, 4097):
        for density in (0.01, 0.5, 1.0):
            post = np.flatnonzero(rng.random(num_docs) < density).astype(np.int32)
            post = np.union1d(post, [0, num_docs - 1]).astype(np.int32)  # first and last document
            docs = np.sort(rng.choice(num_docs, size=min(num_docs, 300), replace=False)).astype(np.int32)
            hit, pos = DenseTerm(post, num_docs).find(docs)
            expected = np.flatnonzero(np.isin(docs, post))
            assert (hit == expected).all()
            assert (pos == np.searchsorted(post, docs[expected])).all()
