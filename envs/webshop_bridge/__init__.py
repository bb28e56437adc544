"""WebShop-compatible text environment: WebShop's pages, actions and reward, with in-process BM25
search and no Java, Flask, spaCy or network. WebShop as an esjax task is :mod:`.task`; from esjax the bridge
takes only what every task shares (``esjax.task``, ``esjax.errors.TaskError``, ``esjax.loop.envpool``), and esjax
imports nothing from it.

Typical use::

    from envs.webshop_bridge import load_webshop, synthetic_shop, WebShopTextEnv, InProcessEnvPool

    shop = load_webshop("webshop_small")  # the packaged real 1,000-product set, a folder, or synthetic_shop(300)
    env = WebShopTextEnv(shop)
    obs, info = env.reset(shop.split("test")[0])
    obs, reward, done, info = env.step(f"search[{env.instruction}]")
"""

from .catalog import Catalog, ListCatalog
from .data import Product, load_attribute_file, load_human_instructions, load_processed_jsonl, load_raw_products
from .env import WebShopTextEnv, parse_action
from .errors import DataError
from .factory import ShopSpec, get_shop
from .fuzzy import fuzzy_match, token_set_ratio
from .goals import Goal, make_splits
from .normalize import COLOR_SET, normalize_color
from .official import OfficialWebShopEnv, official_available
from .pages import SEP, Page
from .policies import (
    DEFAULT_MAX_STEPS,
    EvalResult,
    FirstHitPolicy,
    OraclePolicy,
    Policy,
    PolicyEpisode,
    RandomPolicy,
    evaluate,
    exact_purchase_reward,
    oracle_actions,
    page_kind,
    rollout,
    summarize,
)
from .pool import InProcessEnvPool
from .process_pool import ProcessEnvPool
from .reward import RewardInfo, compute_reward
from .search import SearchEngine, analyze
from .shop import PACKAGED_DATA, Shop, load_webshop, resolve_data
from .synthetic import SyntheticCatalog, SyntheticGoals, synthetic_shop

__all__ = [
    "COLOR_SET", "Catalog", "DEFAULT_MAX_STEPS", "DataError", "EvalResult", "FirstHitPolicy",
    "Goal", "ListCatalog", "PACKAGED_DATA", "OfficialWebShopEnv", "OraclePolicy", "Page", "Policy", "PolicyEpisode",
    "InProcessEnvPool", "ProcessEnvPool",
    "Product",    "RandomPolicy", "RewardInfo", "SEP", "SearchEngine", "Shop", "ShopSpec", "SyntheticCatalog",
    "SyntheticGoals", "WebShopTextEnv", "analyze", "compute_reward", "evaluate", "exact_purchase_reward",
    "fuzzy_match", "get_shop", "load_attribute_file", "load_human_instructions", "load_processed_jsonl",
    "load_raw_products", "load_webshop", "make_splits", "normalize_color", "official_available",
    "oracle_actions", "page_kind", "parse_action", "resolve_data", "rollout", "summarize", "synthetic_shop",
    "token_set_ratio",
]


def __getattr__(name: str):
    if name == "EnvPool":  # the former name of InProcessEnvPool
        from . import pool

        return pool.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
