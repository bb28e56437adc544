"""experiments/error_table.py: every goal below full reward lands in exactly one kind, and the points lost add up to
100 − score."""

from __future__ import annotations

import pytest

from experiments.error_table import KINDS, goal_rank, kind_of, table


def _trace(goal: int, reward: float, end: str = "bought", bought: str | None = "B000", goal_asin: str = "B000",
           r_option: float | None = None, query: str = "red shoes", options: dict | None = None) -> dict:
    return {"goal": goal, "reward": reward, "end": end, "purchased_asin": bought if end == "bought" else None,
            "goal_asin": goal_asin if end == "bought" else None, "purchased_options": options or {},
            "reward_info": {"r_option": r_option, "r_price": True},
            "actions": [[f"search[{query}]", "page"], ["click[b000]", "item"], ["click[buy now]", "done"]]}


def test_each_error_has_one_kind():
    assert kind_of(_trace(0, 1.0), 1, "B000") is None
    assert kind_of(_trace(0, 0.0, end="step cap"), 1, "B000") == KINDS[0]
    assert kind_of(_trace(0, 0.5, bought="B001"), 3, "B000") == KINDS[1]
    assert kind_of(_trace(0, 0.5, bought="B001"), 12, "B000") == KINDS[2]
    assert kind_of(_trace(0, 0.5, bought="B001"), None, "B000") == KINDS[3]
    assert kind_of(_trace(0, 0.5, bought="B001"), 1, "B000") == KINDS[4]
    assert kind_of(_trace(0, 0.8, r_option=0.5), 1, "B000") == KINDS[5]
    assert kind_of(_trace(0, 0.9, r_option=1.0), 1, "B000") == KINDS[6]


@pytest.fixture(scope="module")
def shop():
    from envs.webshop_bridge.shop import load_webshop

    return load_webshop("webshop_small", seed=0)


def test_points_lost_add_up_and_the_rank_is_the_shops_search(shop):
    goals = [shop.goals[i] for i in shop.split("eval")[:3]]
    query = goals[0].instruction_text.lower()
    rank = goal_rank(shop, _trace(500, 0.5, query=query, goal_asin=goals[0].asin))
    assert rank == next((r for r, i in enumerate(shop.search(query), 1)
                         if shop.product(i).asin.upper() == goals[0].asin.upper()), None)
    traces = [_trace(500, 1.0, goal_asin=goals[0].asin, bought=goals[0].asin),
              _trace(501, 0.0, end="step cap"),
              _trace(502, 0.6, goal_asin=goals[2].asin, bought=goals[2].asin, r_option=0.0)]
    result = table(traces, shop)
    assert sum(row["points_lost"] for row in result["rows"]) == pytest.approx(100 - result["score"])
    assert {row["kind"]: row["goals"] for row in result["rows"] if row["goals"]} == {KINDS[0]: 1, KINDS[5]: 1}
