"""BM25 search: analyzer, stemmer, agreement with bm25s's own indexer, ranking rules and caching."""

from __future__ import annotations

import bm25s
import numpy as np
import pytest

import envs.webshop_bridge.synthetic as synthetic_module
from envs.webshop_bridge import SearchEngine, SyntheticCatalog, analyze
from envs.webshop_bridge.search import clear_engine_cache, get_engine
from envs.webshop_bridge.stemmer import porter_stem

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
