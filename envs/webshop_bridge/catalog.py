"""Catalogs: indexable product collections with ASIN lookup and field filters.

Real data is a list of :class:`Product`; synthetic catalogs (synthetic.py) keep columns and build
products on access, so a 1M-product catalog costs tens of MB instead of gigabytes. Both satisfy
:class:`Catalog`, which is all the environment, search and reward need.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .data import Product
from .search import ANALYZER_VERSION, K1, B, SearchEngine

FILTER_FIELDS = ("category", "query", "attribute")


@runtime_checkable
class Catalog(Protocol):
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> Product: ...
    def index_of(self, asin: str) -> int | None: ...
    def indices_where(self, field: str, value: str) -> list[int]: ...
    def fingerprint(self) -> str: ...
    def build_search_engine(self) -> SearchEngine: ...


class ListCatalog:
    """Products held in memory, in file order (document number = position)."""

    def __init__(self, products: Sequence[Product], index_texts: Sequence[str] | None = None):
        self.products = list(products)
        self._texts = list(index_texts) if index_texts is not None else [p.index_text() for p in self.products]
        self._by_asin = {p.asin: i for i, p in enumerate(self.products)}
        self._filters: dict[str, dict[str, list[int]]] = {}
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return len(self.products)

    def __getitem__(self, index: int) -> Product:
        return self.products[index]

    def index_of(self, asin: str) -> int | None:
        return self._by_asin.get(asin)

    def index_texts(self) -> list[str]:
        return self._texts

    def indices_where(self, field: str, value: str) -> list[int]:
        """Products whose category / query equals ``value`` or whose attributes contain it."""
        if field not in FILTER_FIELDS:
            raise ValueError(f"field must be one of {FILTER_FIELDS}, got {field!r}")
        table = self._filters.get(field)
        if table is None:
            table = {}
            for i, p in enumerate(self.products):
                keys = p.attributes if field == "attribute" else (getattr(p, field),)
                for k in dict.fromkeys(keys):
                    table.setdefault(k, []).append(i)
            self._filters[field] = table
        return table.get(value, [])

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            h = hashlib.sha1(f"{ANALYZER_VERSION}|{K1}|{B}".encode())
            for t in self._texts:
                h.update(t.encode("utf-8", "surrogatepass"))
                h.update(b"\x00")
            self._fingerprint = "list-" + h.hexdigest()[:20]
        return self._fingerprint

    def build_search_engine(self) -> SearchEngine:
        return SearchEngine.from_texts(self._texts)
