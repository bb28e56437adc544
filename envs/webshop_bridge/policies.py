"""Reference policies (oracle and random clicking), episode rollouts and WebShop-style scoring.

Policies see what an agent sees (observation and available actions) plus, for the oracle, the goal.
``act`` returns the next action string, or None to give up (the episode then scores 0).
Scores follow WebShop: score = 100 x mean reward, success = share of episodes with reward 1.0.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .env import WebShopTextEnv
from .goals import Goal
from .pages import BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, PREV_PAGE
from .reward import compute_reward
from .shop import Shop

DEFAULT_MAX_STEPS = 15  # the cap ReAct and verl-agent use


class Policy(Protocol):
    def reset(self, goal_index: int, goal: Goal) -> None: ...
    def act(self, observation: str, available: dict) -> str | None: ...


def page_kind(available: dict) -> str:
    """Which page the available actions belong to: search, results, item, item_sub or done."""
    clickables = available["clickables"]
    if available["has_search_bar"]:
        return "search"
    if BUY_NOW.lower() in clickables:
        return "item"
    if NEXT_PAGE.lower() in clickables:
        return "results"
    if PREV_PAGE.lower() in clickables:
        return "item_sub"
    return "done"


def _product_keys(available: dict) -> list[str]:
    buttons = {BACK_TO_SEARCH.lower(), NEXT_PAGE.lower(), PREV_PAGE.lower()}
    return [c for c in available["clickables"] if c not in buttons]


class OraclePolicy:
    """Searches the instruction, pages (up to ``max_pages``) to the goal's ASIN, clicks the goal's option
    values, buys. If the ASIN is not found it searches again and buys the top hit with the options."""

    def __init__(self, max_pages: int = 5):
        self.max_pages = max_pages

    def reset(self, goal_index: int, goal: Goal) -> None:
        self.goal = goal
        self.target = goal.asin.lower()
        self.result_page = 1
        self.fallback = False
        self.searches = 0
        self.chosen: set[str] = set()

    def act(self, observation: str, available: dict) -> str | None:
        kind = page_kind(available)
        clickables = available["clickables"]
        if kind == "search":
            if self.searches >= 2:
                return None
            self.searches += 1
            self.result_page = 1
            return f"search[{self.goal.instruction_text}]"
        if kind == "results":
            if not self.fallback and self.target in clickables:
                return f"click[{self.target}]"
            products = _product_keys(available)
            if self.fallback:
                return f"click[{products[0]}]" if products else None
            if self.result_page < self.max_pages and len(products) == 10:
                self.result_page += 1
                return f"click[{NEXT_PAGE.lower()}]"
            self.fallback = True
            return f"click[{BACK_TO_SEARCH.lower()}]"
        if kind == "item":
            for value in self.goal.option_values():
                if value in clickables and value not in self.chosen:
                    self.chosen.add(value)
                    return f"click[{value}]"
            return f"click[{BUY_NOW.lower()}]"
        if kind == "item_sub":
            return f"click[{PREV_PAGE.lower()}]"
        return None


class RandomPolicy:
    """Searches the instruction, then clicks a uniformly random clickable each step (seeded per goal)."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def reset(self, goal_index: int, goal: Goal) -> None:
        self.goal = goal
        self.rng = random.Random(f"{self.seed}:{goal_index}")

    def act(self, observation: str, available: dict) -> str | None:
        if available["has_search_bar"]:
            return f"search[{self.goal.instruction_text}]"
        clickables = available["clickables"]
        return f"click[{self.rng.choice(clickables)}]" if clickables else None


def instruction_words(instruction: str) -> str:
    """The instruction as the option rule reads it: lower-cased, commas dropped, words single-spaced and padded with
    one space on each side, so that :func:`names_value` is a whole-word test."""
    return f" {' '.join(instruction.lower().replace(',', ' ').split())} "


def names_value(words: str, value: str) -> bool:
    """Whether the option ``value`` appears as whole words in ``words`` (:func:`instruction_words`)."""
    return f" {value} " in words


class FirstHitPolicy:
    """The rule baselines: search the instruction, open the first hit, then (``options=True``) click every
    option value that the instruction names, and buy. No knowledge of the goal beyond its text."""

    def __init__(self, options: bool = False):
        self.options = options

    def reset(self, goal_index: int, goal: Goal) -> None:
        self.instruction = goal.instruction_text
        self.words = instruction_words(goal.instruction_text)
        self.chosen: set[str] = set()

    def act(self, observation: str, available: dict) -> str | None:
        kind = page_kind(available)
        if kind == "search":
            return f"search[{self.instruction}]"
        if kind == "results":
            products = _product_keys(available)
            return f"click[{products[0]}]" if products else None
        if kind == "item":
            if self.options:
                buttons = {BUY_NOW.lower(), PREV_PAGE.lower(), BACK_TO_SEARCH.lower(), "description", "features",
                           "reviews"}
                for value in available["clickables"]:
                    if value not in buttons and value not in self.chosen and names_value(self.words, value):
                        self.chosen.add(value)
                        return f"click[{value}]"
            return f"click[{BUY_NOW.lower()}]"
        return None


@dataclass
class PolicyEpisode:
    """One episode a scripted :class:`Policy` played: its actions, the observations they answered, the outcome."""

    goal_index: int
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)  # observations[i] is what actions[i] answered
    reward: float = 0.0
    done: bool = False
    info: dict = field(default_factory=dict)


def rollout(env: WebShopTextEnv, policy: Policy, goal_index: int,
            max_steps: int = DEFAULT_MAX_STEPS) -> PolicyEpisode:
    """Play one episode; stops at Buy Now, when the policy gives up, or after ``max_steps`` actions."""
    obs, _ = env.reset(goal_index)
    policy.reset(goal_index, env.goal)
    episode = PolicyEpisode(goal_index)
    for _ in range(max_steps):
        action = policy.act(obs, env.available_actions())
        if action is None:
            break
        episode.observations.append(obs)
        episode.actions.append(action)
        obs, reward, done, info = env.step(action)
        if done:
            episode.reward, episode.done, episode.info = reward, True, info
            break
    return episode


def exact_purchase_reward(shop: Shop, goal_index: int) -> float:
    """Reward for buying the goal's own product with exactly the goal's options at its drawn price.

    1.0 for every synthetic-shop goal; 480 of the first 500 goals of WebShop's small set (see reward.py).
    """
    goal = shop.goals[goal_index]
    options = dict(goal.goal_options) if isinstance(goal.goal_options, Mapping) else {}
    product = shop.product(goal.product_index)
    return compute_reward(product, goal, shop.price(goal.product_index), options).reward


def oracle_actions(shop: Shop, goal_index: int, max_steps: int = DEFAULT_MAX_STEPS) -> list[str]:
    """The oracle's action sequence for one goal (handy for tests and behaviour cloning)."""
    return rollout(WebShopTextEnv(shop), OraclePolicy(), goal_index, max_steps).actions


@dataclass(frozen=True)
class EvalResult:
    score: float  # 100 x mean reward
    success_rate: float  # share of episodes with reward 1.0
    mean_reward: float
    mean_steps: float
    episodes: int


def summarize(episodes: Sequence[PolicyEpisode]) -> EvalResult:
    n = len(episodes)
    if n == 0:
        return EvalResult(0.0, 0.0, 0.0, 0.0, 0)
    mean = sum(e.reward for e in episodes) / n
    return EvalResult(100 * mean, sum(e.reward == 1.0 for e in episodes) / n, mean,
                      sum(len(e.actions) for e in episodes) / n, n)


def evaluate(shop: Shop, make_policy: Callable[[], Policy], goal_indices: Iterable[int],
             max_steps: int = DEFAULT_MAX_STEPS) -> tuple[EvalResult, list[PolicyEpisode]]:
    """Roll a fresh policy over each goal; returns the summary and the episodes."""
    env = WebShopTextEnv(shop)
    policy = make_policy()
    episodes = [rollout(env, policy, g, max_steps) for g in goal_indices]
    return summarize(episodes), episodes
