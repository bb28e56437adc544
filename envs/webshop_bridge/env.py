"""WebShop's text environment (``WebAgentTextEnv`` in ``observation_mode='text'``), page for page.

The session logic follows WebShop's ``SimServer.receive``: ``search[q]`` works from any page and
shows results page 1; ``click[x]`` must name one of the current page's clickables (lower-cased
argument; clicking "search" is refused). A click is routed by its text first, in WebShop's order: Buy
Now ends the episode with WebShop's reward; Back to Search resets the session (options too);
``Next >`` and ``< Prev`` act by the page name that ``SimServer.get_page_name`` reads off the current
URL (results: page +1 / -1; item: back to the results, which clears chosen options; sub page: back to
the item); Description / Features / Reviews / Attributes open a sub page; anything else is a product
(open it) or an option (record ``{option name: value}``). Anything else is a no-op with reward 0 and
``done=False``; it is flagged in ``info['valid'] = False`` with ``info['invalid_reason']``.

WebShop's page name is a substring test on its URL, which holds the search words (joined by ``+``) and
the chosen options, so the session keeps the URL WebShop would show (``Session.url``) and routes by the
same test: after a search whose words contain ``search_results``, ``< Prev`` on an item or sub page
goes to the results page *before* the current one (page 0, empty, from page 1); with ``item_page`` in
the words, ``< Prev`` on a sub page goes to the results instead of the item page.

Goals: ``reset(i)`` plays goal ``i``; ``reset()`` draws one as WebShop's ``WebAgentTextEnv.reset`` +
``SimServer.receive`` do (see :meth:`WebShopTextEnv.reset`). ``instruction_text`` is what WebShop's
env exposes under that name (``'Instruction: ' + goal text``, read off the search page, or the text
given to ``reset``); ``instruction`` is the same without that prefix.

Differences, all deliberate: actions after Buy Now are no-ops (WebShop would let the session go on
and even re-score a second purchase); the special queries ``<r>``, ``<a> attr``, ``<c> category`` and
``<q> query`` never raise (WebShop's ``<a>`` crashes in text mode); ``<r>`` is drawn once per query
from the environment's own seeded RNG (WebShop draws again on every render of its results); an
optional ``max_steps`` truncates episodes.
"""

from __future__ import annotations

import bisect
import json
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from . import pages
from .goals import Goal
from .pages import Page
from .reward import RewardInfo, compute_reward
from .search import SEARCH_RETURN_N
from .shop import Shop

SPECIAL_QUERIES = {"<a>": "attribute", "<c>": "category", "<q>": "query"}

#: What WebShop's ``get_instruction_text`` reads before the goal text (the search page's
#: ``<h4>Instruction: <br>{{ instruction_text }}</h4>``).
INSTRUCTION_PREFIX = "Instruction: "
#: WebShop's ``WebAgentTextEnv.base_url`` and ``SimServer.get_page_name`` names, in its test order.
BASE_URL = "http://127.0.0.1:3000"
PAGE_NAMES = ("search_results", "item_page", "item_sub_page", "done")
#: Click texts that open a sub page (WebShop's ``ACTION_TO_TEMPLATE``), lower-cased -> page name.
SUB_PAGE_KEYS = {name.lower(): name for name in pages.SUB_PAGES}
#: WebShop seeds its global ``random`` with this right before shuffling the goals.
WEBSHOP_GOAL_SEED = 233


def page_name(url: str | None) -> str | None:
    """WebShop's ``SimServer.get_page_name``: the first of :data:`PAGE_NAMES` contained in ``url``."""
    if url is None:
        return None
    for name in PAGE_NAMES:
        if name in url:
            return name
    return ""


def bare_instruction(instruction_text: str) -> str:
    """``instruction_text`` without WebShop's leading ``'Instruction: '``."""
    return instruction_text.removeprefix(INSTRUCTION_PREFIX)


def draw_goal_position(cum_weights: Sequence[float], rng: random.Random) -> int:
    """WebShop's ``utils.random_idx``: ``bisect(cum_weights, uniform(0, total))``, capped at the last goal.

    ``cum_weights`` is ``[0, w0, w0 + w1, ...]``. The bisection returns one past the goal whose weight
    interval holds the draw, so position ``k`` (1 <= k < n - 1) comes with probability ``w[k-1] / total``,
    the last with ``(w[n-2] + w[n-1]) / total``, and position 0 never (unless it is the only one).
    """
    pos = rng.uniform(0, cum_weights[-1])
    return min(bisect.bisect(cum_weights, pos), len(cum_weights) - 2)


def draw_session_id(rng: random.Random) -> str:
    """WebShop's random session id for ``reset()`` without a session: 10 lower-case letters."""
    return "".join(rng.choices(string.ascii_lowercase, k=10))


def webshop_process_rng(num_goals: int) -> random.Random:
    """A ``random.Random`` in the state WebShop's global ``random`` has right after a fresh process builds
    ``WebAgentTextEnv`` over ``num_goals`` goals (no ``limit_goals``): ``random.seed(233)``, the goal
    shuffle, then the constructor's own ``reset()`` (a session id and a goal draw).

    ``env.rng = webshop_process_rng(len(shop.goals))`` makes ``env.reset()`` draw the goals that WebShop's
    ``env.reset()`` calls draw, in order, provided nothing else draws from either RNG in between (WebShop's
    ``<r>`` search draws from the same global RNG, and does so on every results render).
    """
    rng = random.Random(WEBSHOP_GOAL_SEED)
    rng.shuffle([None] * num_goals)  # consumption depends only on the length
    draw_session_id(rng)
    rng.random()  # the constructor's goal draw (uniform = one random())
    return rng


_CUM_WEIGHTS: dict[tuple, tuple[object, list[float]]] = {}


def _cum_weights(goals: Sequence[Goal], pool: range) -> list[float]:
    """``[0] + np.cumsum(weights).tolist()`` over ``goals[pool]`` (WebShop's ``SimServer.cum_weights``),
    cached per goal sequence and pool (a few entries)."""
    key = (id(goals), pool.start, pool.stop, pool.step)
    hit = _CUM_WEIGHTS.get(key)
    if hit is not None and hit[0] is goals:
        return hit[1]
    weights = np.fromiter((goals[i].weight for i in pool), dtype=np.float64, count=len(pool))
    cum = [0] + np.cumsum(weights).tolist()
    if len(_CUM_WEIGHTS) >= 8:
        _CUM_WEIGHTS.pop(next(iter(_CUM_WEIGHTS)))
    _CUM_WEIGHTS[key] = (goals, cum)
    return cum


def parse_action(action: str) -> tuple[str, str | None]:
    """WebShop's ``re.match(r'(.+)\\[(.+)\\]', action)`` -> (name, argument or None), in linear time.

    The regex's greedy groups pick the last ``[`` that still leaves a non-empty argument before the last
    ``]``, both within the first line (``.`` does not match a newline); text after that ``]`` is ignored.
    Without a match the whole action is the name and the argument is None.
    """
    line = action.split("\n", 1)[0]
    close = line.rfind("]")
    if close >= 3:
        open_ = line.rfind("[", 1, close - 1)
        if open_ != -1:
            return line[:open_], line[open_ + 1:close]
    return action, None


@dataclass
class Session:
    goal_index: int
    goal: Goal
    page: Page
    session_id: str = ""
    instruction_text: str = ""  # what WebShop's env.instruction_text holds
    url: str = ""  # the URL WebShop's browser would be at (its page routing reads it)
    keywords: str | None = None
    results: list[int] = field(default_factory=list)
    result_page: int = 1
    product: int | None = None
    visited: set[int] = field(default_factory=set)
    options: dict[str, str] = field(default_factory=dict)
    done: bool = False
    reward: float = 0.0
    steps: int = 0


class WebShopTextEnv:
    """One agent session at a time over a shared :class:`Shop`.

    ``reset(goal_index)`` -> (observation, info); ``step(action)`` -> (observation, reward, done, info);
    ``available_actions()`` -> ``{'has_search_bar': bool, 'clickables': [str, ...]}``.
    """

    def __init__(self, shop: Shop, *, show_attrs: bool = False, max_steps: int | None = None,
                 seed: int | None = None, split: str | None = None):
        self.shop = shop
        self.show_attrs = show_attrs
        self.max_steps = max_steps
        self.split = split
        self.rng = random.Random(seed)
        self.session: Session | None = None

    # ------------------------------------------------------------------------------------ API
    @property
    def instruction_text(self) -> str:
        """WebShop's ``WebAgentTextEnv.instruction_text``: ``'Instruction: ' + goal text`` (the search page's
        instruction heading), or exactly the ``instruction_text`` given to :meth:`reset`."""
        return self._session().instruction_text

    @property
    def instruction(self) -> str:
        """:attr:`instruction_text` without its ``'Instruction: '`` prefix: the goal's instruction text
        (the same on :class:`~envs.webshop_bridge.official.OfficialWebShopEnv`)."""
        return bare_instruction(self._session().instruction_text)

    @property
    def goal(self) -> Goal:
        return self._session().goal

    @property
    def observation(self) -> str:
        return self._session().page.observation

    @property
    def page(self) -> Page:
        return self._session().page

    def available_actions(self) -> dict:
        return self._session().page.available_actions()

    def reset(self, goal_index: int | None = None, *, instruction_text: str | None = None) -> tuple[str, dict]:
        """Start a session on goal ``goal_index``, or on a drawn goal, as WebShop's ``reset(session=...)``.

        Without a goal index the goal is drawn from ``split`` (all goals if None) as WebShop's
        ``reset()`` draws it from its goal list (``filter_goals`` playing the split's part): a random
        10-letter session id (``random.choices``), then ``utils.random_idx`` over the cumulative goal
        weights (:func:`draw_goal_position`: the pool's first goal is never drawn, each other one with
        the weight of the goal before it). Both come from ``self.rng`` (``random.Random(seed)``),
        consuming it as WebShop consumes its global ``random``; see :func:`webshop_process_rng`.

        ``instruction_text`` only sets :attr:`instruction_text` (and so :attr:`instruction`), as in
        WebShop: the pages still show the goal's own instruction, and the goal and reward are unchanged.
        """
        goals = self.shop.goals
        if goal_index is None:
            pool = self.shop.split(self.split) if self.split else range(len(goals))
            if len(pool) == 0:
                raise ValueError("no goals to draw from")
            session_id = draw_session_id(self.rng)
            goal_index = pool[draw_goal_position(_cum_weights(goals, pool), self.rng)]
        else:
            session_id = str(goal_index)
        if not 0 <= goal_index < len(goals):
            raise IndexError(f"goal_index {goal_index} out of range [0, {len(goals)})")
        goal = goals[goal_index]
        text = INSTRUCTION_PREFIX + goal.instruction_text if instruction_text is None else instruction_text
        self.session = Session(goal_index, goal, pages.search_page(goal.instruction_text), session_id=session_id,
                               instruction_text=text, url=f"{BASE_URL}/{session_id}")
        return self.session.page.observation, {"goal_index": goal_index, "page": "search",
                                               "instruction": self.instruction}

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        s = self._session()
        if s.done:
            return s.page.observation, 0.0, True, self._invalid(s, action, None, None, "episode is over")
        s.steps += 1
        if not isinstance(action, str):
            info = self._invalid(s, repr(action), None, None, f"action must be a string, got {type(action).__name__}")
            return self._maybe_truncate(s, info)
        name, arg = parse_action(action)
        if arg is not None:
            arg = arg.lower()
        reward, info = 0.0, {"valid": True, "action_name": name, "action_arg": arg}
        if name == "search" and arg:
            self._search(s, arg)
        elif name == "click" and arg is not None and arg in s.page.clickables and arg != "search":
            reward = self._click(s, arg, info)
        else:
            info = self._invalid(s, action, name, arg, self._why_invalid(s, name, arg))
        info.update(page=s.page.kind, steps=s.steps)
        if s.done:
            return s.page.observation, reward, True, info
        return self._maybe_truncate(s, info)

    # ----------------------------------------------------------------------------- internals
    def _session(self) -> Session:
        if self.session is None:
            raise RuntimeError("call reset() before using the environment")
        return self.session

    def _maybe_truncate(self, s: Session, info: dict) -> tuple[str, float, bool, dict]:
        if self.max_steps is not None and s.steps >= self.max_steps:
            s.done = True
            info["truncated"] = True
            return s.page.observation, 0.0, True, info
        return s.page.observation, 0.0, False, info

    @staticmethod
    def _why_invalid(s: Session, name: str, arg: str | None) -> str:
        if name == "search":
            return "empty search"
        if name == "click":
            if arg == "search":
                return "the search button cannot be clicked; use search[...]"
            return f"{arg!r} is not clickable on the {s.page.kind} page"
        return "not of the form search[...] or click[...]"

    def _invalid(self, s: Session, action, name, arg, reason: str) -> dict:
        return {"valid": False, "invalid_reason": reason, "action_name": name, "action_arg": arg,
                "page": s.page.kind, "steps": s.steps}

    def _run_query(self, keywords: str) -> list[int]:
        words = keywords.split(" ")
        head = words[0]
        if head == "<r>":
            n = len(self.shop.catalog)
            return self.rng.sample(range(n), k=min(SEARCH_RETURN_N, n))
        if head in SPECIAL_QUERIES:
            value = (words[1] if len(words) > 1 else "").strip() if head == "<c>" else " ".join(words[1:]).strip()
            return list(self.shop.catalog.indices_where(SPECIAL_QUERIES[head], value))
        return self.shop.search(keywords)

    def _search(self, s: Session, keywords: str) -> None:
        s.keywords = keywords
        s.results = self._run_query(keywords)
        self._show_results(s, 1)

    @staticmethod
    def _url_words(s: Session) -> str:
        return "+".join(s.keywords.split(" "))  # WebShop's keywords_url_string

    def _asin(self, s: Session) -> str:
        return self.shop.product(s.product).asin.upper()

    def _show_results(self, s: Session, page: int) -> None:
        """Results page ``page`` (WebShop's slice ``[(page - 1) * 10:page * 10]``, so page <= 0 is empty
        or, below 0, counts from the end)."""
        s.result_page = page
        s.product = None
        s.options = {}
        start = (page - 1) * pages.PRODUCTS_PER_PAGE
        hits = [(i, self.shop.product(i)) for i in s.results[start:page * pages.PRODUCTS_PER_PAGE]]
        s.page = pages.results_page(s.goal.instruction_text, page, len(s.results), hits)
        s.url = f"{BASE_URL}/search_results/{s.session_id}/{self._url_words(s)}/{page}"

    def _show_item(self, s: Session) -> None:
        s.page = pages.item_page(s.goal.instruction_text, self.shop.product(s.product), self.show_attrs)
        s.url = (f"{BASE_URL}/item_page/{s.session_id}/{self._asin(s)}/{self._url_words(s)}/{s.result_page}/"
                 f"{json.dumps(s.options)}")

    def _show_sub_page(self, s: Session, name: str) -> None:
        s.page = pages.item_sub_page(s.goal.instruction_text, self.shop.product(s.product), name)
        s.url = (f"{BASE_URL}/item_sub_page/{s.session_id}/{self._asin(s)}/{self._url_words(s)}/"
                 f"{s.result_page}/{name}/{s.options}")

    def _click(self, s: Session, key: str, info: dict) -> float:
        """WebShop's ``SimServer.receive`` for a click: by the clicked text first, then by what it is."""
        where = page_name(s.url)
        if key == pages.BUY_NOW.lower():
            return self._buy(s, info)
        if key == pages.BACK_TO_SEARCH.lower():
            s.keywords, s.results, s.product, s.options, s.visited = None, [], None, {}, set()
            s.page = pages.search_page(s.goal.instruction_text)
            s.url = f"{BASE_URL}/{s.session_id}"
        elif key == pages.NEXT_PAGE.lower() and where == "search_results":
            self._show_results(s, s.result_page + 1)
        elif key == pages.PREV_PAGE.lower() and where == "search_results":
            self._show_results(s, s.result_page - 1)
        elif key == pages.PREV_PAGE.lower() and where == "item_sub_page":
            self._show_item(s)
        elif key == pages.PREV_PAGE.lower() and where == "item_page":
            self._show_results(s, s.result_page)
        elif key in SUB_PAGE_KEYS:
            self._show_sub_page(s, SUB_PAGE_KEYS[key])
        else:
            target = s.page.clickables[key]
            if target.kind == "product":
                s.product = target.payload
                s.visited.add(target.payload)
            elif target.kind == "option":
                s.options[target.payload] = key
            self._show_item(s)
        return 0.0

    def _buy(self, s: Session, info: dict) -> float:
        product = self.shop.product(s.product)
        result: RewardInfo = compute_reward(product, s.goal, self.shop.price(s.product), s.options)
        s.done, s.reward = True, result.reward
        s.page = pages.done_page(product.asin, s.options, result.reward)
        s.url = f"{BASE_URL}/done/{s.session_id}/{self._asin(s)}/{s.options}"
        info.update(reward_info=result.to_dict(), purchased_asin=product.asin,
                    purchased_options=dict(s.options), goal_asin=s.goal.asin)
        return result.reward
