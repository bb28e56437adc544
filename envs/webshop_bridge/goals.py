"""Goals (instructions + what a correct purchase is), drawn prices, price ceilings and splits.

Follows WebShop's engine (``generate_product_prices`` then ``get_synthetic_goals`` /
``get_human_goals`` then a seed-233 shuffle), with one fix: WebShop draws prices and ceilings from
Python's global RNG *before* seeding it, so its instruction texts change run to run. Here everything
comes from ``random.Random(seed)``, consumed in WebShop's order (one ``uniform`` per two-price product,
then one ``sample`` per instructed product), so a goal set equals what WebShop produces after
``random.seed(seed)`` and is identical in every process.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import Product

PRICE_STEPS: tuple[float, ...] = tuple(10.0 * i for i in range(1, 100))
NO_CEILING = 1_000_000.0
SHUFFLE_SEED = 233
DEFAULT_SPLITS: tuple[tuple[str, int], ...] = (("test", 500), ("eval", 1000))


@dataclass(frozen=True, slots=True)
class Goal:
    """What one episode asks for and how its purchase is scored.

    ``goal_options`` is a dict ``{option name: value}`` for synthetic goals (the reward then sees
    ``(name, value)`` pairs, as WebShop's does) and a tuple of plain strings for human goals.
    """

    asin: str
    product_index: int
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: Mapping[str, str] | tuple[str, ...]
    price_upper: float
    category: str
    query: str
    name: str
    product_category: str
    weight: float = 1.0
    kind: str = "synthetic"

    def reward_options(self) -> list:
        """The option list WebShop's reward receives: pairs for a dict, strings otherwise."""
        if isinstance(self.goal_options, Mapping):
            return list(self.goal_options.items())
        return list(self.goal_options)

    def option_values(self) -> list[str]:
        """Option values an agent would click to satisfy this goal."""
        if isinstance(self.goal_options, Mapping):
            return list(self.goal_options.values())
        return list(self.goal_options)

    def to_dict(self) -> dict[str, Any]:
        opts = dict(self.goal_options) if isinstance(self.goal_options, Mapping) else list(self.goal_options)
        return {
            "asin": self.asin, "product_index": self.product_index, "instruction_text": self.instruction_text,
            "attributes": list(self.attributes), "goal_options": opts, "price_upper": self.price_upper,
            "category": self.category, "query": self.query, "name": self.name,
            "product_category": self.product_category, "weight": self.weight, "kind": self.kind,
        }


def draw_prices(pricings: Sequence[Sequence[float]], rng: random.Random) -> np.ndarray:
    """One price per product: none -> 100, one -> it, a range -> ``uniform(low, high)`` (WebShop's rule)."""
    out = np.empty(len(pricings), dtype=np.float64)
    for i, pricing in enumerate(pricings):
        if not pricing:
            out[i] = 100.0
        elif len(pricing) == 1:
            out[i] = pricing[0]
        else:
            out[i] = rng.uniform(pricing[0], pricing[1])
    return out


def price_ceiling(price: float, rng: random.Random) -> tuple[float, str]:
    """The larger of two distinct draws from the first four multiples of $10 above ``price``.

    Fewer than two such multiples (price >= $980) -> no ceiling (1e6) and no price text.
    """
    steps = [p for p in PRICE_STEPS if p > price][:4]
    if len(steps) < 2:
        return NO_CEILING, ""
    upper = max(rng.sample(steps, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def option_text(goal_options: Mapping[str, str]) -> str:
    """`` with name: value, and name2: value2`` (empty when there are no options)."""
    body = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
    return f" with {body}" if body else ""


def synthetic_goals(products: Sequence[Product], prices: Sequence[float], rng: random.Random) -> list[Goal]:
    """One goal per instructed product x combination of its option values (option names sorted)."""
    goals: list[Goal] = []
    attr_counts: dict[str, int] = defaultdict(int)
    for idx, product in enumerate(products):
        if product.instruction_text is None:
            continue
        attributes = tuple(product.instruction_attributes or ())
        upper, price_text = price_ceiling(float(prices[idx]), rng)
        names = sorted(product.options)
        for combo in itertools.product(*(product.options[n] for n in names)):
            chosen = dict(zip(names, combo))
            goals.append(Goal(
                asin=product.asin, product_index=idx,
                instruction_text=f"{product.instruction_text}{option_text(chosen)}{price_text}",
                attributes=attributes, goal_options=chosen, price_upper=upper, category=product.category,
                query=product.query, name=product.title, product_category=product.product_category,
            ))
            for a in attributes:
                attr_counts[a] += 1
    return [_with_weight(g, attr_counts) for g in goals]


def _with_weight(goal: Goal, attr_counts: Mapping[str, int]) -> Goal:
    if not goal.attributes:
        return goal
    weight = sum(1.0 / attr_counts[a] for a in goal.attributes) / len(goal.attributes)
    return dataclasses.replace(goal, weight=weight)


def human_goals(products: Sequence[Product], prices: Sequence[float],
                human: Mapping[str, Sequence[Mapping[str, Any]]], rng: random.Random) -> list[Goal]:
    """WebShop's human goals: one per human instruction with attributes, trailing '.' stripped."""
    goals: list[Goal] = []
    for idx, product in enumerate(products):
        for entry in human.get(product.asin, ()):
            attributes = tuple(entry["instruction_attributes"])
            if not attributes:
                continue  # WebShop skips these before drawing a ceiling
            upper, price_text = price_ceiling(float(prices[idx]), rng)
            opts = entry.get("instruction_options", [])
            if isinstance(opts, Mapping):
                opts = list(opts.values())
            goals.append(Goal(
                asin=product.asin, product_index=idx,
                instruction_text=entry["instruction"].strip(".") + price_text, attributes=attributes,
                goal_options=tuple(opts), price_upper=upper, category=product.category, query=product.query,
                name=product.name, product_category=product.product_category, kind="human",
            ))
    return goals


def shuffle_goals(goals: list[Goal], seed: int = SHUFFLE_SEED) -> list[Goal]:
    """WebShop's fixed order: ``random.seed(233); random.shuffle(goals)`` (a copy is returned)."""
    out = list(goals)
    random.Random(seed).shuffle(out)
    return out


def build_goals(products: Sequence[Product], *, seed: int = 0, kind: str = "synthetic",
                human: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> tuple[np.ndarray, list[Goal]]:
    """Prices and shuffled goals for a catalog; deterministic in ``seed``."""
    rng = random.Random(seed)
    prices = draw_prices([p.pricing for p in products], rng)
    if kind == "synthetic":
        goals = synthetic_goals(products, prices, rng)
    elif kind == "human":
        goals = human_goals(products, prices, human or {}, rng)
    else:
        raise ValueError(f"goal kind must be 'synthetic' or 'human', got {kind!r}")
    return prices, shuffle_goals(goals)


def make_splits(num_goals: int, sizes: Sequence[tuple[str, int]] | Mapping[str, int] = DEFAULT_SPLITS,
                rest: str = "train") -> dict[str, range]:
    """Consecutive index ranges: by default test 0-499, eval 500-1499, train 1500+ (WebShop's)."""
    items = list(sizes.items()) if isinstance(sizes, Mapping) else list(sizes)
    splits: dict[str, range] = {}
    start = 0
    for name, size in items:
        if size < 0:
            raise ValueError(f"split {name!r} has negative size {size}")
        stop = min(start + size, num_goals)
        splits[name] = range(start, stop)
        start = stop
    splits[rest] = range(start, num_goals)
    return splits
