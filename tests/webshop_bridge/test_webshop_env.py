"""The text environment: page formats, transitions, action parsing and malformed actions."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from webshop_fixtures import make_goal, make_product, tiny_shop

from envs.webshop_bridge import WebShopTextEnv, parse_action
from envs.webshop_bridge.pages import visible

INSTR = "i need black running shoes"


def _shop(n: int = 12):
    products = [make_product(f"B00000{i:04d}", title=f"Acme Running Shoes Model {i}", pricing=(20.0 + i,),
                             price_tag=f"${20.0 + i}") for i in range(n)]
    products[3] = make_product(
        "B000000003", title="Zed Trail Sneaker", pricing=(10.0, 15.0), price_tag="$10.0 to $15.0",
        options={"color": ["black", "white"], "size": ["8", "9"], "style": ["black"]},
        bullet_points=("Rubber sole", "Mesh"), description="Light sneaker.",
        reviews=({"title": "Great", "score": 5, "body": "Love them"},))
    goal = make_goal(products[3], index=3, instruction_text=INSTR, goal_options={"color": "black", "size": "9"})
    return tiny_shop(products, [goal], prices=[p.pricing[0] for p in products])


@pytest.fixture
def env():
    e = WebShopTextEnv(_shop(), show_attrs=True, seed=0)
    e.reset(0)
    return e


def test_visible_node_rules():
    assert visible("") is None  # an empty field renders no text node
    assert visible("  \n ") is None  # BeautifulSoup collapses it to '\n', which text mode drops
    assert visible("   ") == ""  # collapsed to ' ', stripped to an empty entry
    assert visible("  Price: $5 ") == "Price: $5"


def test_search_page(env):
    assert env.observation == f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"
    assert env.available_actions() == {"has_search_bar": True, "clickables": ["search"]}
    assert env.instruction == INSTR


def test_results_pages_and_paging(env):
    obs, reward, done, info = env.step("search[Running SHOES]")
    assert (reward, done, info["valid"], info["action_arg"]) == (0.0, False, True, "running shoes")
    assert obs.startswith(f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] Page 1 (Total results: 11) "
                          "[SEP] Next > [SEP] B000000000 [SEP] Acme Running Shoes Model 0 [SEP] $20.0 [SEP] ")
    avail = env.available_actions()
    assert avail["has_search_bar"] is False
    assert avail["clickables"][:2] == ["back to search", "next >"] and len(avail["clickables"]) == 12
    assert all(c == c.lower() for c in avail["clickables"])
    obs, *_ = env.step("click[next >]")
    assert "Page 2 (Total results: 11) [SEP] < Prev [SEP] Next > [SEP] B000000011" in obs
    assert env.available_actions()["clickables"] == ["back to search", "< prev", "next >", "b000000011"]
    obs, *_ = env.step("click[next >]")  # past the last page: an empty page, Next > still shown
    assert obs.endswith("Page 3 (Total results: 11) [SEP] < Prev [SEP] Next >")
    env.step("click[< prev]")
    env.step("click[< prev]")
    assert "Page 1 (Total results: 11)" in env.observation


def test_item_page_and_sub_pages(env):
    env.step("search[sneaker]")
    obs, *_ = env.step("click[b000000003]")
    assert obs == (f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] black [SEP] "
                   "white [SEP] size [SEP] 8 [SEP] 9 [SEP] style [SEP] black [SEP] Zed Trail Sneaker [SEP] "
                   "Price: $10.0 to $15.0 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews "
                   "[SEP] Attributes [SEP] Buy Now")
    assert env.available_actions()["clickables"] == [
        "back to search", "< prev", "description", "features", "reviews", "attributes", "buy now", "black",
        "white", "8", "9"]
    head = f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] < Prev"
    assert env.step("click[description]")[0] == f"{head} [SEP] Light sneaker."
    assert env.available_actions() == {"has_search_bar": False, "clickables": ["back to search", "< prev"]}
    env.step("click[< prev]")
    assert env.step("click[features]")[0] == f"{head} [SEP] Rubber sole [SEP] Mesh"
    env.step("click[< prev]")
    assert env.step("click[reviews]")[0] == f'{head} [SEP] "Great" [SEP] 5 [SEP] Love them'
    env.step("click[< prev]")
    obs = env.step("click[attributes]")[0]
    assert obs == f"{head} [SEP] rubber sole [SEP] lightweight [SEP] fashion [SEP] running shoes [SEP] " + \
        "Clothing, Shoes & Jewelry › Men › Shoes › Athletic"
    assert "Attributes" not in WebShopTextEnv(_shop()).reset(0)[0]


def test_option_clicks_and_session_transitions(env):
    env.step("search[sneaker]")
    env.step("click[b000000003]")
    env.step("click[9]")
    env.step("click[black]")  # the later radio with this value ('style') wins, as in WebShop
    assert env.session.options == {"size": "9", "style": "black"}
    env.step("click[description]")
    env.step("click[< prev]")  # sub page -> item page keeps the options
    assert env.page.kind == "item" and env.session.options == {"size": "9", "style": "black"}
    env.step("click[< prev]")  # item page -> results clears them
    assert env.page.kind == "results" and env.session.options == {}
    env.step("click[b000000003]")
    env.step("click[8]")
    obs, *_ = env.step("search[acme]")  # search works from any page
    assert env.page.kind == "results" and "Total results: 11" in obs and env.session.options == {}
    env.step("click[back to search]")
    assert env.page.kind == "search" and env.session.keywords is None


def test_buy_now_and_done_page(env):
    env.step("search[sneaker]")
    env.step("click[b000000003]")
    env.step("click[8]")
    obs, reward, done, info = env.step("click[buy now]")
    assert done and reward == pytest.approx(2 / 4)  # attribute + price, size 8 is not 9, no black chosen
    assert info["reward_info"]["num_option_matches"] == 0 and info["purchased_asin"] == "B000000003"
    assert info["purchased_options"] == {"size": "8"} and info["goal_asin"] == "B000000003"
    assert obs == ("Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk "
                   "interface.) [SEP] Purchased [SEP] asin [SEP] B000000003 [SEP] options [SEP] {\"size\": \"8\"} "
                   "[SEP] attrs [SEP] None [SEP] category [SEP] None [SEP] query [SEP] None [SEP] product category "
                   "[SEP] None [SEP] Target [SEP] asin [SEP] options [SEP] attrs [SEP] price upper [SEP] instuction "
                   "text [SEP] category [SEP] product category [SEP] query [SEP] Goal [SEP] None [SEP] Reward [SEP] "
                   "Your score (min 0.0, max 1.0) [SEP] 0.5 [SEP] Reward Details [SEP] None")
    assert env.available_actions() == {"has_search_bar": False, "clickables": []}
    again = env.step("click[buy now]")
    assert again[1:3] == (0.0, True) and again[3]["invalid_reason"] == "episode is over"


def test_exact_purchase_scores_one(env):
    env.step("search[sneaker]")
    env.step("click[b000000003]")
    env.step("click[9]")
    env.step("click[white]")
    env.step("click[black]")  # sets 'style' (the later radio); colour 'black' still matches a purchased value
    assert env.step("click[buy now]")[1] == 1.0


def test_purchase_above_the_ceiling_is_scored_at_the_drawn_price():
    """The sneaker's listed range is $10-$15 and the shop drew $14 for it; the goal's ceiling is $12. Buying it
    exactly as asked misses the price term: WebShop scores the drawn price, not the range's low end."""
    shop = _shop()
    shop.prices[3] = 14.0
    shop.goals[0] = make_goal(shop.product(3), index=3, instruction_text=INSTR,
                              goal_options={"color": "black", "size": "9"}, price_upper=12.0)
    env = WebShopTextEnv(shop, show_attrs=True, seed=0)
    env.reset(0)
    for action in ("search[sneaker]", "click[b000000003]", "click[9]", "click[black]"):
        env.step(action)
    obs, reward, done, info = env.step("click[buy now]")
    assert done and reward == pytest.approx(3 / 4)  # attribute and both options match; $14 > $12
    assert info["reward_info"]["r_price"] is False and info["reward_info"]["price"] == 14.0


MALFORMED = ["click[nonexistent]", "search[]", "foo", "", "click[]", "click[search]", "click[buy]",
             "search", "[x]", "click [back to search]", "x" * 100_000, "search[" + "[" * 50_000, "ü€𝔘[☃]",
             "click[😀]", "search\n[shoes]", "CLICK[next >]", "click[next >", "click next >"]


def test_malformed_actions_never_raise_or_end(env):
    for page_setup in ([], ["search[shoes]"], ["search[sneaker]", "click[b000000003]"]):
        env.reset(0)
        for a in page_setup:
            env.step(a)
        before = env.observation
        for action in MALFORMED + [None, 123, b"click[x]"]:
            obs, reward, done, info = env.step(action)
            assert (reward, done) == (0.0, False)
            assert info["valid"] is False and info["invalid_reason"]
            assert obs == before


def test_odd_but_valid_actions(env):
    obs, _, done, info = env.step("search[ ]")  # WebShop searches for ' ' and finds nothing
    assert info["valid"] and not done and "Total results: 0" in obs
    obs, _, _, info = env.step("search[" + "shoes " * 5000 + "]")
    assert info["valid"] and "Total results: 11" in obs
    obs, _, _, info = env.step("search[運動鞋 ☃]")
    assert info["valid"] and "Total results: 0" in obs
    _, _, _, info = env.step("search[acme] trailing text")  # text after the last ']' is ignored
    assert info["valid"] and info["action_arg"] == "acme"


def test_special_queries(env):
    assert "Total results: 12" in env.step("search[<c> fashion]")[0]
    assert "Total results: 12" in env.step("search[<q> running shoes]")[0]
    assert "Total results: 12" in env.step("search[<a> rubber sole]")[0]
    assert "Total results: 0" in env.step("search[<a> nothing]")[0]
    assert "Total results: 0" in env.step("search[<c>]")[0]
    assert "Total results: 12" in env.step("search[<r>]")[0]


def test_max_steps_truncates():
    env = WebShopTextEnv(_shop(), max_steps=2)
    env.reset(0)
    assert env.step("foo")[2] is False
    _, reward, done, info = env.step("search[acme]")
    assert done and reward == 0.0 and info["truncated"]


def test_reset_errors_and_random_goal():
    env = WebShopTextEnv(_shop(), seed=1)
    with pytest.raises(RuntimeError):
        env.step("foo")
    with pytest.raises(IndexError):
        env.reset(5)
    _, info = env.reset()
    assert info["goal_index"] == 0  # WebShop's draw never gives a pool's first goal, unless it is the only one
    # an instruction_text only sets env.instruction_text, as in WebShop: the page keeps the goal's own
    assert env.reset(0, instruction_text="custom")[0] == f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"
    assert env.instruction_text == env.instruction == "custom"


_WEBSHOP_PATTERN = re.compile(r"(.+)\[(.+)\]")


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab[] \n")), max_size=14))
def test_parse_action_equals_webshop_regex(action):
    m = re.match(_WEBSHOP_PATTERN, action)
    expected = (action, None) if m is None else m.groups()
    assert parse_action(action) == expected


def test_spaces_inside_brackets_are_part_of_the_argument(env):
    """WebShop keeps an action's argument as written: `click[ buy now ]` is no Buy Now and `search[ ]` searches for
    ' ' (the generate agent's parser passes such actions through unchanged, see test_generate_mode.py)."""
    env.step("search[sneaker]")
    env.step("click[b000000003]")
    obs, reward, done, info = env.step("click[ buy now ]")
    assert (done, info["valid"]) == (False, False) and "not clickable" in info["invalid_reason"]
    obs, reward, done, info = env.step("click[buy now]")
    assert done and info["valid"]
    env.reset(0)
    obs, reward, done, info = env.step("search[ ]")
    assert info["valid"] and info["action_arg"] == " " and "Back to Search" in obs
