"""Products and WebShop's data files: the raw scrape, attribute/instruction files, human instructions,
and the processed JSONL of ../shared/webshop_small.

Products are normalized exactly as WebShop's ``load_products`` does (Title = name, BulletPoints =
small_description as a list, parsed pricing and its ``$X`` / ``$X to $Y`` tag, lower-cased options with
``/`` -> `` | ``, Attributes from the attribute file or ``DUMMY_ATTR``, lower-cased stripped query; ASINs
that are ``nan``, longer than 10 characters or repeated are skipped). Every problem raises
:class:`DataError` naming the file, the record and the field.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import DataError
from .normalize import index_text, normalize_options, parse_pricing

DUMMY_ATTR = "DUMMY_ATTR"


@dataclass(frozen=True, slots=True)
class Product:
    """One catalog product in WebShop's engine form (the fields pages, search and reward read)."""

    asin: str
    name: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    pricing: tuple[float, ...]
    price_tag: str
    options: dict[str, list[str]]
    attributes: tuple[str, ...]
    category: str
    query: str
    product_category: str
    main_image: str | None = None
    rating: str = "N.A."
    reviews: tuple[dict, ...] = ()
    instruction_text: str | None = None
    instruction_attributes: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def index_text(self) -> str:
        """The lower-cased text WebShop's search index holds for this product."""
        return index_text(self.title, self.description, self.bullet_points, self.options)

    def to_engine_dict(self) -> dict[str, Any]:
        """WebShop's in-memory product dict (keys as its engine and templates use them)."""
        return {
            "asin": self.asin, "name": self.name, "Title": self.title, "Description": self.description,
            "BulletPoints": list(self.bullet_points), "pricing": list(self.pricing), "Price": self.price_tag,
            "options": {k: list(v) for k, v in self.options.items()}, "Attributes": list(self.attributes),
            "category": self.category, "query": self.query, "product_category": self.product_category,
            "MainImage": self.main_image, "Rating": self.rating, "Reviews": list(self.reviews),
        }


# ---------------------------------------------------------------------------------------------- helpers

def open_data(path: str | os.PathLike, mode: str = "rb"):
    """Open a data file; names ending in ``.gz`` are read through gzip (the packaged data is compressed)."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, mode if "b" in mode else "rt", encoding=None if "b" in mode else "utf-8")
    return path.open(mode, encoding=None if "b" in mode else "utf-8")


def read_json(path: str | os.PathLike) -> Any:
    """Load a JSON file, turning a missing file or a syntax error into a DataError naming the file."""
    path = Path(path)
    try:
        with open_data(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(str(path), f"not valid JSON ({e})") from None
    except (OSError, EOFError, zlib.error) as e:  # a corrupt .gz: BadGzipFile (OSError), EOFError, zlib.error
        raise DataError(str(path), f"cannot read ({e})") from None


def _text(value, file: str, record: str, name: str, *, required: bool = True) -> str:
    if value is None:
        if required:
            raise DataError(file, "missing", record=record, field=name)
        return ""
    if not isinstance(value, str):
        raise DataError(file, f"expected a string, got {type(value).__name__}", record=record, field=name)
    return value


def _str_list(value, file: str, record: str, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DataError(file, "expected a list of strings", record=record, field=name)
    return value


def _require(obj: Mapping, key: str, file: str, record: str):
    if key not in obj:
        raise DataError(file, "missing", record=record, field=key)
    return obj[key]


def _skip_asin(asin: str, seen: set[str]) -> bool:
    """WebShop's filter: drop 'nan', over-long and repeated ASINs."""
    if asin == "nan" or len(asin) > 10 or asin in seen:
        return True
    seen.add(asin)
    return False


# ---------------------------------------------------------------------------------- attribute files

def _asin_map(path: str | os.PathLike, values: str) -> tuple[dict[str, Any], str]:
    """A JSON file holding one object keyed by ASIN (and the file's name for errors)."""
    data = read_json(path)
    file = str(path)
    if not isinstance(data, dict):
        raise DataError(file, f"expected an object mapping ASIN to {values}, got {type(data).__name__}")
    return data, file


def load_attribute_file(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """``items_ins_v2*.json``: ASIN -> {attributes, instruction?, instruction_attributes?}, validated."""
    data, file = _asin_map(path, "entries")
    for asin, entry in data.items():
        if not isinstance(entry, dict):
            raise DataError(file, "expected an object", record=asin)
        if "attributes" in entry:
            _str_list(entry["attributes"], file, asin, "attributes")
        if entry.get("instruction") is not None:
            _text(entry["instruction"], file, asin, "instruction")
            _str_list(_require(entry, "instruction_attributes", file, asin), file, asin, "instruction_attributes")
    return data


def load_human_instructions(path: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    """``items_human_ins.json``: ASIN -> [{instruction, instruction_attributes, instruction_options}]."""
    data, file = _asin_map(path, "lists")
    for asin, entries in data.items():
        if not isinstance(entries, list):
            raise DataError(file, "expected a list of instructions", record=asin)
        for j, entry in enumerate(entries):
            rec = f"{asin}[{j}]"
            if not isinstance(entry, dict):
                raise DataError(file, "expected an object", record=rec)
            _text(_require(entry, "instruction", file, rec), file, rec, "instruction")
            _str_list(_require(entry, "instruction_attributes", file, rec), file, rec, "instruction_attributes")
            opts = entry.get("instruction_options", [])
            if isinstance(opts, dict):
                opts = list(opts.values())
            _str_list(opts, file, rec, "instruction_options")
    return data


def _attach_attributes(attrs_entry: Mapping | None, fallback: Sequence[str]) -> tuple[tuple[str, ...], str | None,
                                                                                      tuple[str, ...] | None]:
    if attrs_entry is not None and "attributes" in attrs_entry:
        attributes = tuple(attrs_entry["attributes"])
    else:
        attributes = tuple(fallback)
    instruction = attrs_entry.get("instruction") if attrs_entry is not None else None
    ins_attrs = attrs_entry.get("instruction_attributes") if instruction is not None else None
    return attributes, instruction, (tuple(ins_attrs) if ins_attrs is not None else None)


# ------------------------------------------------------------------------------------ raw products

def product_from_raw(raw: Mapping, attributes: Mapping[str, Mapping] | None, *, file: str, record: str) -> Product:
    """Normalize one raw scraped record (``items_shuffle*.json``) the way WebShop's loader does."""
    if not isinstance(raw, Mapping):
        raise DataError(file, f"expected an object, got {type(raw).__name__}", record=record)
    asin = _text(_require(raw, "asin", file, record), file, record, "asin")
    record = f"{record} ({asin})"
    name = _text(_require(raw, "name", file, record), file, record, "name")
    description = _text(_require(raw, "full_description", file, record), file, record, "full_description",
                        required=False)
    small = _require(raw, "small_description", file, record)
    if isinstance(small, list):
        bullets = tuple(_str_list(small, file, record, "small_description"))
    else:
        bullets = (_text(small, file, record, "small_description", required=False),)
    pricing, tag = parse_pricing(raw.get("pricing"), file=file, record=record)
    options = normalize_options(_require(raw, "customization_options", file, record), file=file, record=record)
    images = raw.get("images") or []
    if not isinstance(images, list):
        raise DataError(file, "expected a list", record=record, field="images")
    entry = attributes.get(asin) if attributes is not None else None
    attrs, instruction, ins_attrs = _attach_attributes(entry, [DUMMY_ATTR])
    return Product(
        asin=asin, name=name, title=name, description=description, bullet_points=bullets,
        pricing=tuple(pricing), price_tag=tag, options=options, attributes=attrs,
        category=_text(_require(raw, "category", file, record), file, record, "category"),
        query=_text(_require(raw, "query", file, record), file, record, "query").lower().strip(),
        product_category=_text(_require(raw, "product_category", file, record), file, record,
                               "product_category", required=False),
        main_image=images[0] if images else None,
        instruction_text=instruction, instruction_attributes=ins_attrs,
    )


def load_raw_products(path: str | os.PathLike, attributes: Mapping[str, Mapping] | None = None,
                      num_products: int | None = None) -> list[Product]:
    """``items_shuffle*.json`` (a JSON list) -> products, first ``num_products`` records only."""
    data = read_json(path)
    file = str(path)
    if not isinstance(data, list):
        raise DataError(file, f"expected a JSON list of products, got {type(data).__name__}")
    if num_products is not None:
        data = data[:num_products]
    products, seen = [], set()
    for i, raw in enumerate(data):
        product = product_from_raw(raw, attributes, file=file, record=str(i))
        if not _skip_asin(product.asin, seen):
            products.append(product)
    return products


# ------------------------------------------------------------------------------ processed JSONL

def _product_from_processed(obj: Mapping, attributes: Mapping[str, Mapping] | None, *, file: str,
                            record: str) -> tuple[Product, str | None]:
    if not isinstance(obj, Mapping):
        raise DataError(file, f"expected an object, got {type(obj).__name__}", record=record)
    p = _require(obj, "product", file, record)
    if not isinstance(p, Mapping):
        raise DataError(file, "expected an object", record=record, field="product")
    asin = _text(p.get("asin", obj.get("id")), file, record, "product.asin")
    record = f"{record} ({asin})"

    def txt(key: str, required: bool = True) -> str:
        return _text(p.get(key), file, record, f"product.{key}", required=required)

    bullets = p.get("BulletPoints")
    if not isinstance(bullets, list) or not all(isinstance(b, str) for b in bullets):
        raise DataError(file, "expected a list of strings", record=record, field="product.BulletPoints")
    options = p.get("options")
    if not isinstance(options, Mapping) or not all(
        isinstance(v, list) and all(isinstance(x, str) for x in v) for v in options.values()
    ):
        raise DataError(file, "expected an object of string lists", record=record, field="product.options")
    pricing, tag = parse_pricing(p.get("pricing"), file=file, record=record)
    price_tag = p.get("Price", tag)
    if not isinstance(price_tag, str):
        raise DataError(file, "expected a string", record=record, field="product.Price")
    fallback_attrs = p.get("Attributes", [DUMMY_ATTR])
    _str_list(fallback_attrs, file, record, "product.Attributes")
    entry = attributes.get(asin) if attributes is not None else None
    attrs, instruction, ins_attrs = _attach_attributes(entry, fallback_attrs)
    if instruction is None and p.get("instruction_text") is not None:
        instruction = txt("instruction_text")
        ins_attrs = tuple(_str_list(p.get("instruction_attributes"), file, record, "product.instruction_attributes"))
    reviews = p.get("Reviews") or []
    if not isinstance(reviews, list):
        raise DataError(file, "expected a list", record=record, field="product.Reviews")
    contents = obj.get("contents")
    if contents is not None and not isinstance(contents, str):
        raise DataError(file, "expected a string", record=record, field="contents")
    product = Product(
        asin=asin, name=txt("name", required=False) or txt("Title"), title=txt("Title"),
        description=txt("Description", required=False), bullet_points=tuple(bullets), pricing=tuple(pricing),
        price_tag=price_tag, options={str(k): list(v) for k, v in options.items()}, attributes=attrs,
        category=txt("category"), query=txt("query").lower().strip(),
        product_category=txt("product_category", required=False),
        main_image=p.get("MainImage"), rating=str(p.get("Rating", "N.A.")), reviews=tuple(reviews),
        instruction_text=instruction, instruction_attributes=ins_attrs,
    )
    return product, contents


def _numbered_lines(f, file: str):
    """Lines with 1-based numbers; undecodable bytes become a DataError naming the file."""
    lineno = 0
    try:
        for lineno, line in enumerate(f, start=1):  # noqa: B007 - lineno is read in the except
            yield lineno, line
    except UnicodeDecodeError as e:
        raise DataError(file, f"not UTF-8 text ({e})", record=f"line {lineno + 1}") from None
    except (OSError, EOFError, zlib.error) as e:  # a corrupt or truncated .gz
        raise DataError(file, f"cannot read ({e})", record=f"line {lineno + 1}") from None


def load_processed_jsonl(path: str | os.PathLike, attributes: Mapping[str, Mapping] | None = None,
                         num_products: int | None = None) -> tuple[list[Product], list[str]]:
    """Processed JSONL (``{"id", "contents", "product"}`` a line) -> (products, index texts).

    The ``contents`` field is WebShop's own index text; lines without it get the derived text.
    """
    file = str(path)
    products: list[Product] = []
    texts: list[str] = []
    seen: set[str] = set()
    try:
        f = open_data(path, "r")  # closed by the with below; open errors are named here
    except FileNotFoundError:
        raise DataError(file, "file not found") from None
    except OSError as e:
        raise DataError(file, f"cannot read ({e})") from None
    with f:
        for lineno, line in _numbered_lines(f, file):
            if num_products is not None and lineno > num_products:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(file, f"not valid JSON ({e})", record=f"line {lineno}") from None
            product, contents = _product_from_processed(obj, attributes, file=file, record=f"line {lineno}")
            if _skip_asin(product.asin, seen):
                continue
            products.append(product)
            texts.append(contents if contents is not None else product.index_text())
    return products, texts
