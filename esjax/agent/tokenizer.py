"""A small byte-level BPE tokenizer trained on shop text, for policies trained from scratch.

The embedded default policy and the ``model.source: random`` test policies use it. It is deterministic:
the same texts and vocabulary size give the same ``tokenizer.json``. :func:`keep_head_and_tail` is how every agent
fits a prompt's ids into its budget.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")


def train_bpe(texts: Iterable[str], vocab_size: int = 1024, whole_pieces: Iterable[str] = ()) -> Tokenizer:
    """Byte-level BPE over ``texts`` (lower-cased by the caller if wanted); ``<pad>`` is id 0.

    ``whole_pieces``: strings that become one token each wherever they occur (e.g. a catalogue's product ids,
    which BPE would split into characters), appended after the ``vocab_size`` learned ones.
    """
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(list(texts), trainer=trainer)
    pieces = sorted(set(whole_pieces))
    if pieces:
        tokenizer.add_tokens([AddedToken(p, normalized=False) for p in pieces])
    return tokenizer


def keep_head_and_tail(ids: list[int], limit: int) -> list[int]:
    """``ids`` within ``limit`` tokens: all of them when they fit, else the first half of the budget and the last
    (a prompt's head holds the goal, its tail the latest state and the cue to act; the middle is what can go)."""
    if len(ids) <= limit:
        return ids
    head = limit // 2
    return ids[:head] + ids[len(ids) - (limit - head):]
