"""The real WebShop 1,000-product set shipped inside the package (``env.data: webshop_small``)."""

from __future__ import annotations

import pytest
from webshop_fixtures import small_dir

from envs.webshop_bridge import PACKAGED_DATA, DataError, exact_purchase_reward, load_webshop, resolve_data
from envs.webshop_bridge.data import load_processed_jsonl, read_json


@pytest.fixture(scope="module")
def shop():
    return load_webshop("webshop_small")


def test_packaged_set_has_webshops_goals_and_splits(shop):
    assert len(shop) == 1000
    assert len(shop.goals) == 6910  # 415 instructed products × their option combinations
    assert [len(shop.split(s)) for s in ("test", "eval", "train")] == [500, 1000, 5410]


def test_packaged_set_exact_purchases_score_as_in_webshop(shop):
    # buying the goal product with exactly the goal options scores 1.0 on 480 of the first 500 goals
    assert sum(exact_purchase_reward(shop, g) == 1.0 for g in shop.split("test")) == 480


def test_name_resolves_to_the_package_folder(tmp_path, monkeypatch):
    assert resolve_data("webshop_small") == PACKAGED_DATA["webshop_small"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "webshop_small").mkdir()  # a local folder of that name is reached as ./webshop_small
    assert resolve_data("./webshop_small").resolve() == (tmp_path / "webshop_small").resolve()


@pytest.mark.skipif(small_dir() is None, reason="../shared/webshop_small is not available")
def test_packaged_files_equal_the_uncompressed_originals():
    folder = PACKAGED_DATA["webshop_small"]
    original = small_dir()
    assert read_json(folder / "items_ins_v2_1000.json.gz") == read_json(original / "items_ins_v2_1000.json")
    packed = load_processed_jsonl(folder / "products_1000.jsonl.gz")
    plain = load_processed_jsonl(original / "products_1000.jsonl")
    assert packed == plain


def test_corrupt_gzip_names_the_file(tmp_path):
    bad = tmp_path / "products_x.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
    with pytest.raises(DataError, match="products_x.jsonl.gz"):
        load_processed_jsonl(bad)
    truncated = tmp_path / "items_ins_v2_x.json.gz"
    truncated.write_bytes((PACKAGED_DATA["webshop_small"] / "items_ins_v2_1000.json.gz").read_bytes()[:500])
    with pytest.raises(DataError, match="items_ins_v2_x.json.gz"):
        read_json(truncated)


def test_rule_baselines_on_real_goals(shop):
    from envs.webshop_bridge import FirstHitPolicy, OraclePolicy, evaluate

    goals = list(shop.split("test"))[:60]
    plain, plain_eps = evaluate(shop, lambda: FirstHitPolicy(options=False), goals)
    named, named_eps = evaluate(shop, lambda: FirstHitPolicy(options=True), goals)
    oracle, _ = evaluate(shop, OraclePolicy, goals)
    assert all(len(e.actions) == 3 for e in plain_eps)  # search, open the first hit, buy
    assert named.score > plain.score and oracle.score > named.score
    for episode in named_eps:  # every option it clicks is named in the instruction
        words = f" {' '.join(shop.goals[episode.goal_index].instruction_text.lower().replace(',', ' ').split())} "
        for action in episode.actions[2:-1]:
            assert f" {action[len('click['):-1]} " in words
