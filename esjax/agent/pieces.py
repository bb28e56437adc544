"""The texts of a byte-level tokenizer's ASCII tokens (what generate mode's action automaton is built from).

A byte-level tokenizer (GPT-2 style: Qwen2, Llama 3, the embedded policies) decodes a reply by joining its tokens'
bytes and reading them as UTF-8. A token whose bytes are ASCII is therefore its own text, and a reply made of such
tokens decodes to their texts joined, however the reply was cut into tokens. :class:`AsciiPieces` keeps every
ASCII token's text in one buffer (the texts of many replies are one array gather). Replies holding any other token
are left to the caller (their text needs the tokenizer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class AsciiPieces:
    """Token id -> its text when that is ASCII; ids past the vocabulary count as not ASCII.

    Args:
      pieces: per token id its text, ``None`` when the token's bytes are not ASCII.
    """

    def __init__(self, pieces: Sequence[str | None]):
        vocab = len(pieces)
        self.outside, self.separator = vocab, vocab + 1  # two more ids: past the vocabulary, and a line break
        texts = [p or "" for p in pieces] + ["", "\n"]
        self.ascii = np.array([p is not None for p in pieces] + [False, True])
        self.length = np.array([len(t) for t in texts], np.intp)
        self.start = np.cumsum(self.length) - self.length
        self.buffer = np.frombuffer("".join(texts).encode("ascii"), np.uint8)

    @classmethod
    def of(cls, tokenizer: Any, dropped: frozenset[int] = frozenset()) -> AsciiPieces | None:
        """From a ``tokenizers.Tokenizer`` that decodes byte-level (None for any other: its texts need not join);
        ``dropped`` tokens decode to nothing (the stop tokens a reply's text leaves out)."""
        if type(getattr(tokenizer, "decoder", None)).__name__ != "ByteLevel":
            return None
        pieces = []
        for i in range(tokenizer.get_vocab_size(with_added_tokens=True)):
            piece = "" if i in dropped else tokenizer.decode([i])
            pieces.append(piece if piece.isascii() else None)
        return cls(pieces)

    def texts(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The texts of ``ids`` joined (``uint8``; ids that are not ASCII count as empty) and where each id's text
        ends in it."""
        lengths = self.length[ids]
        ends = np.cumsum(lengths)
        sources = np.repeat(self.start[ids] - (ends - lengths), lengths)
        sources += np.arange(len(sources))
        return self.buffer[sources], ends
