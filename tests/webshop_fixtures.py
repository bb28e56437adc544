"""Shared helpers for the WebShop bridge tests: the real small data set (skipped when absent) and
hand-made products, goals and shops."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from envs.webshop_bridge import Goal, ListCatalog, Product, Shop, make_splits
from envs.webshop_bridge.search import SearchEngine

REPO = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def small_dir() -> Path:
    """../shared/webshop_small (or $ESJAX_WEBSHOP_SMALL) if it holds the products file, else the same data as the
    package ships it (envs/webshop_bridge/assets/webshop_small, gzipped), decompressed once into the temp folder:
    the small-set tests run wherever the repository stands alone."""
    env = os.environ.get("ESJAX_WEBSHOP_SMALL")
    for candidate in ([Path(env)] if env else []) + [REPO.parent / "shared" / "webshop_small"]:
        if (candidate / "products_1000.jsonl").exists():
            return candidate
    return packaged_small_dir()


def packaged_small_dir() -> Path:
    """The packaged small set as plain files (what tests that read the files themselves need)."""
    import gzip
    import shutil
    import tempfile

    from envs.webshop_bridge import PACKAGED_DATA

    source = PACKAGED_DATA["webshop_small"]
    out = Path(tempfile.gettempdir()) / "esjax-test-webshop-small"
    out.mkdir(exist_ok=True)
    for gz in sorted(source.glob("*.gz")):
        target = out / gz.name[:-3]
        if not target.exists() or target.stat().st_mtime < gz.stat().st_mtime:
            part = out / f".{target.name}.{os.getpid()}"
            with gzip.open(gz, "rb") as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(part, target)  # atomic: parallel test workers never read half a file
    return out


requires_small = pytest.mark.skipif(small_dir() is None, reason="the small WebShop set is not available")


@lru_cache(maxsize=1)
def small_shop():
    from envs.webshop_bridge import load_webshop

    return load_webshop(small_dir(), cache_dir=False)


def make_product(asin: str = "B000000001", **kw) -> Product:
    fields = dict(
        asin=asin, name="Acme Running Shoes for Men", title="Acme Running Shoes for Men",
        description="Lightweight running shoes.", bullet_points=("Rubber sole", "Breathable mesh"),
        pricing=(25.0,), price_tag="$25.0", options={"color": ["black", "white"], "size": ["8", "9"]},
        attributes=("rubber sole", "lightweight"), category="fashion", query="running shoes",
        product_category="Clothing, Shoes & Jewelry › Men › Shoes › Athletic", instruction_text=None,
        instruction_attributes=None,
    )
    fields.update(kw)
    if "title" in kw and "name" not in kw:
        fields["name"] = kw["title"]
    return Product(**fields)


def make_goal(product: Product, index: int = 0, **kw) -> Goal:
    fields = dict(
        asin=product.asin, product_index=index, instruction_text="i need running shoes",
        attributes=("rubber sole",), goal_options={"color": "black"}, price_upper=30.0,
        category=product.category, query=product.query, name=product.title,
        product_category=product.product_category,
    )
    fields.update(kw)
    return Goal(**fields)


def tiny_shop(products: list[Product], goals: list[Goal] | None = None, prices=None) -> Shop:
    """A Shop over hand-made products (search index built from their texts, no caching)."""
    catalog = ListCatalog(products)
    goals = goals if goals is not None else [make_goal(products[0])]
    prices = np.asarray(prices if prices is not None else [p.pricing[0] for p in products], dtype=float)
    return Shop(catalog=catalog, prices=prices, goals=goals, splits=make_splits(len(goals), [("test", 1)]),
                engine=SearchEngine.from_texts(catalog.index_texts()), name="tiny")
