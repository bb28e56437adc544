"""Noun extraction for WebShop's product-type reward (title-noun overlap).

WebShop tags titles with spaCy ``en_core_web_sm`` and keeps tokens tagged NOUN or PROPN. spaCy is a
heavy, version-sensitive dependency, so it is used only when it *and* that model import; otherwise a
deterministic fallback stands in:

  fallback nouns = lower-cased alphabetic tokens (letters only, split on everything else) of length
  >= 2 that are not function words (determiners, pronouns, prepositions, conjunctions, auxiliaries,
  quantifiers) and not in a short list of adjectives frequent in product titles.

The fallback over-counts (most adjectives are kept) but is identical for identical strings, so buying
the goal's own product always gets full type credit, as under spaCy. ``noun_backend()`` says which one
is active; the reward breakdown records it.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

_FUNCTION_WORDS = frozenset(
    """
    a an the this that these those my your his her its our their some any each every all both either
    neither no none one two three four five six seven eight nine ten i me we us you he him she it they
    them who whom whose which what and or nor but so yet if then than because while though although
    of in on at by for with without from to into onto over under above below between among through
    during before after about against along around across behind beyond near off out up down per via
    plus minus is are was were be been being am do does did have has had can could will would shall
    should may might must not very too also just only more most less least much many few lot lots
    """.split()  # noqa: SIM905
)
_TITLE_ADJECTIVES = frozenset(
    """
    new best premium high low great good large small big mini extra super ultra professional portable
    natural organic original classic modern cute soft hard heavy light lightweight durable compatible
    adjustable waterproof non free fresh pure real easy quick fast long short wide full half
    """.split()  # noqa: SIM905
)
_ALPHA = re.compile(r"[^\W\d_]+", re.UNICODE)


@lru_cache(maxsize=1)
def _spacy_model():
    if os.environ.get("ESJAX_WEBSHOP_NO_SPACY"):
        return None
    try:  # pragma: no cover - spaCy is not installed in CI
        import spacy

        return spacy.load("en_core_web_sm")
    except Exception:
        return None


def noun_backend() -> str:
    """``'spacy'`` when spaCy with en_core_web_sm is used, else ``'fallback'``."""
    return "spacy" if _spacy_model() is not None else "fallback"


def fallback_nouns(text: str) -> list[str]:
    """The documented deterministic stand-in for spaCy's NOUN/PROPN tokens (order and repeats kept)."""
    return [
        tok for tok in _ALPHA.findall(text.lower())
        if len(tok) >= 2 and tok not in _FUNCTION_WORDS and tok not in _TITLE_ADJECTIVES
    ]


@lru_cache(maxsize=1 << 16)
def title_nouns(text: str) -> tuple[str, ...]:
    """Lower-cased noun tokens of a title, with repeats (WebShop divides by the list length)."""
    nlp = _spacy_model()
    if nlp is None:
        return tuple(fallback_nouns(text))
    return tuple(t.text.lower() for t in nlp(text) if t.pos_ in ("NOUN", "PROPN"))  # pragma: no cover
