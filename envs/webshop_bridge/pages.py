"""WebShop's pages as text-mode observations, without rendering or parsing HTML.

WebShop renders Jinja templates and flattens them with BeautifulSoup: the observation is every visible
text node, stripped, joined with `` [SEP] ``. A template field that renders empty makes no node; one that
is only ASCII whitespace becomes an empty entry, or nothing if it holds a newline (BeautifulSoup's
whitespace collapsing). :func:`visible` reproduces that per node, and each builder lists a page's
nodes and clickables in template order. Clickables are keyed as WebShop's ``text_to_clickable``:
lower-cased button texts and ASINs, option values as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pprint import pformat

from .data import Product

SEP = " [SEP] "
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
PRODUCTS_PER_PAGE = 10
_ASCII_SPACE = " \n\t\f\r"


@dataclass(frozen=True, slots=True)
class Clickable:
    """What a click key does: a ``button`` (payload = its text), a ``product`` (payload = product index)
    or an ``option`` (payload = option name)."""

    kind: str
    payload: object


@dataclass(slots=True)
class Page:
    kind: str  # 'search' | 'results' | 'item' | 'item_sub' | 'done'
    texts: list[str]
    clickables: dict[str, Clickable] = field(default_factory=dict)
    has_search_bar: bool = False
    sub_page: str | None = None

    @property
    def observation(self) -> str:
        return SEP.join(self.texts)

    def available_actions(self) -> dict:
        return {"has_search_bar": self.has_search_bar, "clickables": list(self.clickables)}


def visible(node: str) -> str | None:
    """A rendered text node as BeautifulSoup text mode shows it (None = no entry)."""
    if node == "":
        return None
    if node.strip(_ASCII_SPACE) == "":
        return None if "\n" in node else ""
    return node.strip()


def _collect(nodes: Sequence[str]) -> list[str]:
    return [v for v in map(visible, nodes) if v is not None]


def _buttons(*labels: str) -> dict[str, Clickable]:
    return {label.lower(): Clickable("button", label) for label in labels}


def search_page(instruction: str) -> Page:
    return Page("search", _collect(["WebShop", "Instruction: ", instruction, "Search"]),
                _buttons("Search"), has_search_bar=True)


def _header(instruction: str) -> list[str]:
    return ["Instruction:", instruction, BACK_TO_SEARCH]


def results_page(instruction: str, page: int, total: int, hits: Sequence[tuple[int, Product]]) -> Page:
    """``hits``: (product index, product) for this page only."""
    nodes = _header(instruction) + [f"Page {page} (Total results: {total})"]
    buttons = [BACK_TO_SEARCH]
    if page > 1:
        nodes.append(PREV_PAGE)
        buttons.append(PREV_PAGE)
    nodes.append(NEXT_PAGE)
    buttons.append(NEXT_PAGE)
    clickables = _buttons(*buttons)
    for idx, product in hits:
        nodes += [product.asin, product.title, product.price_tag]
        clickables[product.asin.lower()] = Clickable("product", idx)
    return Page("results", _collect(nodes), clickables)


def item_page(instruction: str, product: Product, show_attrs: bool = False) -> Page:
    nodes = _header(instruction) + [PREV_PAGE]
    option_clicks: dict[str, Clickable] = {}
    for name, values in product.options.items():
        nodes.append(name)
        for value in values:
            nodes.append(value)
            option_clicks[value] = Clickable("option", name)  # a later radio with the same value wins
    subs = [s for s in SUB_PAGES if s != "Attributes" or show_attrs]
    nodes += [product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}", *subs, BUY_NOW]
    clickables = _buttons(BACK_TO_SEARCH, PREV_PAGE, *subs, BUY_NOW)
    clickables.update(option_clicks)
    return Page("item", _collect(nodes), clickables)


def item_sub_page(instruction: str, product: Product, sub_page: str) -> Page:
    """Description, Features (bullet points), Reviews or Attributes of one product."""
    nodes = _header(instruction) + [PREV_PAGE]
    if sub_page == "Description":
        nodes.append(product.description)
    elif sub_page == "Features":
        nodes += [f" {b}" for b in product.bullet_points]
    elif sub_page == "Reviews":
        for review in product.reviews:
            nodes += [f'"{review.get("title", "")}"', str(review.get("score", "")), str(review.get("body", ""))]
    elif sub_page == "Attributes":
        nodes += [f" {a}" for a in product.attributes]
        nodes += [product.category, product.query, product.product_category]
    else:
        raise ValueError(f"unknown sub page {sub_page!r}")
    return Page("item_sub", _collect(nodes), _buttons(BACK_TO_SEARCH, PREV_PAGE), sub_page=sub_page)


def _tojson(obj) -> str:
    """Flask's ``tojson`` filter: sorted keys, ASCII, HTML-sensitive characters escaped."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("'", "\\u0027"))


def done_page(asin: str, options: Mapping[str, str], reward: float) -> Page:
    """The thank-you page as WebShop's text env renders it (goal/debug fields are passed as None)."""
    nodes = [
        "Thank you for shopping with us!", "Your code: ", "None", " (Paste it in your MTurk interface.)",
        "Purchased", "asin", asin, "options", _tojson(dict(options)), "attrs", "None", "category", "None",
        "query", "None", "product category", "None",
        "Target", "asin", "options", "attrs", "price upper", "instuction text", "category", "product category",
        "query", "Goal", pformat(None), "Reward", "Your score (min 0.0, max 1.0)", str(reward),
        "Reward Details", pformat(None),
    ]
    return Page("done", _collect(nodes), {})
