"""What WebShop's greedy agent did, from an evaluation's trace lines (:mod:`esjax.rundir.traces`): the behaviour
measures a run's summary.md shows (:meth:`envs.webshop_bridge.task.WebShopTask.behaviour`) and experiments read.

What each written action was (:func:`action_kind`: a search, a buy, a page button, a product or an option) and,
per evaluation, searches, item pages, option clicks (and whether the instruction names the option clicked: the
option rule's test), buys and step-cap hits (:func:`behaviour`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .policies import instruction_words, names_value

#: Rows of summary.md's behaviour table: (key of :func:`behaviour`, label, format).
BEHAVIOUR_ROWS = (("searches_per_episode", "searches per episode", "{:.2f}"),
                  ("item_pages_per_episode", "item pages opened per episode", "{:.2f}"),
                  ("option_clicks_per_item_page", "option clicks per item page", "{:.2f}"),
                  ("item_pages_with_option_click", "item pages with an option click", "{:.1%}"),
                  ("option_clicks_named_in_instruction", "option clicks the instruction names", "{:.1%}"),
                  ("bought_on_first_item_page", "bought on the first item page", "{:.1%}"),
                  ("bought", "bought", "{:.1%}"),
                  ("bought_without_option_click", "bought without an option click", "{:.1%}"),
                  ("step_cap_hits", "step-cap hits", "{:.1%}"),
                  ("steps_per_episode", "steps per episode", "{:.2f}"))

#: Buttons of WebShop's pages (lower-cased, as in ``click[...]``); any other click is a product or an option value.
_BUTTONS = frozenset({"buy now", "< prev", "back to search", "next >", "description", "features", "reviews",
                      "search"})


def _is_product(target: str) -> bool:
    """A results-page click on a product: WebShop's ASINs are 10 letters or digits (``b07xyz1234``)."""
    return len(target) == 10 and target.isalnum() and any(ch.isdigit() for ch in target)


def action_kind(action: str) -> tuple[str, str]:
    """What a written action is, and its argument (lower-cased for clicks): ``search``, ``buy`` (``click[buy now]``),
    ``button`` (another page button), ``product`` (an ASIN), ``option`` (any other click: an option value) or
    ``malformed``."""
    if action.startswith("search["):
        return "search", action[len("search["):-1] if action.endswith("]") else action[len("search["):]
    if not (action.startswith("click[") and action.endswith("]")):
        return "malformed", action
    target = action[len("click["):-1].lower()
    if target == "buy now":
        return "buy", target
    if target in _BUTTONS:
        return "button", target
    return ("product" if _is_product(target) else "option"), target


def behaviour(lines: Iterable[dict[str, Any]]) -> dict[str, float | None]:
    """What a greedy agent did, from an evaluation's trace lines: per episode, searches, products opened and
    option clicks; option clicks per item page; the share of item pages with at least one option click; buys on
    the first item page; buys, buys without an option click on the item page bought from, and the mean reward of
    buys with and without one; step-cap hits. This is what tells a score change apart: a higher score from
    choosing options shows here as option clicks (and whether the options clicked are the ones the instruction
    names), one from better products as fewer item pages per buy."""
    episodes = searches = opened = options = pages_with_option = bought = first_page_buys = capped = steps = 0
    named = 0
    reward_by_option: dict[bool, list[float]] = {True: [], False: []}  # buys, by an option click before the buy
    for line in lines:
        episodes += 1
        words = instruction_words(str(line.get("instruction", "")))
        steps += int(line.get("steps", 0))
        capped += line.get("end") == "max_steps"
        opened_here, opened_at_buy, clicked_option, option_at_buy = 0, 0, False, False
        for action, _ in line.get("actions", []):
            kind, target = action_kind(action)
            if kind == "search":
                searches += 1
            elif kind == "buy":  # in generate mode a "buy now" off an item page is a no-op, not a buy
                opened_at_buy, option_at_buy = opened_here, clicked_option
            elif kind == "product":
                pages_with_option += clicked_option
                opened_here += 1
                opened += 1
                clicked_option = False
            elif kind == "option":
                options += 1
                named += names_value(words, target)  # the option rule's test
                clicked_option = True
        pages_with_option += clicked_option
        if line.get("end") == "bought":
            bought += 1
            first_page_buys += opened_at_buy == 1
            reward_by_option[option_at_buy].append(float(line.get("reward", 0.0)))
    n = max(episodes, 1)
    mean = lambda values: sum(values) / len(values) if values else None  # noqa: E731
    return {"episodes": episodes, "searches_per_episode": searches / n, "item_pages_per_episode": opened / n,
            "option_clicks_per_item_page": options / max(opened, 1),
            "item_pages_with_option_click": pages_with_option / max(opened, 1),
            "option_clicks_named_in_instruction": named / max(options, 1),
            "bought": bought / n, "bought_on_first_item_page": first_page_buys / n,
            "bought_without_option_click": len(reward_by_option[False]) / n,
            "reward_of_buys_with_option_click": mean(reward_by_option[True]),
            "reward_of_buys_without_option_click": mean(reward_by_option[False]),
            "step_cap_hits": capped / n, "steps_per_episode": steps / n}
