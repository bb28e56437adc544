"""A word-level tokenizer over the bridge's closed vocabulary, for the embedded BabyAI policy.

Why word-level and not the WebShop policy's byte-level BPE: every text the BabyAI policy reads is written by this
bridge from a closed vocabulary — :func:`~envs.babyai_bridge.text.describe`'s templates (colours, object names,
door states, headings, the digits of "2 steps ahead and 1 to the left"), BabyAI's mission grammar (minigrid's
``verifier``: "go to", "pick up", "put ... next to", "open", "in front of you", "then", "after you", ...) and the six
action phrases. About a hundred words cover all of it, so one word is one token: prompts are as short as they can
be (a BPE trained on shop text splits "purple" or "steps" into pieces and pays for ~2,000 embedding rows), the
embedding table is a few percent of the model, and an action phrase is one or two tokens. A word outside the
vocabulary (a level with another grammar) becomes ``<unk>`` instead of failing.

The vocabulary is fixed here (not learned from data), so the tokenizer is the same whatever demonstrations a
policy is trained on; ``<pad>`` is id 0, ``<eos>`` 1 and ``<unk>`` 2, as in the other embedded policies' tokenizers.
"""

from __future__ import annotations

from .text import _COLOURS, _DOOR_STATES, _OBJECTS, ACTION_TEXTS, HEADINGS

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")

#: The words of describe()'s sentences, the agent's prompt lines and BabyAI's mission grammar (lower-cased).
TEMPLATE_WORDS = (
    "mission you face carry nothing in front of an a empty cell something cannot see no objects walls wall step "
    "steps ahead and to the left right last actions action none "
    "go pick up put next open drop toggle turn forward then after behind on your object door"
)
PUNCTUATION = ".,;:"


def vocabulary() -> list[str]:
    """Every token of the tokenizer, special tokens first, then the words in sorted order."""
    words = set(TEMPLATE_WORDS.split())
    words.update(_COLOURS, _DOOR_STATES, HEADINGS)
    for name in _OBJECTS.values():
        words.update(name.split())
    for text in ACTION_TEXTS:
        words.update(text.split())
    words.update(str(d) for d in range(10))
    words.update(PUNCTUATION)
    return [*SPECIAL_TOKENS, *sorted(words)]


def build_tokenizer():
    """The word-level ``tokenizers.Tokenizer`` (lower-cases, splits on whitespace and punctuation)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {word: i for i, word in enumerate(vocabulary())}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    return tokenizer
