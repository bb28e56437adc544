"""WebShop's text normalizations: prices, option values, colours and the search-index text.

These decide what an agent sees and how purchases are scored, so each follows WebShop's engine
(web_agent_site/engine/engine.py and normalize.py) exactly; the docstrings say which rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation

# WebShop's colour vocabulary, in its order: normalization returns the *first* listed colour that occurs
# as a substring, so the order decides e.g. "light blue" -> "blue" and "rectangular" -> "tan".
COLOR_SET: tuple[str, ...] = tuple(
    """
    alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown
    burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac
    copper coral cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite
    grape graphite grass gray green grey heather indigo ivory ivy khaki lavender lemon leopard light
    lilac lime magenta maroon mauve merlot midnight mint mocha multicolor mushroom mustard natural navy
    nude olive orange peach pewter pink plum purple rainbow red rose royal rust sand sapphire seashell
    silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise violet walnut
    wheat white wine yellow
    """.split()  # noqa: SIM905
)

DEFAULT_PRICE = 100.0
_NON_PRICE_CHARS = re.compile(r"[^\d.]")


def normalize_color(option):
    """First colour of COLOR_SET contained in ``option``, else ``option`` unchanged.

    ``option`` is a string for purchased values but a ``(name, value)`` tuple for synthetic goal options
    (WebShop passes ``goal_options.items()``); ``in`` on a tuple tests element *equality*, so a pair only
    normalizes when its name or value is exactly a colour word. This asymmetry is WebShop's and is kept.
    """
    for color in COLOR_SET:
        if color in option:
            return color
    return option


def parse_pricing(raw, *, file: str = "<memory>", record: str | None = None) -> tuple[list[float], str]:
    """Parse a raw ``pricing`` field into (up to two floats, the displayed price tag).

    Raw strings look like ``"$12.99"`` or ``"$10.99 - $15.99"``: split on ``$``, strip everything but
    digits and dots, parse as Decimal. Missing/empty -> [100.0] and ``"$100.0"``. Already-parsed lists of
    numbers (the processed JSONL form) are accepted too. The tag uses Python's float repr, e.g. ``$35.0``.
    """
    from .errors import DataError

    if raw is None or raw == "" or raw == []:
        return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
    if isinstance(raw, str):
        values = []
        for piece in raw.split("$")[1:]:
            cleaned = _NON_PRICE_CHARS.sub("", piece)
            try:
                values.append(float(Decimal(cleaned)))
            except InvalidOperation:
                raise DataError(
                    file, f"cannot parse price {piece!r} in {raw!r}", record=record, field="pricing"
                ) from None
        if not values:
            return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
    elif isinstance(raw, Sequence) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in raw
    ):
        values = [float(v) for v in raw]
    else:
        raise DataError(file, f"expected a price string or list of numbers, got {raw!r}", record=record,
                        field="pricing")
    values = values[:2]
    tag = f"${values[0]}" if len(values) == 1 else f"${values[0]} to ${values[1]}"
    return values, tag


def normalize_option_value(value: str) -> str:
    """WebShop's option value form: stripped, ``/`` -> `` | ``, lower-cased."""
    return value.strip().replace("/", " | ").lower()


def normalize_options(raw, *, file: str = "<memory>", record: str | None = None) -> dict[str, list[str]]:
    """Raw ``customization_options`` ({Name: [{"value": ..., "image": ...}]} or "") -> {name: [values]}.

    Names are lower-cased, options whose content is null are dropped, value order is kept.
    """
    from .errors import DataError

    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise DataError(file, f"expected an object or empty string, got {type(raw).__name__}", record=record,
                        field="customization_options")
    options: dict[str, list[str]] = {}
    for name, contents in raw.items():
        if contents is None:
            continue
        if not isinstance(contents, list):
            raise DataError(file, f"option {name!r}: expected a list", record=record,
                            field="customization_options")
        values = []
        for item in contents:
            if not isinstance(item, Mapping) or not isinstance(item.get("value"), str):
                raise DataError(file, f"option {name!r}: each entry needs a string 'value'", record=record,
                                field="customization_options")
            values.append(normalize_option_value(item["value"]))
        options[str(name).lower()] = values
    return options


def option_index_text(options: Mapping[str, Iterable[str]]) -> str:
    """Options as WebShop's index writes them: ``name: v1, v2, and name2: w1``."""
    return ", and ".join(f"{name}: {', '.join(values)}" for name, values in options.items())


def index_text(title: str, description: str, bullet_points: Sequence[str],
               options: Mapping[str, Iterable[str]]) -> str:
    """The document WebShop's search index holds: title, description, first bullet, options, lower-cased."""
    first_bullet = bullet_points[0] if bullet_points else ""
    return " ".join([title, description, first_bullet, option_index_text(options)]).lower()
