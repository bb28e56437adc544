"""Data loading, WebShop's normalization, goals, splits, determinism and data errors."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys

import pytest
from webshop_fixtures import REPO, make_product, requires_small, small_dir, small_shop

from envs.webshop_bridge import DataError, load_webshop, make_splits, synthetic_shop
from envs.webshop_bridge.data import (
    DUMMY_ATTR,
    load_attribute_file,
    load_human_instructions,
    load_processed_jsonl,
    load_raw_products,
    product_from_raw,
)
from envs.webshop_bridge.goals import NO_CEILING, build_goals, price_ceiling, synthetic_goals
from envs.webshop_bridge.normalize import index_text, normalize_options, parse_pricing


def _raw(asin="B000000001", **kw):
    rec = {"asin": asin, "name": "Acme Mug", "full_description": "A mug.", "small_description": ["Ceramic", "Big"],
           "pricing": "$12.99", "customization_options": "", "product_category": "Home › Kitchen › Mugs",
           "category": "garden", "query": " Coffee Mugs ", "images": ["http://img/1.jpg"]}
    rec.update(kw)
    return rec


# ------------------------------------------------------------------------------ normalization

def test_pricing_parsed_like_webshop():
    assert parse_pricing("$12.99") == ([12.99], "$12.99")
    assert parse_pricing("$12.99 - $15.50") == ([12.99, 15.5], "$12.99 to $15.5")
    assert parse_pricing("$1,299.00") == ([1299.0], "$1299.0")
    assert parse_pricing("$3$4$5") == ([3.0, 4.0], "$3.0 to $4.0")  # only the first two prices are kept
    assert parse_pricing("") == ([100.0], "$100.0")
    assert parse_pricing(None) == ([100.0], "$100.0")
    assert parse_pricing([19.99, 27.99]) == ([19.99, 27.99], "$19.99 to $27.99")  # processed form


def test_options_normalized_like_webshop():
    raw = {"Color": [{"value": " Navy/Red ", "image": "x"}, {"value": "Black"}], "Size": None,
           "Item Shape": [{"value": "Rectangular"}]}
    assert normalize_options(raw) == {"color": ["navy | red", "black"], "item shape": ["rectangular"]}
    assert normalize_options("") == {}


def test_raw_record_normalization():
    p = product_from_raw(_raw(small_description="Just one bullet", pricing="$5 - $9",
                              customization_options={"Size": [{"value": "Large"}]}), None, file="f", record="0")
    assert p.title == p.name == "Acme Mug"
    assert p.bullet_points == ("Just one bullet",)
    assert p.pricing == (5.0, 9.0) and p.price_tag == "$5.0 to $9.0"
    assert p.options == {"size": ["large"]}
    assert p.attributes == (DUMMY_ATTR,)  # no attribute file entry
    assert p.query == "coffee mugs" and p.main_image == "http://img/1.jpg"
    attrs = {"B000000001": {"attributes": ["ceramic"], "instruction": "i want a mug", "instruction_attributes": ["x"]}}
    q = product_from_raw(_raw(), attrs, file="f", record="0")
    assert q.attributes == ("ceramic",) and q.instruction_text == "i want a mug"
    assert q.instruction_attributes == ("x",)


def test_raw_loader_skips_like_webshop(tmp_path):
    f = tmp_path / "items_shuffle_x.json"
    f.write_text(json.dumps([_raw("B1"), _raw("nan"), _raw("B01234567890"), _raw("B1", name="dup"), _raw("B2")]))
    products = load_raw_products(f)
    assert [p.asin for p in products] == ["B1", "B2"]
    assert products[0].name == "Acme Mug"  # the first of two equal ASINs wins
    assert [p.asin for p in load_raw_products(f, num_products=1)] == ["B1"]


def test_index_text_is_webshop_contents():
    assert index_text("T", "D", ["b1", "b2"], {"color": ["red", "blue"], "size": ["s"]}) == \
        "t d b1 color: red, blue, and size: s"
    assert index_text("T", "D", [], {}) == "t d  "


# ------------------------------------------------------------------------------- small data set

@requires_small
def test_small_set_loads_all_products_and_webshop_goal_count():
    shop = small_shop()
    assert len(shop.catalog) == 1000
    assert len(shop.goals) == 6910
    assert sum(p.instruction_text is not None for p in shop.catalog.products) == 415
    assert shop.human_goals is None  # no items_human_ins.json in the small set
    assert shop.splits == {"test": range(0, 500), "eval": range(500, 1500), "train": range(1500, 6910)}
    assert all(g.weight > 0 for g in shop.goals[:50])


@requires_small
def test_small_set_derived_text_equals_webshop_contents():
    products, contents = load_processed_jsonl(small_dir() / "products_1000.jsonl",
                                              load_attribute_file(small_dir() / "items_ins_v2_1000.json"))
    assert [p.index_text() for p in products] == contents
    by_asin = {p.asin: p for p in products}
    shoe = by_asin["B06Y3VLDFB"]
    assert shoe.price_tag == "$877.8" and shoe.attributes == ("console table", "solid wood")


@requires_small
def test_goal_text_format():
    goal = small_shop().goals[0]
    assert goal.instruction_text.startswith(small_shop().product(goal.product_index).instruction_text)
    opts = ", and ".join(f"{k}: {v}" for k, v in goal.goal_options.items())
    assert f" with {opts}" in goal.instruction_text
    assert goal.instruction_text.endswith(f", and price lower than {goal.price_upper:.2f} dollars")
    assert list(goal.goal_options) == sorted(goal.goal_options)


_DIGEST = (
    "import hashlib, json, sys; sys.path.insert(0, {repo!r});"
    "from envs.webshop_bridge import load_webshop;"
    "s = load_webshop({path!r}, cache_dir=False);"
    "print(hashlib.sha256(json.dumps([(g.instruction_text, g.price_upper) for g in s.goals]).encode()).hexdigest())"
)


@requires_small
def test_goals_identical_across_processes():
    local = hashlib.sha256(json.dumps([(g.instruction_text, g.price_upper) for g in small_shop().goals])
                           .encode()).hexdigest()
    code = _DIGEST.format(repo=str(REPO), path=str(small_dir()))
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed), "PATH": ""}).stdout.strip() for seed in (1, 2)]
    assert outs == [local, local]


# --------------------------------------------------------------------------------------- goals

def test_price_ceiling_rule():
    rng = random.Random(0)
    for _ in range(50):
        upper, text = price_ceiling(25.0, rng)
        assert upper in (40.0, 50.0, 60.0) and text == f", and price lower than {upper:.2f} dollars"
    assert price_ceiling(975.0, random.Random(1))[0] == 990.0  # only 980 and 990 are above
    assert price_ceiling(980.0, random.Random(1)) == (NO_CEILING, "")
    assert price_ceiling(30.0, random.Random(3))[0] in (50.0, 60.0, 70.0)  # strictly above the price


def test_goals_follow_webshop_rng_order():
    """Same draws as WebShop's code after random.seed(seed): a uniform per 2-price product, then a
    sample per instructed product, then the seed-233 shuffle."""
    products = [make_product(f"B{i:09d}", pricing=(10.0 + i, 20.0 + i) if i % 2 else (5.0 + i,),
                             instruction_text=f"want {i}", instruction_attributes=("a",)) for i in range(6)]
    prices, goals = build_goals(products, seed=7)
    random.seed(7)
    expect_prices = [random.uniform(*p.pricing) if len(p.pricing) == 2 else p.pricing[0] for p in products]
    ceilings = []
    for price in expect_prices:
        steps = [10.0 * i for i in range(1, 100) if 10.0 * i > price][:4]
        ceilings.append(sorted(random.sample(steps, 2))[1])
    assert list(prices) == expect_prices
    raw = synthetic_goals(products, expect_prices, random.Random(0))
    assert len(raw) == len(goals) == 6 * 4
    random.seed(233)
    order = list(range(len(raw)))
    random.shuffle(order)
    assert [g.instruction_text.split(" with ")[0] for g in goals] == \
        [raw[i].instruction_text.split(" with ")[0] for i in order]
    assert sorted({(g.product_index, g.price_upper) for g in goals}) == list(enumerate(ceilings))


def test_human_goals(tmp_path):
    p0 = make_product("B000000001")
    p1 = make_product("B000000002", pricing=(995.0,))
    human = {
        "B000000001": [
            {"instruction": "i want black shoes.", "instruction_attributes": ["rubber sole"],
             "instruction_options": ["black"]},
            {"instruction": "skip me", "instruction_attributes": [], "instruction_options": []},
        ],
        "B000000002": [{"instruction": "pricey.", "instruction_attributes": ["x"], "instruction_options": []}],
        "B999999999": [{"instruction": "not in catalog", "instruction_attributes": ["y"]}],
    }
    _, goals = build_goals([p0, p1], seed=0, kind="human", human=human)
    assert len(goals) == 2
    by_asin = {g.asin: g for g in goals}
    assert by_asin["B000000001"].instruction_text.startswith("i want black shoes, and price lower than")
    assert by_asin["B000000001"].goal_options == ("black",) and by_asin["B000000001"].kind == "human"
    assert by_asin["B000000002"].instruction_text == "pricey" and by_asin["B000000002"].price_upper == NO_CEILING

    f = tmp_path / "items_human_ins.json"
    f.write_text(json.dumps(human))
    assert len(load_human_instructions(f)["B000000001"]) == 2


def test_load_webshop_directory_with_human_goals(tmp_path):
    synthetic = synthetic_shop(120, seed=4, cache_dir=False)
    synthetic.catalog.write_raw(tmp_path)
    first = synthetic.product(0)
    (tmp_path / "items_human_ins.json").write_text(json.dumps({first.asin: [
        {"instruction": "i need it.", "instruction_attributes": ["a"], "instruction_options": []}]}))
    shop = load_webshop(tmp_path, cache_dir=False)
    assert len(shop.human_goals) == 1
    human = load_webshop(tmp_path, goals="human", cache_dir=False)
    assert len(human.goals) == 1 and human.goals[0].asin == first.asin
    assert human.splits["test"] == range(0, 1)


def test_make_splits():
    assert make_splits(2000) == {"test": range(0, 500), "eval": range(500, 1500), "train": range(1500, 2000)}
    assert make_splits(700) == {"test": range(0, 500), "eval": range(500, 700), "train": range(700, 700)}
    assert make_splits(10, {"test": 2, "dev": 3}) == {"test": range(0, 2), "dev": range(2, 5), "train": range(5, 10)}


# --------------------------------------------------------------------------------------- errors

def test_missing_files_are_named(tmp_path):
    with pytest.raises(DataError, match="nope.json.*file not found"):
        load_raw_products(tmp_path / "nope.json")
    with pytest.raises(DataError, match="missing_dir"):
        load_webshop(tmp_path / "missing_dir")
    with pytest.raises(DataError, match="no products file"):
        load_webshop(tmp_path)


def test_corrupt_files_name_file_and_field(tmp_path):
    bad_json = tmp_path / "items_shuffle_bad.json"
    bad_json.write_text("[{\"asin\": ")
    with pytest.raises(DataError, match="items_shuffle_bad.json.*not valid JSON"):
        load_raw_products(bad_json)

    cases = {
        "pricing": _raw(pricing="$abc"),
        "customization_options": _raw(customization_options=["red"]),
        "name": {k: v for k, v in _raw().items() if k != "name"},
        "small_description": _raw(small_description=[1, 2]),
        "images": _raw(images="http://img"),
    }
    for field, record in cases.items():
        f = tmp_path / f"items_shuffle_{field}.json"
        f.write_text(json.dumps([_raw("B0"), record]))
        with pytest.raises(DataError) as err:
            load_raw_products(f)
        assert err.value.field == field and err.value.file == str(f)
        assert f.name in str(err.value) and f"'{field}'" in str(err.value) and "record 1" in str(err.value)

    attrs = tmp_path / "items_ins_v2_bad.json"
    attrs.write_text(json.dumps({"B1": {"attributes": "not a list"}}))
    with pytest.raises(DataError, match=r"items_ins_v2_bad.json, record B1, field 'attributes'"):
        load_attribute_file(attrs)
    human = tmp_path / "items_human_ins.json"
    human.write_text(json.dumps({"B1": [{"instruction": "x"}]}))
    with pytest.raises(DataError, match=r"record B1\[0\], field 'instruction_attributes'"):
        load_human_instructions(human)


def test_corrupt_jsonl_names_line_and_field(tmp_path):
    good = json.dumps({"id": "B1", "contents": "x", "product": {
        "asin": "B1", "name": "n", "Title": "n", "Description": "", "BulletPoints": ["b"], "pricing": [1.0],
        "Price": "$1.0", "options": {}, "Attributes": [], "category": "c", "query": "q", "product_category": ""}})
    f = tmp_path / "products_x.jsonl"
    f.write_text(good + "\n{oops\n")
    with pytest.raises(DataError, match=r"products_x.jsonl, record line 2: not valid JSON"):
        load_processed_jsonl(f)
    bad = json.loads(good)
    bad["product"]["BulletPoints"] = "b"
    f.write_text(good + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=r"record line 2 \(B1\), field 'product.BulletPoints'"):
        load_processed_jsonl(f)
    f.write_text(json.dumps({"id": "B1"}) + "\n")
    with pytest.raises(DataError, match=r"field 'product'.*missing"):
        load_processed_jsonl(f)
    f.write_bytes(b"\xff\xfe\n")
    with pytest.raises(DataError, match="not UTF-8"):
        load_processed_jsonl(f)
