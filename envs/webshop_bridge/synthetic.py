"""Synthetic WebShop catalogs: any size (100 to 2,000,000+), deterministic by seed, in WebShop's schema.

Products are drawn column-wise with numpy (product type, brand, attributes, instruction attributes,
option subsets, prices), and turned into :class:`Product` records only when a page needs one, so a
1M-product catalog is built in seconds and holds tens of MB. The search index is built straight from
the columns: every text field is a concatenation of table strings whose analyzed terms are known, so
the per-document term counts come out of array gathers instead of tokenizing a million strings (a test
checks they equal tokenizing the rendered texts).

The shop is meant to be learnable by a small model: 30 product types in WebShop's five categories,
each with a clear attribute vocabulary and up to two options (colour, size, pack, flavour...), titles
that name the type and two attributes, and instructions in WebShop's style ("i need <attrs> <type>",
then " with <option>: <value>, and ...", then ", and price lower than X dollars"). Buying a goal's own
product with its options scores exactly 1.0 (no option value hides a colour word as a substring).

Goals are one per product x option combination (option names sorted, as in WebShop), price ceilings
follow WebShop's rule (larger of two distinct draws among the first four multiples of $10 above the
price), and the goal order is a seeded permutation. ``write_raw`` saves a catalog as WebShop's
``items_shuffle`` / ``items_ins_v2`` JSON files, which ``load_webshop`` reads back to the same products.

Most of its ~620 lines are the category vocabularies (word lists), not logic.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .data import Product
from .goals import NO_CEILING, Goal, make_splits, option_text
from .search import SearchEngine, analyze, get_engine
from .shop import Shop

GENERATOR_VERSION = 1
MAX_ATTRS = 4
MAX_OPTION_SLOTS = 2
MAX_OPTION_VALUES = 8
CHUNK = 100_000


@dataclass(frozen=True)
class ProductType:
    category: str
    name: str
    path: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]


_COLORS = ("black", "white", "navy", "grey", "red", "blue", "green", "pink")
_SIZES = ("small", "medium", "large", "x-large")
_SHOE = ("6", "7", "8", "9", "10", "11")
_PACKS = ("1 pack", "2 pack", "4 pack", "6 pack")


def _t(category, name, path, attributes, options, price) -> ProductType:
    return ProductType(category, name, path, tuple(attributes.split(", ")),
                       tuple((n, tuple(v)) for n, v in options), price)


PRODUCT_TYPES: tuple[ProductType, ...] = (
    _t("beauty", "shampoo", "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
       "sulfate free, paraben free, natural ingredients, for dry hair, color safe, cruelty free",
       [("size", ("8 fl oz", "12 fl oz", "16 fl oz", "32 fl oz"))], (6, 30)),
    _t("beauty", "lipstick", "Beauty & Personal Care › Makeup › Lips › Lipstick",
       "long lasting, cruelty free, matte finish, vegan, waterproof, moisturizing",
       [("color", ("red", "pink", "nude", "plum", "coral"))], (5, 25)),
    _t("beauty", "face moisturizer", "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
       "fragrance free, for sensitive skin, hyaluronic acid, oil free, spf 30, anti aging",
       [("size", ("1.7 oz", "3.4 oz", "6.8 oz"))], (10, 60)),
    _t("beauty", "hair dryer", "Beauty & Personal Care › Hair Care › Styling Tools › Hair Dryers",
       "ionic, lightweight, low noise, fast drying, travel size, diffuser included",
       [("color", ("black", "white", "pink", "purple"))], (20, 120)),
    _t("beauty", "nail polish", "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish",
       "quick dry, non toxic, long lasting, glossy finish, chip resistant",
       [("color", ("red", "pink", "nude", "coral", "white")), ("size", ("1 pack", "3 pack", "6 pack"))], (4, 20)),
    _t("beauty", "makeup brush set", "Beauty & Personal Care › Tools & Accessories › Makeup Brushes & Tools",
       "synthetic bristles, cruelty free, travel case, soft, easy to clean",
       [("size", ("10 pieces", "15 pieces", "20 pieces"))], (8, 40)),
    _t("electronics", "wireless earbuds", "Electronics › Headphones, Earbuds & Accessories › Earbud Headphones",
       "noise cancelling, bluetooth 5.0, water resistant, long battery life, charging case, hands free",
       [("color", ("black", "white", "navy", "pink"))], (15, 150)),
    _t("electronics", "phone charger", "Electronics › Cell Phones & Accessories › Chargers & Power Adapters",
       "fast charging, usb c, high speed, compact, dual port",
       [("size", ("3 ft", "6 ft", "10 ft")), ("color", ("black", "white"))], (8, 35)),
    _t("electronics", "hdmi cable", "Electronics › Television & Video › Accessories › Cables › HDMI Cables",
       "high speed, 4k, gold plated, braided, ethernet",
       [("size", ("3 ft", "6 ft", "10 ft", "15 ft", "25 ft"))], (6, 30)),
    _t("electronics", "bluetooth speaker", "Electronics › Portable Audio & Video › Portable Speakers & Docks",
       "waterproof, portable, long battery life, deep bass, wireless",
       [("color", ("black", "blue", "red", "grey", "green"))], (20, 200)),
    _t("electronics", "laptop stand", "Electronics › Computers & Accessories › Laptop Accessories › Stands",
       "adjustable height, aluminum alloy, foldable, ergonomic, heat dissipation",
       [("color", ("silver", "black", "grey"))], (15, 70)),
    _t("electronics", "security camera", "Electronics › Camera & Photo › Surveillance & Security Cameras",
       "night vision, motion detection, two way audio, 1080p hd, wifi",
       [("size", ("1 pack", "2 pack", "4 pack"))], (25, 250)),
    _t("garden", "throw pillow covers", "Home & Kitchen › Bedding › Decorative Pillows, Inserts & Covers",
       "double sided, machine washable, hidden zipper, soft velvet, decorative",
       [("color", _COLORS), ("size", ("18 x 18 inch", "20 x 20 inch", "24 x 24 inch"))], (8, 40)),
    _t("garden", "area rug", "Home & Kitchen › Home Décor › Area Rugs, Runners & Pads › Area Rugs",
       "non slip, machine washable, easy to clean, low pile, stain resistant",
       [("color", ("blue", "grey", "beige", "green", "red")), ("size", ("3 x 5 ft", "5 x 7 ft", "8 x 10 ft"))],
       (30, 300)),
    _t("garden", "led desk lamp", "Tools & Home Improvement › Lighting & Ceiling Fans › Lamps & Shades › Desk Lamps",
       "dimmable, eye caring, usb charging port, touch control, energy efficient",
       [("color", ("black", "white", "silver"))], (15, 80)),
    _t("garden", "garden hose", "Patio, Lawn & Garden › Watering Equipment › Garden Hoses",
       "expandable, kink free, heavy duty, lightweight, leak proof",
       [("size", ("25 ft", "50 ft", "75 ft", "100 ft"))], (15, 90)),
    _t("garden", "shower curtain", "Home & Kitchen › Bath › Shower Curtains, Hooks & Liners › Shower Curtains",
       "waterproof, mildew resistant, machine washable, heavy duty, with hooks",
       [("color", ("white", "grey", "navy", "green")), ("size", ("72 x 72 inch", "72 x 84 inch"))], (10, 45)),
    _t("garden", "storage bins", "Home & Kitchen › Storage & Organization › Baskets, Bins & Containers",
       "foldable, with lid, stackable, fabric, with handles",
       [("color", ("grey", "beige", "white", "black")), ("size", _PACKS)], (12, 60)),
    _t("fashion", "running shoes", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running",
       "non slip, breathable, lightweight, rubber sole, arch support, memory foam",
       [("color", ("black", "white", "grey", "blue", "red")), ("size", _SHOE)], (30, 160)),
    _t("fashion", "t-shirt", "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
       "short sleeve, machine wash, cotton, relaxed fit, tagless",
       [("color", _COLORS), ("size", _SIZES)], (8, 35)),
    _t("fashion", "hoodie", "Clothing, Shoes & Jewelry › Women › Clothing › Fashion Hoodies & Sweatshirts",
       "fleece lined, long sleeve, drawstring, kangaroo pocket, machine wash",
       [("color", ("black", "grey", "navy", "pink", "green")), ("size", _SIZES)], (20, 70)),
    _t("fashion", "yoga pants", "Clothing, Shoes & Jewelry › Women › Clothing › Active › Leggings",
       "high waist, tummy control, four way stretch, moisture wicking, with pockets",
       [("color", ("black", "navy", "grey", "blue")), ("size", _SIZES)], (15, 60)),
    _t("fashion", "winter boots", "Clothing, Shoes & Jewelry › Women › Shoes › Boots › Snow Boots",
       "waterproof, faux fur lining, anti slip, warm, lace up",
       [("color", ("black", "brown", "grey")), ("size", _SHOE)], (40, 180)),
    _t("fashion", "leather wallet", "Clothing, Shoes & Jewelry › Men › Accessories › Wallets, Card Cases",
       "rfid blocking, genuine leather, slim, bifold, gift box",
       [("color", ("black", "brown", "navy"))], (15, 80)),
    _t("grocery", "green tea", "Grocery & Gourmet Food › Beverages › Tea › Green Tea",
       "organic, gluten free, non gmo, individually wrapped, antioxidant rich",
       [("flavor name", ("jasmine", "mint", "lemon", "original")), ("size", ("20 count", "40 count", "100 count"))],
       (5, 30)),
    _t("grocery", "coffee beans", "Grocery & Gourmet Food › Beverages › Coffee › Whole Coffee Beans",
       "whole bean, medium roast, fair trade, organic, kosher",
       [("size", ("12 ounce", "2 pound", "5 pound"))], (10, 60)),
    _t("grocery", "protein bars", "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars",
       "gluten free, high protein, low sugar, keto friendly, non gmo",
       [("flavor name", ("chocolate", "peanut butter", "cookie dough", "vanilla")), ("size", ("12 count", "24 count"))],
       (15, 45)),
    _t("grocery", "olive oil", "Grocery & Gourmet Food › Pantry Staples › Cooking Oils › Olive Oils",
       "extra virgin, cold pressed, non gmo, kosher, glass bottle",
       [("size", ("16.9 fl oz", "33.8 fl oz", "101 fl oz"))], (8, 50)),
    _t("grocery", "dark chocolate", "Grocery & Gourmet Food › Candy & Chocolate › Chocolate › Chocolate Bars",
       "sugar free, gluten free, individually wrapped, keto friendly, fair trade",
       [("size", ("3 ounce", "6 pack", "12 pack"))], (5, 40)),
    _t("grocery", "trail mix", "Grocery & Gourmet Food › Snack Foods › Trail Mix",
       "non gmo, gluten free, resealable bag, high protein, no artificial flavors",
       [("size", ("1 pound", "2 pound", "3 pound"))], (6, 30)),
)

BRANDS: tuple[str, ...] = tuple(
    """Aurora Brightway Cedarline Dovetail Evermore Fablehaus Glimmer Harborline Ironwood Juniper Kestrel
    Lumina Marlowe Northpeak Oakridge Pinecrest Quillon Riverton Solstice Tidewell Umbra Vantage Willowby
    Xenith Yardley Zephyr Amberly Bluecrest Coralia Driftwood Emberly Foxglove Granite Hollis Islay Jadeport
    Kinsley Larkspur Meridian Nimbus""".split()  # noqa: SIM905
)
CLOSINGS: dict[str, tuple[str, ...]] = {
    "beauty": ("Dermatologist tested for daily use.", "Gentle formula for all skin types.",
               "A salon quality result at home."),
    "electronics": ("Backed by a one year warranty.", "Works with most devices.", "Plug and play setup."),
    "garden": ("Brightens any room in your home.", "Built to last through every season.",
               "Easy to assemble in minutes."),
    "fashion": ("Comfortable enough to wear all day.", "A versatile everyday essential.",
                "True to size with a modern fit."),
    "grocery": ("Packed fresh for great taste.", "A wholesome choice for the whole family.",
                "Sourced from trusted farms."),
}
BENEFITS: tuple[str, ...] = ("made for everyday use", "quality you can feel", "designed with care",
                             "tested for reliability", "loved by customers")
INSTRUCTION_TEMPLATES: tuple[str, ...] = (
    "i am looking for {type} that is {attrs}", "i need {attrs} {type}", "find me {attrs} {type}",
    "i want {type} that are {attrs}", "i'm looking for {attrs} {type}",
)
CATEGORIES: tuple[str, ...] = ("beauty", "electronics", "garden", "fashion", "grocery")

_ASIN_MOD = 36 ** 8
_ASIN_MUL = 2_654_435_761  # odd, not a multiple of 3: a bijection modulo 36**8
_ASIN_ADD = 1_234_567_891
_ASIN_INV = pow(_ASIN_MUL, -1, _ASIN_MOD)
_B36 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def asin_for(index: int) -> str:
    """A 10-character ASIN-like id, a bijection of the index (so no lookup table is needed)."""
    v = (index * _ASIN_MUL + _ASIN_ADD) % _ASIN_MOD
    digits = []
    for _ in range(8):
        v, r = divmod(v, 36)
        digits.append(_B36[r])
    return "B0" + "".join(reversed(digits))


def index_for(asin: str) -> int | None:
    if len(asin) != 10 or not asin.startswith("B0"):
        return None
    v = 0
    for ch in asin[2:]:
        d = _B36.find(ch)
        if d < 0:
            return None
        v = v * 36 + d
    return ((v - _ASIN_ADD) * _ASIN_INV) % _ASIN_MOD


def _join_attrs(attrs: Sequence[str]) -> str:
    if len(attrs) <= 1:
        return "".join(attrs)
    return ", ".join(attrs[:-1]) + " and " + attrs[-1]


def _title_case(text: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))


def _popcount8(x: np.ndarray) -> np.ndarray:
    return np.unpackbits(x.astype(np.uint8)[..., None], axis=-1).sum(-1)


class _Tables:
    """Per-type lookup arrays shared by generation, rendering and indexing."""

    def __init__(self, types: Sequence[ProductType]):
        self.types = tuple(types)
        n = len(types)
        self.n_attr_pool = np.array([len(t.attributes) for t in types])
        self.n_slots = np.array([len(t.options) for t in types])
        self.n_opt_pool = np.zeros((n, MAX_OPTION_SLOTS), dtype=np.int64)
        for i, t in enumerate(types):
            assert len(t.attributes) >= MAX_ATTRS and len(t.options) <= MAX_OPTION_SLOTS
            for j, (_, values) in enumerate(t.options):
                assert 2 <= len(values) <= MAX_OPTION_VALUES
                self.n_opt_pool[i, j] = len(values)
        self.price_lo = np.array([t.price[0] for t in types], dtype=np.float64)
        self.price_hi = np.array([t.price[1] for t in types], dtype=np.float64)
        self.category_of = np.array([CATEGORIES.index(t.category) for t in types])
        self.attr_offset = np.concatenate([[0], np.cumsum(self.n_attr_pool)[:-1]])


@dataclass(frozen=True)
class _Columns:
    type: np.ndarray  # int16 (N,)
    brand: np.ndarray  # int16 (N,)
    attrs: np.ndarray  # int8 (N, MAX_ATTRS) indices into the type's attribute pool
    n_attrs: np.ndarray  # int8 (N,)
    n_ins: np.ndarray  # int8 (N,) instruction attributes = the first n_ins product attributes
    template: np.ndarray  # int8 (N,)
    closing: np.ndarray  # int8 (N,)
    opt_mask: np.ndarray  # uint8 (N, MAX_OPTION_SLOTS) bit v set = pool value v offered
    price_lo: np.ndarray  # int32 cents
    price_hi: np.ndarray  # int32 cents, 0 = single price
    price: np.ndarray  # float64 drawn price


def _random_subsets(rng: np.random.Generator, pool_sizes: np.ndarray, width: int) -> np.ndarray:
    """Per row, a random ordering of range(pool_size) (padding positions sort last)."""
    keys = rng.random((len(pool_sizes), width))
    keys[np.arange(width)[None, :] >= pool_sizes[:, None]] = 2.0
    return np.argsort(keys, axis=1)


def _generate(num_products: int, seed: int, tables: _Tables) -> _Columns:
    rng = np.random.default_rng([seed, GENERATOR_VERSION])
    n = num_products
    ptype = rng.integers(0, len(tables.types), n)
    brand = rng.integers(0, len(BRANDS), n)
    attrs = _random_subsets(rng, tables.n_attr_pool[ptype], int(tables.n_attr_pool.max()))[:, :MAX_ATTRS]
    n_attrs = 3 + rng.integers(0, 2, n)
    n_ins = np.minimum(1 + rng.integers(0, 3, n), n_attrs)
    template = rng.integers(0, len(INSTRUCTION_TEMPLATES), n)
    closing = rng.integers(0, 3, n)
    has_options = rng.random(n) < 0.85
    opt_mask = np.zeros((n, MAX_OPTION_SLOTS), dtype=np.uint8)
    for j in range(MAX_OPTION_SLOTS):
        pool = tables.n_opt_pool[ptype, j]
        present = has_options & (pool > 0)
        count = 2 + (rng.random(n) * (np.minimum(pool, 4) - 1)).astype(np.int64)
        order = _random_subsets(rng, np.maximum(pool, 1), MAX_OPTION_VALUES)
        chosen = np.arange(MAX_OPTION_VALUES)[None, :] < count[:, None]
        bits = np.where(chosen, np.left_shift(1, order), 0).sum(axis=1)
        opt_mask[:, j] = np.where(present, bits, 0)
    lo = np.round(tables.price_lo[ptype] + rng.random(n) * (tables.price_hi[ptype] - tables.price_lo[ptype]), 2)
    lo_cents = np.maximum(np.round(lo * 100), 1).astype(np.int32)
    ranged = rng.random(n) < 0.25
    hi_cents = np.where(ranged, np.round(lo_cents * (1.1 + 0.5 * rng.random(n))), 0).astype(np.int32)
    draw = rng.random(n)
    price = np.where(ranged, lo_cents / 100 + draw * (hi_cents - lo_cents) / 100, lo_cents / 100)
    return _Columns(ptype.astype(np.int16), brand.astype(np.int16), attrs.astype(np.int8),
                    n_attrs.astype(np.int8), n_ins.astype(np.int8), template.astype(np.int8),
                    closing.astype(np.int8), opt_mask, lo_cents, hi_cents, price)


class SyntheticCatalog:
    """A column-stored catalog; ``catalog[i]`` renders product ``i`` (cached)."""

    def __init__(self, num_products: int, seed: int = 0, types: Sequence[ProductType] = PRODUCT_TYPES):
        if num_products < 1:
            raise ValueError(f"num_products must be >= 1, got {num_products}")
        if num_products > _ASIN_MOD:
            raise ValueError(f"num_products must be <= {_ASIN_MOD}")
        self.num_products = int(num_products)
        self.seed = int(seed)
        self.tables = _Tables(types)
        self.cols = _generate(self.num_products, self.seed, self.tables)
        self._product = lru_cache(maxsize=4096)(self._render)

    def __len__(self) -> int:
        return self.num_products

    def __getitem__(self, index: int) -> Product:
        if not -self.num_products <= index < self.num_products:
            raise IndexError(index)
        return self._product(int(index) % self.num_products)

    def __iter__(self) -> Iterator[Product]:
        return (self[i] for i in range(self.num_products))

    def index_of(self, asin: str) -> int | None:
        i = index_for(asin)
        return i if i is not None and i < self.num_products else None

    def fingerprint(self) -> str:
        return f"synthetic-v{GENERATOR_VERSION}-{self.num_products}-{self.seed}"

    # ---------------------------------------------------------------------------- rendering
    def _option_values(self, i: int) -> dict[str, list[str]]:
        t = self.tables.types[self.cols.type[i]]
        out = {}
        for j, (name, pool) in enumerate(t.options):
            mask = int(self.cols.opt_mask[i, j])
            if mask:
                out[name] = [v for b, v in enumerate(pool) if mask >> b & 1]
        return out

    def _product_attrs(self, i: int) -> list[str]:
        t = self.tables.types[self.cols.type[i]]
        return [t.attributes[k] for k in self.cols.attrs[i, : self.cols.n_attrs[i]]]

    def _render(self, i: int) -> Product:
        c = self.cols
        t = self.tables.types[c.type[i]]
        brand = BRANDS[c.brand[i]]
        attrs = self._product_attrs(i)
        ins = attrs[: c.n_ins[i]]
        title = f"{brand} {_title_case(t.name)}, {_title_case(attrs[0])}, {_title_case(attrs[1])}"
        description = f"This {t.name} by {brand} is {', '.join(attrs)}. {CLOSINGS[t.category][c.closing[i]]}"
        first_benefit = BENEFITS[(int(c.type[i]) + int(c.attrs[i, 0])) % len(BENEFITS)]
        bullets = (f"{attrs[0].capitalize()} {t.name} {first_benefit}",
                   *(f"{a.capitalize()}" for a in attrs[1:]), f"Brand: {brand}")
        lo = int(c.price_lo[i]) / 100
        if c.price_hi[i]:
            hi = int(c.price_hi[i]) / 100
            pricing, tag = (lo, hi), f"${lo} to ${hi}"
        else:
            pricing, tag = (lo,), f"${lo}"
        instruction = INSTRUCTION_TEMPLATES[c.template[i]].format(type=t.name, attrs=_join_attrs(ins))
        return Product(
            asin=asin_for(i), name=title, title=title, description=description, bullet_points=bullets,
            pricing=pricing, price_tag=tag, options=self._option_values(i), attributes=tuple(attrs),
            category=t.category, query=t.name, product_category=t.path, main_image=None,
            instruction_text=instruction, instruction_attributes=tuple(ins),
        )

    # ----------------------------------------------------------------------------- filters
    def indices_where(self, field: str, value: str) -> list[int]:
        ptype = self.cols.type
        if field == "category":
            types = [k for k, t in enumerate(self.tables.types) if t.category == value]
            mask = np.isin(ptype, types)
        elif field == "query":
            types = [k for k, t in enumerate(self.tables.types) if t.name == value]
            mask = np.isin(ptype, types)
        elif field == "attribute":
            mask = np.zeros(self.num_products, dtype=bool)
            present = np.arange(MAX_ATTRS)[None, :] < self.cols.n_attrs[:, None]
            for k, t in enumerate(self.tables.types):
                if value in t.attributes:
                    hit = ((self.cols.attrs == t.attributes.index(value)) & present).any(axis=1)
                    mask |= (ptype == k) & hit
        else:
            raise ValueError(f"field must be 'category', 'query' or 'attribute', got {field!r}")
        return np.flatnonzero(mask).tolist()

    # ---------------------------------------------------------------------------- indexing
    def _fragment_table(self) -> tuple[dict[str, int], np.ndarray, dict]:
        """Analyze every table string once: fragment id -> padded term ids."""
        vocab: dict[str, int] = {}
        frags: list[list[int]] = []
        ids: dict = {}

        def add(key, text: str) -> None:
            ids[key] = len(frags)
            frags.append([vocab.setdefault(term, len(vocab)) for term in analyze(text)])

        for b, name in enumerate(BRANDS):
            add(("brand", b), name)
        for e, benefit in enumerate(BENEFITS):
            add(("benefit", e), benefit)
        for k, t in enumerate(self.tables.types):
            add(("type", k), t.name)
            for a, attr in enumerate(t.attributes):
                add(("attr", k, a), attr)
            for c, closing in enumerate(CLOSINGS[t.category]):
                add(("closing", k, c), closing)
            for j, (name, pool) in enumerate(t.options):
                add(("optname", k, j), name)
                for v, value in enumerate(pool):
                    add(("optvalue", k, j, v), value)
        width = max(1, max(len(f) for f in frags))
        table = np.full((len(frags) + 1, width), -1, dtype=np.int32)  # last row = empty fragment
        for f, terms in enumerate(frags):
            table[f, : len(terms)] = terms
        return vocab, table, ids

    def _fragment_ids(self, rows: np.ndarray, ids: dict, empty: int) -> np.ndarray:
        """(rows, slots) fragment ids of each document's index text, in text order."""
        c, tables = self.cols, self.tables
        ptype = c.type[rows].astype(np.int64)
        n_types = len(tables.types)

        def lut(kind, shape):
            arr = np.full(shape, empty, dtype=np.int64)
            for key, f in ids.items():
                if key[0] == kind:
                    arr[key[1:]] = f
            return arr

        brand = lut("brand", (len(BRANDS),))[c.brand[rows]]
        typ = lut("type", (n_types,))[ptype]
        attr_lut = lut("attr", (n_types, int(tables.n_attr_pool.max())))
        attrs = attr_lut[ptype[:, None], c.attrs[rows].astype(np.int64)]
        attrs[np.arange(MAX_ATTRS)[None, :] >= c.n_attrs[rows][:, None]] = empty
        closing = lut("closing", (n_types, 3))[ptype, c.closing[rows]]
        benefit = lut("benefit", (len(BENEFITS),))[(ptype + c.attrs[rows, 0]) % len(BENEFITS)]
        # title: brand type attr0 attr1 | description: type brand attrs closing | bullet 0: attr0 type benefit
        slots = [brand, typ, attrs[:, 0], attrs[:, 1], typ, brand, *attrs.T, closing, attrs[:, 0], typ, benefit]
        optname = lut("optname", (n_types, MAX_OPTION_SLOTS))
        optvalue = lut("optvalue", (n_types, MAX_OPTION_SLOTS, MAX_OPTION_VALUES))
        for j in range(MAX_OPTION_SLOTS):
            mask = c.opt_mask[rows, j]
            slots.append(np.where(mask > 0, optname[ptype, j], empty))
            for v in range(MAX_OPTION_VALUES):
                slots.append(np.where((mask >> v) & 1, optvalue[ptype, j, v], empty))
        return np.stack(slots, axis=1)

    def build_search_engine(self) -> SearchEngine:
        """BM25 index from the columns: chunked gathers, then chunks merged into CSC order by counting.

        Each chunk's unique (term, document) pairs come out of ``np.unique`` term-major; since later
        chunks hold later documents, a term's postings are chunk 0's, then chunk 1's, ... so every chunk
        is scattered to its final place with per-term offsets and nothing global is sorted.
        """
        vocab, table, ids = self._fragment_table()
        empty = len(table) - 1
        n, n_vocab = self.num_products, len(vocab)
        doc_len = np.zeros(n, dtype=np.int32)
        chunks = []
        for start in range(0, n, CHUNK):
            rows = np.arange(start, min(start + CHUNK, n))
            tokens = table[self._fragment_ids(rows, ids, empty)].reshape(len(rows), -1)
            valid = tokens >= 0
            doc_len[rows] = valid.sum(axis=1)
            flat = np.flatnonzero(valid)
            keys, tf = np.unique(tokens.ravel()[flat].astype(np.int64) * len(rows) + flat // tokens.shape[1],
                                 return_counts=True)
            term = (keys // len(rows)).astype(np.int32)
            chunks.append((term, (keys % len(rows) + start).astype(np.int32), tf.astype(np.uint16),
                           np.bincount(term, minlength=n_vocab)))
        df = np.sum([c[3] for c in chunks], axis=0)
        indptr = np.concatenate([[0], np.cumsum(df)])
        post_doc = np.empty(int(df.sum()), dtype=np.int32)
        post_tf = np.empty(int(df.sum()), dtype=np.uint16)
        offset = indptr[:-1].copy()  # where the next chunk's postings of each term go
        for term, docs, tf, counts in chunks:
            local_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
            dest = (offset - local_start)[term] + np.arange(len(term))
            post_doc[dest] = docs
            post_tf[dest] = tf
            offset += counts
        del chunks
        return SearchEngine.from_csc(post_doc, post_tf, df, doc_len, vocab)

    # ------------------------------------------------------------------------------ raw files
    def raw_record(self, i: int) -> tuple[dict, dict]:
        """Product ``i`` in WebShop's raw scrape schema, and its ``items_ins_v2`` entry."""
        p = self[i]
        t = self.tables.types[self.cols.type[i]]
        pricing = " - ".join(f"${v:.2f}" for v in p.pricing)
        options = {name.title(): [{"value": _title_case(v), "image": None} for v in values]
                   for name, values in p.options.items()}
        raw = {
            "asin": p.asin, "name": p.name, "full_description": p.description,
            "small_description": list(p.bullet_points), "pricing": pricing,
            "customization_options": options or "", "product_category": t.path, "category": t.category,
            "query": t.name, "images": [], "average_rating": "", "page": 1 + i // 16,
        }
        ins = {"attributes": list(p.attributes), "instruction": p.instruction_text,
               "instruction_attributes": list(p.instruction_attributes or ())}
        return raw, ins

    def write_raw(self, directory: str | os.PathLike, name: str = "synthetic") -> tuple[Path, Path]:
        """Write ``items_shuffle_<name>.json`` and ``items_ins_v2_<name>.json`` (streamed)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        products_path = directory / f"items_shuffle_{name}.json"
        ins_path = directory / f"items_ins_v2_{name}.json"
        with products_path.open("w") as fp, ins_path.open("w") as fi:
            fp.write("[")
            fi.write("{")
            for i in range(self.num_products):
                raw, ins = self.raw_record(i)
                sep = "," if i else ""
                fp.write(sep + json.dumps(raw))
                fi.write(f"{sep}{json.dumps(raw['asin'])}: {json.dumps(ins)}")
            fp.write("]")
            fi.write("}")
        return products_path, ins_path


class SyntheticGoals(Sequence):
    """Goals of a synthetic catalog: one per product x option combination, in a seeded order.

    Stored as two arrays (product, combination); ``goals[k]`` builds the :class:`Goal`.
    """

    def __init__(self, catalog: SyntheticCatalog, seed: int):
        self.catalog = catalog
        c, tables = catalog.cols, catalog.tables
        rng = np.random.default_rng([seed, GENERATOR_VERSION, 233])
        counts = np.where(c.opt_mask > 0, _popcount8(c.opt_mask), 1).prod(axis=1).astype(np.int64)
        # WebShop's ceiling: larger of two distinct draws among the first four $10 steps above the price.
        first = np.floor(c.price / 10).astype(np.int64) + 1
        n_steps = np.clip(99 - first + 1, 0, 4)
        a = rng.integers(0, np.maximum(n_steps, 1))
        b = rng.integers(0, np.maximum(n_steps - 1, 1))
        b = b + (b >= a)
        self.price_upper = np.where(n_steps >= 2, 10.0 * (first + np.maximum(a, b)), NO_CEILING)
        total = int(counts.sum())
        order = rng.permutation(total)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        product = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        combo = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
        self.goal_product = product[order].astype(np.int32)
        self.goal_combo = combo[order].astype(np.int32)
        # WebShop's sampling weight: mean over a goal's attributes of 1 / (#goals with that attribute).
        ins_ids = tables.attr_offset[c.type.astype(np.int64)][:, None] + c.attrs.astype(np.int64)
        ins_mask = np.arange(MAX_ATTRS)[None, :] < c.n_ins[:, None]
        self.attr_goal_counts = np.bincount(ins_ids[ins_mask], weights=np.broadcast_to(
            counts[:, None], ins_ids.shape)[ins_mask], minlength=int(tables.n_attr_pool.sum()))
        self._goal = lru_cache(maxsize=4096)(self._render)

    def __len__(self) -> int:
        return len(self.goal_product)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if not -len(self) <= k < len(self):
            raise IndexError(k)
        return self._goal(int(k) % len(self))

    def _render(self, k: int) -> Goal:
        i = int(self.goal_product[k])
        product = self.catalog[i]
        combo = int(self.goal_combo[k])
        chosen: dict[str, str] = {}
        names = sorted(product.options)
        for name in reversed(names):  # itertools.product order: the last name varies fastest
            values = product.options[name]
            combo, r = divmod(combo, len(values))
            chosen[name] = values[r]
        chosen = {name: chosen[name] for name in names}
        upper = float(self.price_upper[i])
        price_text = f", and price lower than {upper:.2f} dollars" if upper != NO_CEILING else ""
        c, tables = self.catalog.cols, self.catalog.tables
        offs = tables.attr_offset[int(c.type[i])]
        ids = [offs + int(a) for a in c.attrs[i, : c.n_ins[i]]]
        weight = float(np.mean([1.0 / self.attr_goal_counts[j] for j in ids]))
        return Goal(
            asin=product.asin, product_index=i,
            instruction_text=f"{product.instruction_text}{option_text(chosen)}{price_text}",
            attributes=tuple(product.instruction_attributes or ()), goal_options=chosen, price_upper=upper,
            category=product.category, query=product.query, name=product.title,
            product_category=product.product_category, weight=weight,
        )


def default_synthetic_splits(num_goals: int) -> list[tuple[str, int]]:
    """WebShop's 500 / 1000 when there are enough goals, else 10% test and 10% eval."""
    if num_goals >= 5000:
        return [("test", 500), ("eval", 1000)]
    tenth = max(1, num_goals // 10)
    return [("test", tenth), ("eval", tenth)]


def synthetic_shop(num_products: int = 300, seed: int = 0, *, splits=None,
                   cache_dir: str | os.PathLike | None | bool = None) -> Shop:
    """A synthetic Shop (catalog, prices, goals, splits, search engine), deterministic in ``seed``."""
    catalog = SyntheticCatalog(num_products, seed)
    goals = SyntheticGoals(catalog, seed)
    engine = get_engine(catalog.fingerprint(), catalog.build_search_engine, len(catalog), cache_dir)
    sizes = default_synthetic_splits(len(goals)) if splits is None else splits
    return Shop(catalog=catalog, prices=catalog.cols.price, goals=goals, splits=make_splits(len(goals), sizes),
                engine=engine, name=f"synthetic:{num_products}:{seed}",
                source={"synthetic": True, "num_products": num_products, "seed": seed})
