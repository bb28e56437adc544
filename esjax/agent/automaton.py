"""The action pattern as a deterministic automaton over token ids (generate mode's decode path).

A reply's state is advanced by each new token with one table lookup, for every row of a decode call at once, and a
turn can end at the token whose state is :data:`ACCEPT`: no reply text is built and nothing is searched while
decoding. The table is built once from a byte-level tokenizer's ASCII tokens (:class:`AsciiPieces`): a reply of
such tokens decodes to their texts joined, so running the byte automaton over the tokens' texts is running it over
the reply. A token that is not ASCII sends the reply to :data:`UNKNOWN`, where the caller asks the general path
(around a non-ASCII letter ``\\b`` and case folding depend on the decoded character).

The byte automaton is the subset construction of ``\\b(name|...)\\[[^\\[\\]\\n]*\\]`` searched anywhere, with
``re.IGNORECASE`` on ASCII (names lower-case ASCII letters): a state is whether the last byte was a word character,
which name prefixes are matched so far, and whether some match is inside its argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from esjax.agent.pieces import AsciiPieces

START, ACCEPT, UNKNOWN = 0, 1, 2  # a reply with no byte yet; one holding a complete action; one the table can't read
_PAD = 256  # a byte column that changes no state (pads token texts to one width)
_WORD = np.zeros(256, bool)  # ASCII word characters (what a regular expression's \b looks at)
_WORD[[*range(48, 58), *range(65, 91), *range(97, 123), 95]] = True
_OPEN, _CLOSE, _LINE = ord("["), ord("]"), ord("\n")


def byte_automaton(names: Sequence[bytes]) -> np.ndarray:
    """``[states, 257]``: the next state per byte (column 256 changes nothing) of the action pattern with ``names``;
    states :data:`START`, :data:`ACCEPT` and :data:`UNKNOWN` (any byte past ASCII) first."""
    start = (False, frozenset(), False)  # (last byte a word character, name prefixes matched, in an argument)
    ids: dict[object, int] = {start: START, "accept": ACCEPT, "unknown": UNKNOWN}
    rows: dict[int, list[int]] = {ACCEPT: [ACCEPT] * 257, UNKNOWN: [UNKNOWN] * 257}
    queue = [start]
    while queue:
        key = queue.pop()
        row = []
        for byte in range(256):
            nxt = _step(key, byte, names)
            if nxt not in ids:
                ids[nxt] = len(ids)
                queue.append(nxt)
            row.append(ids[nxt])
        rows[ids[key]] = row + [ids[key]]
    return np.array([rows[i] for i in range(len(ids))], np.int32)


def _step(key: tuple[bool, frozenset, bool], byte: int, names: Sequence[bytes]) -> object:
    word, prefixes, in_argument = key
    if byte >= 128:
        return "unknown"
    if in_argument and byte == _CLOSE:
        return "accept"
    named = any(j == len(names[n]) for n, j in prefixes)
    argument = (byte == _OPEN and named) or (in_argument and byte not in (_OPEN, _LINE))
    letter = byte | 0x20 if chr(byte).isalpha() else byte
    grown = {(n, j + 1) for n, j in prefixes if j < len(names[n]) and names[n][j] == letter}
    if not word:  # a name starts on a word boundary
        grown |= {(n, 1) for n, name in enumerate(names) if name[0] == letter}
    return bool(_WORD[byte]), frozenset(grown), argument


class ActionAutomaton:
    """Token id → next state, for every state (``table [states, vocab + 1]``; the last column, where every id at
    or past ``vocab`` goes, leads to :data:`UNKNOWN`)."""

    def __init__(self, table: np.ndarray):
        self.table = table
        self.vocab = table.shape[1] - 1

    @classmethod
    def of(cls, pieces: AsciiPieces | None, names: Sequence[bytes], vocab: int) -> ActionAutomaton:
        """From a byte-level tokenizer's ASCII pieces (None: no byte-level tokenizer, every reply is
        :data:`UNKNOWN`), for token ids below ``vocab``."""
        if pieces is None:
            return cls(np.full((3, vocab + 1), UNKNOWN, np.int32))
        bytes_table = byte_automaton(names)
        known = min(vocab, pieces.outside)
        lengths = pieces.length[:known]
        order = np.argsort(-lengths, kind="stable")  # longest first: step k feeds the tokens longer than k
        texts = np.full((known, max(int(lengths.max(initial=0)), 1)), _PAD, np.intp)
        texts[np.arange(texts.shape[1]) < lengths[:, None]] = pieces.texts(np.arange(known))[0]  # row by row
        table = np.full((len(bytes_table), vocab + 1), UNKNOWN, np.int32)
        for state in range(len(bytes_table)):
            current = np.full(known, state, np.int32)
            for k in range(texts.shape[1]):
                longer = order[:np.count_nonzero(lengths > k)]
                current[longer] = bytes_table[current[longer], texts[longer, k]]
            table[state, :known] = np.where(pieces.ascii[:known], current, UNKNOWN)
        return cls(table)

    def advance(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The states after each step of ``tokens [n, rows]`` from ``states [rows]``: ``[n, rows]``."""
        columns = np.minimum(tokens, self.vocab)
        flat, width = self.table.reshape(-1), self.table.shape[1]
        out = np.empty(columns.shape, np.int32)
        current = states
        for j, column in enumerate(columns):
            current = out[j] = flat.take(current * width + column)
        return out

    def state_of(self, tokens: Sequence[int]) -> int:
        """The state of a reply after ``tokens``."""
        state = START
        for token in tokens:
            state = int(self.table[state, min(token, self.vocab)])
        return state


class TurnAutomaton:
    """:class:`ActionAutomaton` extended with a turn's other events, over every token id a model writes, so a
    decode call's block of tokens is read with one table lookup per step and :func:`turn_ends` over the states.

    A stop token leads to :attr:`stopped`; a closing token that leaves a reply in :data:`UNKNOWN` leads to
    :attr:`unread`, where the caller asks the agent's exact path (and sets the state back to :data:`UNKNOWN` if the
    reply goes on); id :attr:`hole` (a step where a row took no token) leaves every state as it is. The states
    where a turn may end (:data:`ACCEPT`, :attr:`stopped`, :attr:`unread`) are absorbing but for a stop token, so a
    block's last states tell which rows to look at. The table is token-major,
    ``[ids + 1, states]`` (int16): a step's lookups touch one short row per token.
    """

    def __init__(self, action: ActionAutomaton, stop_ids: Sequence[int], closing_ids: Sequence[int], ids: int):
        states = len(action.table)
        self.stopped, self.unread, self.hole, self.width = states, states + 1, ids, states + 2
        table = np.full((ids + 1, self.width), UNKNOWN, np.int16)
        known = min(ids, action.vocab)
        table[:known, :states] = action.table[:, :known].T
        closing = sorted(closing_ids)
        table[closing] = np.where(table[closing] == UNKNOWN, self.unread, table[closing])
        table[:, self.unread] = self.unread
        table[:, self.stopped] = self.stopped
        table[sorted(stop_ids)] = self.stopped
        table[self.hole] = np.arange(self.width)
        self.table = table

    def events(self, max_new_tokens: int) -> TurnEvents:
        return TurnEvents(self.stopped, self.unread, max_new_tokens)

    def advance(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The states after each step of ``tokens [n, rows]`` from ``states [rows]``: ``[n, rows]``."""
        flat, at = self.table.reshape(-1), tokens * self.width
        out = np.empty(tokens.shape, np.int32)
        current = states
        for j in range(len(tokens)):
            current = out[j] = flat.take(at[j] + current)
        return out

    def state_of(self, tokens: Sequence[int]) -> int:
        """The state of a reply after ``tokens``."""
        state = START
        for token in tokens:
            state = int(self.table[token, state])
        return state


#: bits of :func:`turn_ends`' ``flags``: the turn holds a complete action; it is over without one (a stop token or
#: ``max_new_tokens``); its reply went through :attr:`TurnAutomaton.unread` before that (the agent must read it);
#: the row is live and one of these happened (or it reached ``max_new_tokens``): the caller looks at it
COMPLETE, OVER, ASKING, LOOK = 1, 2, 4, 8


@dataclasses.dataclass(frozen=True)
class TurnEvents:
    """What :func:`turn_ends` needs of a :class:`TurnAutomaton` and the engine (static: part of a program)."""

    stopped: int
    unread: int
    max_new_tokens: int


def turn_ends(states, counts, live, events: TurnEvents):
    """Where each row's turn ends within a block of steps, as arrays (on the device, inside the decode program, or
    on the host): ``states [rows, 1 + steps]`` the automaton's state after the block's first column (a prefill's
    token, or none) and after each step, ``counts [rows]`` the turn's length after that first
    column, ``live [rows]`` the rows holding a turn. Returns ``[3, rows]`` int32: the last state, the turn's length
    (cut where it ends: at its complete action, else where it is over; the whole block when it goes on) and the
    :data:`LOOK` ... bits (field-major: the host reads each as one contiguous row)."""
    width = states.shape[1]
    column = jnp.arange(width)
    length = counts[:, None] + column
    first = lambda mask: jnp.min(jnp.where(mask, column, width), axis=1)
    over_at = jnp.minimum(first(states == events.stopped), first(length >= events.max_new_tokens))
    accept_at = first(states == ACCEPT)
    complete = (accept_at < width) & (accept_at <= over_at)
    cut = counts + jnp.minimum(jnp.where(complete, accept_at, over_at), width - 1)
    asking = ~complete & jnp.any((states == events.unread) & (column <= over_at[:, None]), axis=1)
    last = states[:, -1]
    look = live & ((last == ACCEPT) | (last == events.stopped) | (last == events.unread)
                   | (length[:, -1] >= events.max_new_tokens))
    flags = COMPLETE * complete + OVER * (over_at < width) + ASKING * asking + LOOK * look
    return jnp.stack([last, cut, flags]).astype(jnp.int32)
