"""The texts of many replies at once, from a byte-level tokenizer's ASCII tokens (generate mode's decode path).

A byte-level tokenizer (GPT-2 style: Qwen2, Llama 3, the embedded policies) decodes a reply by joining its tokens'
bytes and reading them as UTF-8. A token whose bytes are ASCII is therefore its own text, and a reply made of such
tokens decodes to their texts joined, however the reply was cut into tokens. :class:`AsciiPieces` keeps every
ASCII token's text in one buffer, so the texts of a whole batch of replies are one array gather, and their actions
are found with array operations too (:func:`action_ends`): about 1–2 µs per reply in batches of hundreds, instead
of a ``Tokenizer.decode`` (~4 µs) and a regular-expression search per check. Replies holding any other token are
left to the caller (their text needs the tokenizer).
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

    def first_actions(self, tokens: np.ndarray, lengths: np.ndarray, names: Sequence[bytes]
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Per reply (row ``r`` of ``tokens``: its first ``lengths[r]`` ids): how many of its tokens it takes to
        hold its first action ``name[argument]`` (:func:`action_ends`; 0: none), and whether it is all ASCII (the
        first answer holds for those rows only)."""
        shortest, ascii_rows = np.zeros(len(lengths), np.intp), np.ones(len(lengths), bool)
        if not len(lengths):
            return shortest, ascii_rows
        inside = np.arange(tokens.shape[1]) < lengths[:, None]
        ends_of_rows = np.cumsum(lengths)
        ids = np.insert(np.minimum(tokens[inside], self.outside).astype(np.intp), ends_of_rows, self.separator)
        row_of = np.repeat(np.arange(len(lengths)), lengths + 1)
        ascii_rows[row_of[~self.ascii[ids]]] = False
        text, ends = self.texts(ids)
        last = np.searchsorted(ends, action_ends(text, names))  # the token holding each action's closing bracket
        if len(last):
            rows = row_of[last]
            first = np.flatnonzero(np.diff(rows, prepend=-1))  # actions come in text order: a row's first
            rows, last = rows[first], last[first]
            row_starts = ends_of_rows[rows] + rows - lengths[rows]  # in ``ids``: each earlier row ends with a break
            shortest[rows] = last - row_starts + 1
        return shortest, ascii_rows

    def texts(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The texts of ``ids`` joined (``uint8``; ids that are not ASCII count as empty) and where each id's text
        ends in it."""
        lengths = self.length[ids]
        ends = np.cumsum(lengths)
        sources = np.repeat(self.start[ids] - (ends - lengths), lengths)
        sources += np.arange(len(sources))
        return self.buffer[sources], ends


_WORD = np.zeros(256, bool)  # ASCII word characters (what a regular expression's \b looks at)
_WORD[[*range(48, 58), *range(65, 91), *range(97, 123), 95]] = True
_OPEN, _CLOSE, _LINE = ord("["), ord("]"), ord("\n")


def action_ends(text: np.ndarray, names: Sequence[bytes]) -> np.ndarray:
    """Where each action ``name[argument]`` in ASCII ``text`` (bytes as ``uint8``) ends, in text order: the matches
    of ``\\b(name|...)\\[[^\\[\\]\\n]*\\]`` with ``re.IGNORECASE`` (``names`` lower-case ASCII), found with
    array operations from the brackets' positions (the expression's scan costs ~7 ns a character). An opening
    bracket starts an argument that the next bracket or line break ends: an action iff that is a closing bracket
    and a name, on a word boundary, comes just before."""
    marks = np.flatnonzero((text == _OPEN) | (text == _CLOSE) | (text == _LINE))
    kinds = text[marks]
    opening = np.flatnonzero((kinds[:-1] == _OPEN) & (kinds[1:] == _CLOSE))
    at, ends = marks[opening], marks[opening + 1] + 1
    action = np.zeros(len(at), bool)
    for name in names:
        k = len(name)
        fits = np.flatnonzero(at >= k)
        start = at[fits] - k
        hit = (start < 1) | ~_WORD[text[np.maximum(start - 1, 0)]]  # a word boundary before the name
        for j, letter in enumerate(name):
            hit &= (text[start + j] | 0x20) == letter  # ASCII letters in lower case
        action[fits[hit]] = True
    return ends[action]
