"""Porter (1980) stemmer, because WebShop's pyserini index stems with Lucene's PorterStemFilter.

Written from the published algorithm (M. F. Porter, "An algorithm for suffix stripping", with the
two departures of Porter's own reference implementation that Lucene follows: ``bli -> ble`` instead of
``abli -> able`` and ``logi -> log``). Only lower-case input is expected; words of up to two
characters are returned unchanged.
"""

from __future__ import annotations

from functools import lru_cache

_VOWELS = frozenset("aeiou")


def _is_consonant(w: str, i: int) -> bool:
    ch = w[i]
    if ch in _VOWELS:
        return False
    if ch == "y":
        return i == 0 or not _is_consonant(w, i - 1)
    return True


def _measure(stem: str) -> int:
    """m in [C](VC)^m[V]: the number of vowel-consonant sequences."""
    m = 0
    prev_vowel = False
    for i in range(len(stem)):
        cons = _is_consonant(stem, i)
        if cons and prev_vowel:
            m += 1
        prev_vowel = not cons
    return m


def _has_vowel(stem: str) -> bool:
    return any(not _is_consonant(stem, i) for i in range(len(stem)))


def _double_consonant(w: str) -> bool:
    return len(w) >= 2 and w[-1] == w[-2] and _is_consonant(w, len(w) - 1)


def _cvc(w: str) -> bool:
    """Ends consonant-vowel-consonant with the last consonant not w, x or y."""
    if len(w) < 3:
        return False
    n = len(w)
    return (
        _is_consonant(w, n - 3)
        and not _is_consonant(w, n - 2)
        and _is_consonant(w, n - 1)
        and w[-1] not in "wxy"
    )


def _replace_if(w: str, rules: tuple[tuple[str, str], ...], min_m: int) -> str:
    """Apply the first rule whose suffix matches, if the remaining stem has measure > min_m."""
    for suffix, repl in rules:
        if w.endswith(suffix):
            stem = w[: len(w) - len(suffix)]
            return stem + repl if _measure(stem) > min_m else w
    return w


_STEP2 = (
    ("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"), ("izer", "ize"),
    ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous"),
    ("ization", "ize"), ("ation", "ate"), ("ator", "ate"), ("alism", "al"), ("iveness", "ive"),
    ("fulness", "ful"), ("ousness", "ous"), ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"),
    ("logi", "log"),
)
_STEP3 = (
    ("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"), ("ful", ""),
    ("ness", ""),
)
_STEP4 = (
    "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion", "ou",
    "ism", "ate", "iti", "ous", "ive", "ize",
)


def _longest_first(rules):
    # The reference implementation selects the longest matching suffix of a step and then tests the
    # condition; it never falls back to a shorter suffix when the condition fails.
    return tuple(sorted(rules, key=lambda r: -len(r[0] if isinstance(r, tuple) else r)))


_STEP2 = _longest_first(_STEP2)
_STEP3 = _longest_first(_STEP3)
_STEP4 = _longest_first(_STEP4)


def _step1(w: str) -> str:
    if w.endswith(("sses", "ies")):
        w = w[:-2]
    elif w.endswith("ss"):
        pass
    elif w.endswith("s"):
        w = w[:-1]

    if w.endswith("eed"):
        if _measure(w[:-3]) > 0:
            w = w[:-1]
    else:
        stripped = None
        for suffix in ("ed", "ing"):
            if w.endswith(suffix) and _has_vowel(w[: -len(suffix)]):
                stripped = w[: -len(suffix)]
                break
        if stripped is not None:
            w = stripped
            if w.endswith(("at", "bl", "iz")):
                w += "e"
            elif _double_consonant(w) and w[-1] not in "lsz":
                w = w[:-1]
            elif _measure(w) == 1 and _cvc(w):
                w += "e"

    if w.endswith("y") and _has_vowel(w[:-1]):
        w = w[:-1] + "i"
    return w


def _step4(w: str) -> str:
    for suffix in _STEP4:
        if w.endswith(suffix):
            stem = w[: len(w) - len(suffix)]
            if _measure(stem) > 1 and (suffix != "ion" or (stem and stem[-1] in "st")):
                return stem
            return w
    return w


def _step5(w: str) -> str:
    if w.endswith("e"):
        stem = w[:-1]
        m = _measure(stem)
        if m > 1 or (m == 1 and not _cvc(stem)):
            w = stem
    if w.endswith("ll") and _measure(w) > 1:
        w = w[:-1]
    return w


@lru_cache(maxsize=1 << 18)
def porter_stem(word: str) -> str:
    """Stem one lower-case word (cached: catalogs reuse a small vocabulary)."""
    if len(word) <= 2:
        return word
    w = _step1(word)
    w = _replace_if(w, _STEP2, 0)
    w = _replace_if(w, _STEP3, 0)
    w = _step4(w)
    return _step5(w)
