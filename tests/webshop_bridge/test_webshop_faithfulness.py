"""Details where the bridge follows WebShop's own code (princeton-nlp/WebShop,
web_agent_site/envs/web_agent_text_env.py and web_agent_site/utils.py) to the letter:
``< Prev`` / ``Next >`` routed by a substring test on the URL, how ``reset()`` draws a goal, what
``instruction_text`` holds, and what ``reset(i, instruction_text=...)`` changes."""

from __future__ import annotations

import bisect
import importlib.machinery
import random
import string
import sys
import types
from collections import Counter

import numpy as np
from webshop_fixtures import make_goal, make_product, tiny_shop

from envs.webshop_bridge import WebShopTextEnv, load_webshop
from envs.webshop_bridge.env import BASE_URL, page_name, webshop_process_rng
from envs.webshop_bridge.official import OfficialWebShopEnv

INSTR = "i need black running shoes"


def _shop(n: int = 12, weights=None, extra_options=None):
    """``n`` 'Acme' products (11 results for 'acme'), product 3 a sneaker with options; one goal per
    weight (goal i on product i), or one goal on the sneaker."""
    products = [make_product(f"B00000{i:04d}", title=f"Acme Running Shoes Model {i}", pricing=(20.0 + i,),
                             price_tag=f"${20.0 + i}") for i in range(n)]
    options = {"color": ["black", "white"], "size": ["8", "9"], **(extra_options or {})}
    products[3] = make_product("B000000003", title="Zed Trail Sneaker", pricing=(10.0, 15.0),
                               price_tag="$10.0 to $15.0", options=options, description="Light sneaker.")
    if weights is None:
        goals = [make_goal(products[3], index=3, instruction_text=INSTR, goal_options={"color": "black", "size": "9"})]
    else:
        goals = [make_goal(products[i], index=i, instruction_text=f"goal {i}", weight=w) for i, w in enumerate(weights)]
    return tiny_shop(products, goals, prices=[p.pricing[0] for p in products])


def _env(**kw):
    env = WebShopTextEnv(_shop(**kw), seed=0)
    env.reset(0)
    return env


def _results_page(env) -> int:
    assert env.page.kind == "results"
    return env.session.result_page


# ------------------------------------------------------------------------ page routing by URL
def test_page_name_is_webshops_first_substring_in_order():
    assert page_name(None) is None
    assert page_name(f"{BASE_URL}/0") == ""
    assert page_name(f"{BASE_URL}/item_page/0/B1/shoes/1/{{}}") == "item_page"
    assert page_name(f"{BASE_URL}/item_page/0/B1/search_results/1/{{}}") == "search_results"
    assert page_name(f"{BASE_URL}/item_sub_page/0/B1/a+item_page/1/Description/{{}}") == "item_page"
    assert page_name(f"{BASE_URL}/item_sub_page/0/B1/done/1/Description/{{}}") == "item_sub_page"


def test_session_url_is_the_one_webshop_builds():
    env = _env()
    assert env.session.url == f"{BASE_URL}/0"
    env.step("search[zed  trail]")  # split on single spaces, joined by '+'
    assert env.session.url == f"{BASE_URL}/search_results/0/zed++trail/1"
    env.step("click[b000000003]")
    env.step("click[9]")
    assert env.session.url == f'{BASE_URL}/item_page/0/B000000003/zed++trail/1/{{"size": "9"}}'
    env.step("click[features]")
    assert env.session.url == f"{BASE_URL}/item_sub_page/0/B000000003/zed++trail/1/Features/{{'size': '9'}}"
    env.step("click[back to search]")
    assert env.session.url == f"{BASE_URL}/0"


def test_prev_with_ordinary_search_words():
    env = _env()
    env.step("search[acme]")
    env.step("click[next >]")
    env.step("click[b000000011]")
    env.step("click[< prev]")  # item -> the results page it came from
    assert _results_page(env) == 2
    env.step("click[b000000011]")
    env.step("click[description]")
    env.step("click[< prev]")  # sub page -> its item page
    assert env.page.kind == "item"


def test_prev_when_search_words_contain_search_results():
    # WebShop's item / sub page URL holds the search words, and 'search_results' is tested first, so
    # '< Prev' acts as on a results page: the page before the current one.
    env = _env()
    env.step("search[acme search_results]")
    env.step("click[b000000000]")
    obs, reward, done, info = env.step("click[< prev]")
    assert (reward, done, info["valid"], _results_page(env)) == (0.0, False, True, 0)
    assert obs == f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] Page 0 (Total results: 11) [SEP] Next >"
    assert env.available_actions()["clickables"] == ["back to search", "next >"]  # no products, no '< Prev'
    env.step("click[next >]")
    assert _results_page(env) == 1 and "b000000000" in env.available_actions()["clickables"]

    env.step("click[next >]")
    env.step("click[b000000011]")
    env.step("click[< prev]")  # from an item found on page 2: page 1
    assert _results_page(env) == 1
    env.step("click[next >]")
    env.step("click[b000000011]")
    env.step("click[reviews]")
    env.step("click[< prev]")  # a sub page too
    assert _results_page(env) == 1 and env.session.options == {}


def test_prev_on_a_sub_page_when_search_words_contain_item_page():
    # 'item_page' is tested before 'item_sub_page': '< Prev' on a sub page acts as on an item page
    env = _env()
    env.step("search[sneaker item_page]")
    env.step("click[b000000003]")
    env.step("click[9]")
    env.step("click[< prev]")  # on the item page itself nothing changes: back to its results page
    assert _results_page(env) == 1
    env.step("click[b000000003]")
    env.step("click[9]")
    env.step("click[description]")
    env.step("click[< prev]")
    assert _results_page(env) == 1 and env.session.options == {}


def test_later_page_names_in_search_words_change_nothing():
    env = _env()
    env.step("search[sneaker item_sub_page done]")
    env.step("click[b000000003]")
    env.step("click[description]")
    env.step("click[< prev]")
    assert env.page.kind == "item"
    env.step("click[< prev]")
    assert _results_page(env) == 1


def test_prev_when_a_chosen_option_contains_search_results():
    env = _env(extra_options={"style": ["search_results"]})  # the options are in the URL too
    env.step("search[sneaker]")
    env.step("click[b000000003]")
    env.step("click[< prev]")
    assert _results_page(env) == 1
    env.step("click[b000000003]")
    env.step("click[search_results]")
    env.step("click[< prev]")
    assert _results_page(env) == 0


def test_a_click_is_routed_by_its_text_before_what_it_is():
    # an option value that reads like a button does what the button does (WebShop's receive tests the
    # clicked text first); 'attributes' opens that sub page even when its button is hidden
    env = _env(extra_options={"style": ["description", "attributes"]})
    env.step("search[sneaker]")
    env.step("click[b000000003]")
    env.step("click[description]")
    assert env.page.kind == "item_sub" and env.page.sub_page == "Description" and env.session.options == {}
    env.step("click[< prev]")
    env.step("click[attributes]")
    assert env.page.sub_page == "Attributes" and env.session.options == {}


# ---------------------------------------------------------------------------- goal draws
def _webshop_draws(weights, seed: int, n: int) -> tuple[list[int], tuple]:
    """WebShop's reset() without a session, n times from random.seed(seed): a 10-letter session id
    (random.choices), then utils.random_idx over [0] + cumsum(weights)."""
    rng = random.Random(seed)
    cum = [0] + np.cumsum(weights).tolist()
    out = []
    for _ in range(n):
        rng.choices(string.ascii_lowercase, k=10)
        out.append(min(bisect.bisect(cum, rng.uniform(0, cum[-1])), len(cum) - 2))
    return out, rng.getstate()


def test_reset_draws_goals_as_webshop_does():
    weights = [1.0, 2.0, 3.0, 4.0]
    for seed in (0, 1, 2):
        env = WebShopTextEnv(_shop(weights=weights), seed=seed)
        drawn = [env.reset()[1]["goal_index"] for _ in range(300)]
        expected, state = _webshop_draws(weights, seed, 300)
        assert drawn == expected and env.rng.getstate() == state  # same draws, same RNG consumption
    env.reset(2)  # an explicit goal draws nothing
    assert env.rng.getstate() == state and env.session.session_id == "2"


def test_reset_draw_frequencies_follow_the_previous_goals_weight():
    env = WebShopTextEnv(_shop(weights=[1.0, 2.0, 3.0, 4.0]), seed=0)
    counts = Counter(env.reset()[1]["goal_index"] for _ in range(20_000))
    assert counts[0] == 0  # never the first goal
    freq = np.array([counts[i] for i in range(4)]) / 20_000
    np.testing.assert_allclose(freq, [0.0, 0.1, 0.2, 0.7], atol=0.015)  # w[k-1]; the last gets w[-2] + w[-1]


def test_reset_draw_from_a_split_never_gives_its_first_goal():
    shop = _shop(weights=[1.0, 1.0, 2.0, 5.0])  # test = goal 0, train = goals 1..3
    env = WebShopTextEnv(shop, seed=3, split="train")
    counts = Counter(env.reset()[1]["goal_index"] for _ in range(3000))
    assert set(counts) == {2, 3}
    assert env.goal is shop.goals[env.session.goal_index]
    assert WebShopTextEnv(shop, seed=0, split="test").reset()[1]["goal_index"] == 0  # a pool of one


def test_fresh_webshop_process_goal_sequence():
    # The first goals that reset() draws in a fresh WebShop process on the 1,000-product set, computed
    # with WebShop's own utils.random_idx on its global random (seed 233, the shuffle, the constructor's reset)
    shop = load_webshop("webshop_small")
    env = WebShopTextEnv(shop)
    env.rng = webshop_process_rng(len(shop.goals))
    assert [env.reset()[1]["goal_index"] for _ in range(8)] == [5457, 3613, 2985, 3529, 4196, 4938, 96, 458]


# -------------------------------------------------------------------------- instructions
def test_instruction_text_carries_webshops_prefix_and_instruction_does_not():
    env = WebShopTextEnv(_shop())
    _, info = env.reset(0)
    assert env.instruction_text == f"Instruction: {INSTR}"  # WebShop reads it off the search page's <h4>
    assert env.instruction == info["instruction"] == INSTR
    env.reset(0, instruction_text="Instruction: find a hat")
    assert (env.instruction_text, env.instruction) == ("Instruction: find a hat", "find a hat")


def test_reset_instruction_text_only_sets_the_instruction():
    env = WebShopTextEnv(_shop())
    plain = env.reset(0)[0]
    obs, info = env.reset(0, instruction_text="find a red hat")
    assert obs == plain and env.goal is env.shop.goals[0]
    assert env.instruction_text == env.instruction == info["instruction"] == "find a red hat"
    env.step("search[sneaker]")
    env.step("click[b000000003]")
    assert f"Instruction: [SEP] {INSTR} [SEP]" in env.observation
    env.step("click[black]")
    env.step("click[9]")
    assert env.step("click[buy now]")[1] == 1.0  # scored against the goal, whatever the instruction says
    env.reset(0)
    assert env.instruction_text == f"Instruction: {INSTR}"


def _fake_webshop(monkeypatch, goals):
    """A stand-in for web_agent_site's WebAgentTextEnv with WebShop's instruction_text behaviour."""

    class WebAgentTextEnv:
        def __init__(self, observation_mode, **kwargs):
            self.server = types.SimpleNamespace(goals=goals, user_sessions={})
            self.calls = []

        def reset(self, session=None, instruction_text=None):
            self.calls.append((session, instruction_text))
            idx = session if isinstance(session, int) else len(goals) - 1
            self.session = str(session) if session is not None else "abcdefghij"
            self.server.user_sessions[self.session] = {"goal": goals[idx]}
            text = goals[idx]["instruction_text"]
            self.instruction_text = f"Instruction: {text}" if instruction_text is None else instruction_text
            return f"WebShop [SEP] Instruction: [SEP] {text} [SEP] Search", None

    names = ["web_agent_site", "web_agent_site.envs", "web_agent_site.envs.web_agent_text_env"]
    for name in names:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules[names[-1]].WebAgentTextEnv = WebAgentTextEnv


def test_both_adapters_expose_the_same_instruction(monkeypatch):
    shop = _shop(weights=[1.0, 1.0])
    _fake_webshop(monkeypatch, [{"instruction_text": g.instruction_text} for g in shop.goals])
    official, bridge = OfficialWebShopEnv(), WebShopTextEnv(shop)
    for kwargs in ({}, {"instruction_text": "custom"}):
        a, b = official.reset(np.int64(1), **kwargs), bridge.reset(1, **kwargs)
        assert official.env.calls[-1] == (1, kwargs.get("instruction_text"))
        assert type(official.env.calls[-1][0]) is int  # WebShop only honours a Python int
        assert a[0] == b[0] and a[1] == {k: b[1][k] for k in ("goal_index", "instruction")}
        assert (official.instruction_text, official.instruction) == (bridge.instruction_text, bridge.instruction)
    assert official.reset()[1]["goal_index"] == 1  # a drawn goal's index is recovered
