"""WebShop's purchase reward, term by term, with its breakdown.

    reward = r_type * (matched attributes + matched options + [price <= ceiling])
                    / (#goal attributes + #goal options + 1)

* attributes: a goal attribute matches if it fuzzy-matches (rounded token-set ratio > 85) any product
  attribute, else if it is a substring of the lower-cased title, joined bullet points or description;
* options: every purchased value and every goal option goes through colour normalization, then a goal
  option matches if it fuzzy-matches any purchased value. Synthetic goal options are ``(name, value)``
  pairs (WebShop passes ``dict.items()``): normalization tests the pair by *element equality* and the
  fuzzy matcher sees the pair's printed form ``"('size', 'large')"``, while purchased values are
  substring-normalized strings. So a purchased "rectangular" becomes "tan" and no longer matches the
  pair ``('item shape', 'rectangular')`` — why exact purchases score 1.0 on only 480 of the first 500
  goals of the small set;
* price: the drawn price is at most the goal's ceiling;
* r_type: 1.0; 0.5 if neither the query, nor >= 2 shared ``›`` category levels, nor a title-noun overlap
  > 0.2 matches; then title overlap < 0.1 -> 0.1 and == 0 -> 0.0, overriding the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from .data import Product
from .fuzzy import fuzzy_match
from .goals import Goal
from .normalize import normalize_color
from .nouns import noun_backend, title_nouns


@dataclass(frozen=True, slots=True)
class TypeReward:
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float


@dataclass(frozen=True, slots=True)
class RewardInfo:
    """The reward and every term that went into it (returned in ``info['reward_info']``)."""

    reward: float
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float
    r_att: float
    num_attr_matches: int
    num_attrs: int
    r_option: float | None
    num_option_matches: int
    num_options: int
    r_price: bool
    price: float
    price_upper: float
    w_att: float
    w_option: float
    w_price: float
    noun_backend: str

    def to_dict(self) -> dict:
        return asdict(self)


def _category_levels(path: str) -> set[str]:
    return {x.strip() for x in path.split("›")}


def type_reward(product: Product, goal: Goal) -> TypeReward:
    """Product-type term: query / category / title-noun overlap with WebShop's precedence."""
    query_match = product.query == goal.query
    category_match = len(_category_levels(product.product_category) & _category_levels(goal.product_category)) >= 2
    purchased = title_nouns(product.name)
    desired = title_nouns(goal.name)
    title_score = 0.2 if not desired else len(set(purchased) & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeReward(r_type, query_match, category_match, title_score)


def attribute_matches(product: Product, goal_attributes: Sequence[str]) -> int:
    """Number of goal attributes found (fuzzy in product attributes, else substring of the texts)."""
    title = product.title.lower()
    bullets = " ".join(product.bullet_points).lower()
    description = product.description.lower()
    n = 0
    for g in goal_attributes:
        if any(fuzzy_match(p, g) for p in product.attributes) or g in title or g in bullets or g in description:
            n += 1
    return n


def option_matches(purchased_values: Sequence[str], goal_options: Sequence) -> int:
    """Number of goal options (strings or (name, value) pairs) matched by some purchased value."""
    purchased = [normalize_color(o) for o in purchased_values]
    wanted = [normalize_color(o) for o in goal_options]
    return sum(1 for g in wanted if any(fuzzy_match(p, g) for p in purchased))


def compute_reward(product: Product, goal: Goal, price: float, options: Mapping[str, str]) -> RewardInfo:
    """Score buying ``product`` at ``price`` with the chosen ``options`` ({name: value}) for ``goal``."""
    t = type_reward(product, goal)
    r_price = bool(price <= goal.price_upper)
    n_att = len(goal.attributes)
    num_attr = attribute_matches(product, goal.attributes)
    goal_opts = goal.reward_options()
    n_opt = len(goal_opts)
    num_opt = option_matches(list(options.values()), goal_opts)
    denom = n_att + n_opt + 1
    reward = (num_attr + num_opt + int(r_price)) / denom * t.r_type
    return RewardInfo(
        reward=reward, r_type=t.r_type, query_match=t.query_match, category_match=t.category_match,
        title_score=t.title_score, r_att=num_attr / n_att if n_att else 0.0, num_attr_matches=num_attr,
        num_attrs=n_att, r_option=num_opt / n_opt if n_opt else None, num_option_matches=num_opt,
        num_options=n_opt, r_price=r_price, price=float(price), price_upper=float(goal.price_upper),
        w_att=n_att / denom, w_option=n_opt / denom, w_price=1 / denom, noun_backend=noun_backend(),
    )
