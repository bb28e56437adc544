"""WebShop's fuzzy matcher (thefuzz 0.19 ``token_set_ratio``), computed with rapidfuzz.

WebShop pins thefuzz 0.19, whose default processing (``full_process(s, force_ascii=True)``) is:
``str(s)``, drop the characters U+0080..U+00FF, replace every ``\\W`` character (Unicode-aware, so
``_`` is kept) with a space, lower-case, strip. The ratio is then rounded to an integer and a match
needs ``score > 85``. rapidfuzz computes the same token-set ratio; only the pre-processing differs from
rapidfuzz's defaults (which also split on ``_``), so we pre-process ourselves and pass ``processor=None``.
"""

from __future__ import annotations

import re

from rapidfuzz import fuzz as _rf_fuzz

MATCH_THRESHOLD = 85
_LATIN1_TABLE = {i: None for i in range(128, 256)}
_NON_WORD = re.compile(r"\W", re.UNICODE)


def preprocess(value) -> str:
    """thefuzz 0.19's ``full_process(value, force_ascii=True)``. Non-strings go through ``str()``."""
    text = str(value).translate(_LATIN1_TABLE)
    return _NON_WORD.sub(" ", text).lower().strip()


def token_set_ratio(a, b) -> int:
    """Integer token-set ratio in [0, 100] as thefuzz 0.19 reports it (0 if either side is empty/None)."""
    if a is None or b is None:
        return 0
    pa, pb = preprocess(a), preprocess(b)
    if not pa or not pb:
        return 0
    return int(round(_rf_fuzz.token_set_ratio(pa, pb, processor=None)))


def fuzzy_match(a, b) -> bool:
    """WebShop's match rule: rounded token-set ratio strictly above 85."""
    return token_set_ratio(a, b) > MATCH_THRESHOLD
