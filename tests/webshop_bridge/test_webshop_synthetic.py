"""Synthetic catalogs: determinism, schema, goals, learnability properties and round trips."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from webshop_fixtures import REPO

from envs.webshop_bridge import (
    OraclePolicy,
    SyntheticCatalog,
    SyntheticGoals,
    evaluate,
    exact_purchase_reward,
    load_webshop,
    synthetic_shop,
)
from envs.webshop_bridge.goals import NO_CEILING
from envs.webshop_bridge.normalize import COLOR_SET, normalize_color
from envs.webshop_bridge.synthetic import PRODUCT_TYPES, asin_for, index_for


@pytest.fixture(scope="module")
def shop():
    return synthetic_shop(300, seed=0, cache_dir=False)


def test_deterministic_by_seed():
    a, b, c = SyntheticCatalog(500, 3), SyntheticCatalog(500, 3), SyntheticCatalog(500, 4)
    assert [a[i] for i in range(500)] == [b[i] for i in range(500)]
    assert [a[i] for i in range(20)] != [c[i] for i in range(20)]
    ga, gb = SyntheticGoals(a, 3), SyntheticGoals(b, 3)
    assert [g.instruction_text for g in ga] == [g.instruction_text for g in gb]


def test_goals_identical_in_another_process(shop):
    code = (f"import sys, json; sys.path.insert(0, {str(REPO)!r}); from envs.webshop_bridge import synthetic_shop;"
            "s = synthetic_shop(300, seed=0, cache_dir=False);"
            "print(json.dumps([(g.instruction_text, g.price_upper) for g in s.goals[:200]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [[g.instruction_text, g.price_upper] for g in shop.goals[:200]]


def test_schema_and_splits(shop):
    assert len(shop.catalog) == 300 and len(shop.goals) > 1000
    n = len(shop.goals)
    assert shop.splits["test"] == range(0, n // 10) and shop.splits["eval"] == range(n // 10, 2 * (n // 10))
    assert shop.splits["train"].stop == n
    p = shop.product(0)
    assert len(p.asin) == 10 and p.title.split(",")[0].lower().endswith(p.query)
    assert set(p.instruction_attributes) <= set(p.attributes) and p.rating == "N.A."
    assert {q.category for q in shop.catalog} == {"beauty", "electronics", "garden", "fashion", "grocery"}
    big = synthetic_shop(2000, seed=0, cache_dir=False)
    assert big.splits["test"] == range(0, 500) and big.splits["eval"] == range(500, 1500)


def test_asin_bijection():
    for i in (0, 1, 99, 123_456, 1_999_999):
        assert index_for(asin_for(i)) == i
    assert len({asin_for(i) for i in range(10_000)}) == 10_000
    assert SyntheticCatalog(100).index_of(asin_for(100)) is None and SyntheticCatalog(100).index_of("x") is None


def test_goal_generation_rules(shop):
    catalog = shop.catalog
    combos = [int(np.prod([len(v) for v in catalog[i].options.values()] or [1])) for i in range(len(catalog))]
    assert len(shop.goals) == sum(combos)
    seen = {(g.product_index, tuple(g.goal_options.items())) for g in shop.goals}
    assert len(seen) == len(shop.goals)  # every combination exactly once
    for g in shop.goals[:300]:
        p = catalog[g.product_index]
        assert list(g.goal_options) == sorted(p.options)
        assert all(g.goal_options[k] in p.options[k] for k in g.goal_options)
        price = shop.price(g.product_index)
        if g.price_upper != NO_CEILING:
            steps = [10.0 * k for k in range(1, 100) if 10.0 * k > price][:4]
            assert g.price_upper in steps[1:]
            assert g.instruction_text.endswith(f", and price lower than {g.price_upper:.2f} dollars")
        assert g.instruction_text.startswith(p.instruction_text)
        assert p.pricing[0] <= price <= p.pricing[-1]


def test_no_colour_traps_in_option_values():
    for t in PRODUCT_TYPES:
        for _, values in t.options:
            for v in values:
                assert normalize_color(v) == v or v in COLOR_SET, (t.name, v)


def test_exact_purchase_is_one_and_oracle_solves_everything(shop):
    assert all(exact_purchase_reward(shop, k) == 1.0 for k in range(len(shop.goals)))
    result, _ = evaluate(shop, OraclePolicy, shop.split("test"))
    assert result.success_rate == 1.0


def test_indices_where_matches_brute_force():
    catalog = SyntheticCatalog(400, 2)
    products = list(catalog)
    grocery = [i for i, p in enumerate(products) if p.category == "grocery"]
    assert catalog.indices_where("category", "grocery") == grocery
    assert catalog.indices_where("query", "hoodie") == [i for i, p in enumerate(products) if p.query == "hoodie"]
    assert catalog.indices_where("attribute", "non gmo") == \
        [i for i, p in enumerate(products) if "non gmo" in p.attributes]


def test_raw_files_round_trip(tmp_path):
    catalog = SyntheticCatalog(150, 9)
    catalog.write_raw(tmp_path, "s")
    shop = load_webshop(tmp_path, cache_dir=False)
    assert [shop.product(i) for i in range(150)] == [catalog[i] for i in range(150)]
    expected = sum(int(np.prod([len(v) for v in p.options.values()] or [1])) for p in catalog)
    assert len(shop.goals) == expected


def test_sizes_from_100_to_large():
    small = synthetic_shop(100, seed=1, cache_dir=False)
    assert len(small.catalog) == 100 and len(small.goals) > 0
    big = SyntheticCatalog(200_000, 1)
    assert len(big) == 200_000 and big[199_999].asin == asin_for(199_999)
    engine = big.build_search_engine()
    assert engine.num_docs == 200_000 and len(engine.search(big[5].instruction_text)) == 50


def test_options_value_order_and_combination_order(shop):
    for g in itertools.islice(shop.goals, 50):
        p = shop.product(g.product_index)
        for name, values in p.options.items():
            pool = next(v for n, v in next(t for t in PRODUCT_TYPES if t.name == p.query).options if n == name)
            assert values == [v for v in pool if v in values]  # pool order kept


def test_million_products():
    shop = synthetic_shop(1_000_000, seed=0, cache_dir=False)
    assert len(shop.catalog) == 1_000_000 and len(shop.goals) > 3_000_000
    goal = shop.goals[0]
    hits = shop.search(goal.instruction_text.lower())
    # thousands of products share a type and attributes at this size: the hits are of the right type
    assert len(hits) == 50 and all(shop.product(i).query == goal.query for i in hits[:10])
