"""A Shop: one catalog, its drawn prices, goals, splits and search engine — what sessions share.

``load_webshop`` reads WebShop's files (raw ``items_shuffle*.json`` or the processed JSONL, plus
``items_ins_v2*.json`` and optionally ``items_human_ins.json``). Building a shop from a picklable recipe
(``ShopSpec``, ``get_shop``) lives in :mod:`envs.webshop_bridge.factory`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .catalog import Catalog, ListCatalog
from .data import Product, load_attribute_file, load_human_instructions, load_processed_jsonl, load_raw_products
from .errors import DataError
from .goals import DEFAULT_SPLITS, Goal, build_goals, make_splits
from .search import SEARCH_RETURN_N, SearchEngine, get_engine


@dataclass
class Shop:
    """Everything a session reads. Build it once per process; share it between sessions."""

    catalog: Catalog
    prices: np.ndarray
    goals: Sequence[Goal]
    splits: dict[str, range]
    engine: SearchEngine
    name: str = "shop"
    human_goals: Sequence[Goal] | None = None
    source: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.catalog)

    def product(self, index: int) -> Product:
        return self.catalog[index]

    def index_of(self, asin: str) -> int | None:
        return self.catalog.index_of(asin)

    def price(self, index: int) -> float:
        return float(self.prices[index])

    def split(self, name: str) -> range:
        if name not in self.splits:
            raise KeyError(f"unknown split {name!r}; this shop has {sorted(self.splits)}")
        return self.splits[name]

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """BM25 top-``k`` product indices for ``query`` (lower-cased text expected)."""
        return self.engine.search(query, k)


#: Data sets shipped inside the package, by name: ``load_webshop("webshop_small")`` needs no download.
#: ``webshop_small`` is WebShop's 1,000-product set (MIT; see ``assets/webshop_small/README.md``).
PACKAGED_DATA: dict[str, Path] = {"webshop_small": Path(__file__).resolve().parent / "assets" / "webshop_small"}


def resolve_data(path: str | os.PathLike) -> Path:
    """A packaged data set's folder for its name (``'webshop_small'``), else ``path`` itself.

    The bare name always means the packaged set; a local folder of that name is ``./webshop_small``.
    """
    return PACKAGED_DATA.get(str(path), Path(path))


def _pick(directory: Path, patterns: Sequence[str], what: str, required: bool) -> Path | None:
    for pattern in patterns:
        found = sorted(directory.glob(pattern))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise DataError(str(directory), f"several {what} files match {pattern!r}: "
                                            f"{[f.name for f in found]}; pass the file explicitly")
    if required:
        raise DataError(str(directory), f"no {what} file ({' or '.join(patterns)}) in this directory")
    return None


def load_webshop(path: str | os.PathLike, *, attributes_file: str | os.PathLike | None = None,
                 human_file: str | os.PathLike | None = None, num_products: int | None = None, seed: int = 0,
                 goals: str = "templated", splits: Mapping[str, int] | Sequence[tuple[str, int]] = DEFAULT_SPLITS,
                 cache_dir: str | os.PathLike | None | bool = None) -> Shop:
    """Load WebShop data from a directory, a products file or a packaged set's name (``'webshop_small'``).

    A directory is searched for ``products*.jsonl`` (processed) or ``items_shuffle*.json`` (raw),
    ``items_ins_v2*.json`` and ``items_human_ins.json``. ``goals`` picks the goal set: 'templated' (WebShop's
    instructions built from the attribute file; 'synthetic' is its old name) or 'human'; human goals are built
    whenever the human file exists and kept in ``shop.human_goals``.
    ``seed`` fixes prices and price ceilings; ``splits`` are sizes of consecutive goal ranges, the rest
    is ``train``.
    """
    path = resolve_data(path)
    if not path.exists():
        raise DataError(str(path), "file or directory not found")
    directory = path if path.is_dir() else path.parent
    products_file = _pick(path, ("products*.jsonl", "products*.jsonl.gz", "items_shuffle*.json",
                                 "items_shuffle*.json.gz"), "products", True) if path.is_dir() else path
    if attributes_file is None:
        attributes_file = _pick(directory, ("items_ins_v2*.json", "items_ins_v2*.json.gz"), "attribute", False)
    if human_file is None:
        human_file = _pick(directory, ("items_human_ins*.json", "items_human_ins*.json.gz"), "human instruction",
                           False)
    attributes = load_attribute_file(attributes_file) if attributes_file is not None else None
    if products_file.name.endswith((".jsonl", ".jsonl.gz")):
        products, texts = load_processed_jsonl(products_file, attributes, num_products)
    else:
        products = load_raw_products(products_file, attributes, num_products)
        texts = None
    if not products:
        raise DataError(str(products_file), "no products")
    catalog = ListCatalog(products, texts)
    human = load_human_instructions(human_file) if human_file is not None else None

    prices, synthetic = build_goals(products, seed=seed, kind="synthetic")
    human_set = build_goals(products, seed=seed, kind="human", human=human)[1] if human is not None else None
    if goals in ("templated", "synthetic"):
        chosen = synthetic
    elif goals == "human":
        if human_set is None:
            raise DataError(str(directory), "goals='human' needs items_human_ins.json (pass human_file=...)")
        chosen = human_set
    else:
        raise ValueError(f"goals must be 'templated' or 'human', got {goals!r}")
    engine = get_engine(catalog.fingerprint(), catalog.build_search_engine, len(catalog), cache_dir)
    return Shop(catalog=catalog, prices=prices, goals=chosen, splits=make_splits(len(chosen), splits),
                engine=engine, name=f"webshop:{products_file.name}", human_goals=human_set,
                source={"products_file": str(products_file), "attributes_file": str(attributes_file),
                        "human_file": str(human_file) if human_file else None, "seed": seed})
