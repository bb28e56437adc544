"""WebShop's reward term by term, the fuzzy matcher, and the faithfulness numbers on the small set."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from thefuzz import fuzz as thefuzz
from webshop_fixtures import make_goal, make_product, requires_small, small_shop

from envs.webshop_bridge import (
    OraclePolicy,
    RandomPolicy,
    compute_reward,
    evaluate,
    exact_purchase_reward,
    fuzzy_match,
    normalize_color,
)
from envs.webshop_bridge.fuzzy import preprocess, token_set_ratio
from envs.webshop_bridge.reward import attribute_matches, option_matches, type_reward

# ------------------------------------------------------------------------------------ fuzzy


def test_preprocessing_is_thefuzz_019():
    assert preprocess("Machine-Washable, 100%!") == "machine washable  100"
    assert preprocess("DUMMY_ATTR") == "dummy_attr"  # \W keeps '_' (rapidfuzz's default would split it)
    assert preprocess("café crème") == "caf crme"  # U+0080..U+00FF are dropped, not transliterated
    assert preprocess("a›b★c") == "a b c"  # other non-word characters become spaces
    assert preprocess(("size", "large")) == "size    large"  # non-strings go through str()


def test_integer_rounding_at_the_85_threshold():
    # 85 < raw < 85.5 rounds to 85: no match, although the unrounded score is above 85.
    a, b = "a" * 213 + "b" * 37, "a" * 213 + "c" * 37
    assert token_set_ratio(a, b) == 85 and not fuzzy_match(a, b)
    a, b = "a" * 214 + "b" * 36, "a" * 214 + "c" * 36
    assert token_set_ratio(a, b) == 86 and fuzzy_match(a, b)
    assert token_set_ratio("machine washable", "machine wash") == 86  # raw 85.71
    assert not fuzzy_match("wireless charging", "wireless charger")  # raw 84.85 -> 85
    assert token_set_ratio("", "x") == 0 and token_set_ratio(None, "x") == 0 and token_set_ratio("!!", "x") == 0
    assert token_set_ratio("black", "black shoes") == 100  # token subset


_text = st.text(alphabet=st.sampled_from(list("abcdeXYZ019 .,-/!'()") + ["é", "ß", "›", "★"]), max_size=24)


@settings(max_examples=300, deadline=None)
@given(_text, _text)
def test_rapidfuzz_matcher_agrees_with_thefuzz(a, b):
    """thefuzz 0.22 (rapidfuzz inside) with its own processing agrees whenever no '_' is involved."""
    assert token_set_ratio(a, b) == thefuzz.token_set_ratio(a, b)


def test_underscore_is_the_known_thefuzz_022_difference():
    assert token_set_ratio("dummy_attr", "dummy") != thefuzz.token_set_ratio("dummy_attr", "dummy")


# -------------------------------------------------------------------------------- attributes

def test_attribute_fuzzy_and_substring_rules():
    p = make_product(attributes=("machine washable", "DUMMY_ATTR"), title="Soft Cotton Tee",
                     bullet_points=("Tagless collar", "Relaxed fit"), description="Made in USA.")
    assert attribute_matches(p, ["machine wash"]) == 1  # fuzzy 86 > 85
    assert attribute_matches(p, ["soft cotton"]) == 1  # substring of the lower-cased title
    assert attribute_matches(p, ["collar relaxed"]) == 1  # substring of the joined bullet points
    assert attribute_matches(p, ["made in usa"]) == 1  # substring of the description
    assert attribute_matches(p, ["Soft Cotton"]) == 0  # goal attributes are not lower-cased
    assert attribute_matches(p, ["waterproof", "dummy attr"]) == 0


# ----------------------------------------------------------------------------------- options

def test_colour_normalization():
    assert normalize_color("light blue") == "blue"  # first colour of WebShop's list wins
    assert normalize_color("rectangular") == "tan"  # substring search on strings
    assert normalize_color(("color", "black")) == "black"  # element equality on pairs
    assert normalize_color(("item shape", "rectangular")) == ("item shape", "rectangular")
    assert normalize_color("9") == "9"


def test_option_pair_semantics():
    # The printed pair is what gets fuzzy-matched: ('size', 'large') contains the token 'large'.
    assert option_matches(["large"], [("size", "large")]) == 1
    assert option_matches(["light blue"], [("color", "light blue")]) == 1  # 'blue' is a token of the pair
    assert option_matches(["black"], [("color", "black")]) == 1
    # 'rectangular' -> 'tan', which is not in "('item shape', 'rectangular')": WebShop misses it.
    assert option_matches(["rectangular"], [("item shape", "rectangular")]) == 0
    # Human goals pass plain strings, normalized the same way on both sides.
    assert option_matches(["rectangular"], ["rectangular"]) == 1
    assert option_matches(["black", "9"], [("color", "black"), ("size", "8")]) == 1
    assert option_matches([], [("color", "black")]) == 0


# ----------------------------------------------------------------------------- product type

_CAT = "Clothing › Men › Shoes › Athletic"


def _type(purchased_title, goal_title, *, query="shoes", goal_query="shoes", cat=_CAT, goal_cat=_CAT):
    p = make_product(title=purchased_title, query=query, product_category=cat)
    g = make_goal(p, name=goal_title, query=goal_query, product_category=goal_cat)
    return type_reward(p, g)


def test_r_type_branches():
    full = _type("Acme Running Shoes", "Acme Running Shoes")
    assert (full.r_type, full.query_match, full.title_score) == (1.0, True, 1.0)
    assert _type("Acme Trail Shoes", "Zed Running Shoes", query="a", cat="X › Y").r_type == 1.0  # title 1/3
    assert _type("Bowl", "Shoes", query="a", cat="Clothing › Men").r_type == 0.0  # title overlap 0 wins
    cat_only = _type("Acme Boots Shoes", "Acme Running Shoes Rack Socks", query="a", cat="Clothing › Men")
    assert cat_only.category_match and cat_only.r_type == 1.0  # 2 shared levels, overlap 0.4
    # no query, no category, overlap 1/5 = 0.2 (not > 0.2) -> 0.5
    half = _type("Acme Bowl", "Acme Running Shoes Rack Socks", query="a", cat="X › Y")
    assert (half.title_score, half.r_type) == (0.2, 0.5)
    # overlap 1/11 < 0.1 -> 0.1 even though the query matches
    low = _type("Acme", "Acme bb cc dd ee ff gg hh ii jj kk")
    assert low.query_match and low.r_type == 0.1
    # overlap 0 -> 0 even though the query and the category match
    zero = _type("Bowl", "Acme Running Shoes")
    assert zero.query_match and zero.category_match and zero.r_type == 0.0
    # goal title without nouns -> title score 0.2
    assert _type("Acme", "the 12", query="a", cat="X › Y").r_type == 0.5
    assert _type("Acme", "the 12").r_type == 1.0


# ---------------------------------------------------------------------------------- formula

def test_reward_formula_and_breakdown():
    p = make_product(attributes=("rubber sole", "lightweight"))
    goal = make_goal(p, attributes=("rubber sole", "waterproof"), goal_options={"color": "black", "size": "9"},
                     price_upper=30.0)
    info = compute_reward(p, goal, price=25.0, options={"color": "black", "size": "8"})
    assert (info.num_attr_matches, info.num_option_matches, info.r_price) == (1, 1, True)
    assert info.reward == pytest.approx((1 + 1 + 1) / (2 + 2 + 1))
    assert (info.w_att, info.w_option, info.w_price) == (0.4, 0.4, 0.2)
    assert info.to_dict()["r_option"] == 0.5
    over = compute_reward(p, goal, price=30.01, options={"color": "black", "size": "9"})
    assert not over.r_price and over.reward == pytest.approx(3 / 5)
    at = compute_reward(p, goal, price=30.0, options={"color": "black", "size": "9"})
    assert at.r_price and at.reward == pytest.approx(4 / 5)
    no_opts = compute_reward(p, make_goal(p, goal_options={}), price=1.0, options={})
    assert no_opts.r_option is None and no_opts.reward == 1.0


# ------------------------------------------------------------------------- faithfulness (small set)

@requires_small
def test_exact_purchases_score_one_on_480_of_first_500():
    shop = small_shop()
    assert sum(exact_purchase_reward(shop, k) == 1.0 for k in range(500)) == 480
    # the misses are option pairs whose value hides a colour word elsewhere, e.g. 'rectangular' -> 'tan'
    misses = [shop.goals[k] for k in range(500) if exact_purchase_reward(shop, k) != 1.0]
    assert any(g.goal_options.get("item shape") == "rectangular" for g in misses)


@requires_small
def test_exact_purchases_on_all_goals():
    shop = small_shop()
    assert sum(exact_purchase_reward(shop, k) == 1.0 for k in range(len(shop.goals))) == 6452


@requires_small
def test_oracle_and_random_on_first_500():
    shop = small_shop()
    oracle, episodes = evaluate(shop, OraclePolicy, range(500))
    exact = [k for k in range(500) if exact_purchase_reward(shop, k) == 1.0]
    assert sum(episodes[k].reward == 1.0 for k in exact) >= 0.95 * len(exact)
    assert oracle.success_rate >= 0.9 and oracle.score > 95
    rand, _ = evaluate(shop, lambda: RandomPolicy(0), range(500))
    assert rand.score < 30 and rand.success_rate < 0.05
