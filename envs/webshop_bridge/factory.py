"""Shops from picklable recipes: ``ShopSpec`` says which shop (real WebShop files or a synthetic catalog) so
worker processes and Ray actors can build the same one, and ``get_shop`` builds it once per process and shares it.

It sits above both makers (:mod:`.shop`'s ``load_webshop`` and :mod:`.synthetic`'s ``synthetic_shop``), which
therefore need not know each other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .pool import InProcessEnvPool
from .shop import Shop, load_webshop
from .synthetic import synthetic_shop


@dataclass(frozen=True)
class ShopSpec:
    """A picklable recipe for a Shop: ``kind`` is 'webshop' (``path``; ``num_products`` None = all; ``goals``
    and ``human_file`` as in :func:`load_webshop`) or 'synthetic' (``num_products``, default 300)."""

    kind: str = "synthetic"
    path: str | None = None
    num_products: int | None = None
    seed: int = 0
    goals: str = "templated"
    human_file: str | None = None

    def build(self) -> Shop:
        if self.kind == "webshop":
            if self.path is None:
                raise ValueError("ShopSpec(kind='webshop') needs a path")
            return load_webshop(self.path, num_products=self.num_products, seed=self.seed, goals=self.goals,
                                human_file=self.human_file)
        if self.kind == "synthetic":
            return synthetic_shop(self.num_products or 300, seed=self.seed)
        raise ValueError(f"ShopSpec.kind must be 'webshop' or 'synthetic', got {self.kind!r}")


_SHOPS: dict[ShopSpec, Shop] = {}
_SHOPS_LOCK = threading.Lock()


def get_shop(spec: ShopSpec) -> Shop:
    """The process-wide Shop for ``spec`` (built on first use, then shared)."""
    with _SHOPS_LOCK:
        shop = _SHOPS.get(spec)
        if shop is None:
            shop = _SHOPS[spec] = spec.build()
        return shop


def pool_of(spec: ShopSpec, n: int, **env_kwargs) -> InProcessEnvPool:
    """``n`` sessions in this process over the process-wide shop of ``spec``: what a Ray actor or a worker process
    builds its share of a pool with (``functools.partial(pool_of, spec)`` is a picklable recipe)."""
    return InProcessEnvPool(get_shop(spec), n, **env_kwargs)
