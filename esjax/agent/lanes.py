"""Decode lanes: a KV cache that rows enter and leave between decode steps (continuous batching).

A :class:`Lane` holds ``rows`` cache rows of one parameter version θ_v. Every decode step feeds the last sampled
token of every row and samples the next one, with each row's own ES member applied inside the matmuls
(:class:`~esjax.model.perturb.Perturbation`, prepared once per lane membership). A row that starts a turn is
**prefilled** on its own (a small batch of the starting rows, against a fresh cache) and its keys and values are
**inserted** into the lane: rows join and leave at any decode step, nobody waits for the longest row.

Cache layout: the decoder writes a call's tokens at one write slot ``index`` shared by all rows
(:mod:`esjax.model.decoder`). A row's prompt is therefore placed so that it *ends* at the current write slot
(slots ``[index - P, index)``, its other slots marked invalid) and every decode step writes all rows at
``index``; each row sees only its own valid slots. When the write slot would run past the cache (or a new prompt
does not fit below it), the cache is **shifted** left by the oldest live row's start (one roll of the slot axis,
wrapped slots invalidated), so a lane of ``length`` slots serves rows of any age as long as one turn (prompt +
generated tokens) fits. Positions (RoPE) are per row and explicit, so a row's slots never affect its numerics.

Constrained turns: a row may carry the token ids of every reply its turn allows (a page's click actions, or the
searches that copy the instruction: :meth:`~esjax.agent.generate_agent.GenerateAgent.reply_choices`); each of its draws
then keeps only the tokens that continue a choice still matching the turn so far (grammar-constrained decoding over
a list of sequences), on the device, inside the same programs. Rows without choices decode freely.

Sampling: row ``r`` draws token ``n`` of a turn with ``fold_in(fold_in(key(lo_r), hi_r), n)``, where
``(lo_r, hi_r)`` are the two 32-bit halves of a per-turn seed chosen by the caller (the rollout engine hashes the
task batch's sampling seed, the task position and the turn): common random numbers across members. Greedy rows
take the argmax. Temperature, top-k and top-p are static (a :class:`Sampling`).

:func:`generate_rows` runs whole generations through a lane (tests, the benchmark).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from esjax.agent.automaton import TurnEvents, turn_ends
from esjax.agent.batch_generate import top_p_filter
from esjax.agent.batching import left_pad
from esjax.agent.buckets import Buckets, next_power_of_two
from esjax.model.config import ModelConfig
from esjax.model.decoder import default_positions, forward, forward_last, init_cache
from esjax.model.perturb import Perturbation, Prepared, prepare_jit

#: Prompt lengths of a prefill are padded to these (each is a compiled program): ~1.5x apart.
PREFILL_BUCKETS = Buckets(lengths=(16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                                   6144, 8192, 12288, 16384, 24576, 32768))


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How training rows draw tokens (static: part of the compiled program). ``temperature`` 0 = greedy;
    ``top_k`` 0 = off; ``top_p`` 1 = off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"sampling: need temperature >= 0, 0 < top_p <= 1, top_k >= 0, got {self}")


def sample_rows(logits: jax.Array, keys: jax.Array, counts: jax.Array, greedy: jax.Array,
                sampling: Sampling) -> jax.Array:
    """One token per row from ``logits [B, V]``: ``keys [B]`` per-turn keys, ``counts [B]`` the token's index in
    its turn, ``greedy [B]`` rows that take the argmax."""
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if sampling.temperature <= 0:
        return best
    scaled = logits / sampling.temperature
    if 0 < sampling.top_k < scaled.shape[-1]:
        kth = jax.lax.top_k(scaled, sampling.top_k)[0][:, -1:]
        scaled = jnp.where(scaled >= kth, scaled, -jnp.inf)
    if sampling.top_p < 1:
        scaled = top_p_filter(scaled, sampling.top_p)
    step_keys = jax.vmap(jax.random.fold_in)(keys, counts)
    drawn = jax.vmap(jax.random.categorical)(step_keys, scaled).astype(jnp.int32)
    return jnp.where(greedy, best, drawn)


def constrain_logits(logits: jax.Array, choices: jax.Array, alive: jax.Array, counts: jax.Array
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Mask ``logits [B, V]`` to the tokens that continue a live choice: ``choices [B, A, L]`` token ids (-1: past a
    choice's end), ``alive [B, A]`` choices that match the turn's tokens so far, ``counts [B]`` the index of the
    token drawn now. Returns the masked logits, each choice's token at ``counts`` ``[B, A]`` and the rows that were
    constrained ``[B]`` (rows without a live choice keep their logits)."""
    rows, _, length = choices.shape
    at = jnp.clip(counts, 0, length - 1)
    nxt = jnp.take_along_axis(choices, at[:, None, None], axis=2)[..., 0]
    ok = alive & (nxt >= 0) & (counts < length)[:, None]
    hits = jnp.zeros(logits.shape, jnp.int32).at[jnp.arange(rows)[:, None], jnp.maximum(nxt, 0)].add(
        ok.astype(jnp.int32))
    constrained = ok.any(axis=1)
    return jnp.where(constrained[:, None] & (hits == 0), -jnp.inf, logits), nxt, constrained


def advance_choices(alive: jax.Array, nxt: jax.Array, constrained: jax.Array, tokens: jax.Array) -> jax.Array:
    """The choices still matching after drawing ``tokens [B]`` (see :func:`constrain_logits`)."""
    return jnp.where(constrained[:, None], alive & (nxt == tokens[:, None]), alive)


def sample_constrained(logits: jax.Array, keys: jax.Array, counts: jax.Array, greedy: jax.Array, sampling: Sampling,
                       choices: jax.Array | None, alive: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
    """:func:`sample_rows` within each row's live choices (none: as it is); returns the tokens and the choices
    still alive."""
    if choices is None:
        return sample_rows(logits, keys, counts, greedy, sampling), alive
    logits, nxt, constrained = constrain_logits(logits, choices, alive, counts)
    tokens = sample_rows(logits, keys, counts, greedy, sampling)
    return tokens, advance_choices(alive, nxt, constrained, tokens)


def pack_choices(choices: Sequence[Sequence[int]], partial: Sequence[int], width: int, length: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """One row's choices as ``[width, length]`` ids (-1 padded) and which of them match ``partial`` (the turn's
    tokens so far)."""
    ids = np.full((width, length), -1, np.int32)
    alive = np.zeros(width, bool)
    for a, choice in enumerate(choices):
        ids[a, :len(choice)] = choice
        alive[a] = len(choice) > len(partial) and list(choice[:len(partial)]) == list(partial)
    return ids, alive


def turn_keys(lo: jax.Array, hi: jax.Array) -> jax.Array:
    """Per-row typed keys from two uint32 halves of a 64-bit seed."""
    return jax.vmap(lambda a, b: jax.random.fold_in(jax.random.key(a), b))(lo, hi)


def split_seed(seed: int) -> tuple[int, int]:
    return seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF


# ------------------------------------------------------------------------------------------------- programs
@functools.partial(jax.jit, static_argnames=("config", "sampling"))
def _prefill(config: ModelConfig, sampling: Sampling, params, prepared: Prepared | None, tokens, mask, lo, hi,
             counts, greedy, choices=None, alive=None):
    """Prompts ``[n, P]`` (left-padded) into a fresh cache; returns its keys / values, each row's next token and
    the choices still alive after it (None without choices)."""
    rows, length = tokens.shape
    cache = init_cache(config, rows, length, params["embed"]["embedding"].dtype)
    logits, cache = forward_last(config, params, tokens, default_positions(mask), mask, cache, prepared)
    first, alive = sample_constrained(logits, turn_keys(lo, hi), counts, greedy, sampling, choices, alive)
    return cache["k"], cache["v"], first, alive


@functools.partial(jax.jit, donate_argnames=("cache",))
def _insert(cache, k_new, v_new, mask, rows, cur, first):
    """Write prefilled rows (lane rows ``rows``; out of range = padding, dropped) ending at the write slot."""
    index = cache["index"]
    length = mask.shape[1]
    slots = index - length + jnp.arange(length)
    k = cache["k"].at[:, rows[:, None], slots[None, :]].set(k_new.astype(cache["k"].dtype), mode="drop")
    v = cache["v"].at[:, rows[:, None], slots[None, :]].set(v_new.astype(cache["v"].dtype), mode="drop")
    valid_rows = jnp.zeros((mask.shape[0], cache["valid"].shape[1]), bool).at[:, slots].set(mask)
    valid = cache["valid"].at[rows].set(valid_rows, mode="drop")
    return {"k": k, "v": v, "valid": valid, "index": index}, cur.at[rows].set(first, mode="drop")


@functools.partial(jax.jit, donate_argnames=("choices", "alive"))
def _insert_choices(choices, alive, rows, new_choices, new_alive):
    """Write prefilled rows' choices, packed at the lane's width and length (lane rows ``rows``; out of range =
    padding, dropped)."""
    return choices.at[rows].set(new_choices, mode="drop"), alive.at[rows].set(new_alive, mode="drop")


@functools.partial(jax.jit, donate_argnames=("cache",))
def _shift(cache, shift):
    """Move every row's slots ``shift`` to the left (negative: right); slots that wrap around become invalid."""
    length = cache["valid"].shape[1]
    source = jnp.arange(length) + shift
    inside = (source >= 0) & (source < length)
    roll = lambda x, axis: jnp.roll(x, -shift, axis=axis)
    return {"k": roll(cache["k"], 2), "v": roll(cache["v"], 2),
            "valid": roll(cache["valid"], 1) & inside[None, :], "index": cache["index"] - shift}


#: the per-row fields a decode step reads, packed into one int32 array ``[fields, rows]`` per call (one transfer):
#: ``fresh`` whether a row's fed token is a prefill's (not yet read by the automaton), ``state`` its turn-automaton
#: state before the call. The lane keeps the first four in one int32 array (lo / hi as their bits).
DECODE_FIELDS = ("pos", "count", "lo", "hi", "live", "greedy", "fresh", "state")


@functools.partial(jax.jit, static_argnames=("config", "sampling", "events", "steps"),
                   donate_argnames=("cache", "alive"))
def _decode(config: ModelConfig, sampling: Sampling, params, prepared: Prepared | None, cache, cur, fields,
            choices=None, alive=None, turns=None, events: TurnEvents | None = None, *, steps: int):
    """``steps`` decode steps for every row, feeding ``cur [rows]`` first (``fields``: :data:`DECODE_FIELDS`);
    returns the cache, each row's last token (the next call's ``cur``), the output and the choices still alive (None
    without choices). The output is the sampled tokens ``[rows, steps]``; with a turn automaton ``turns [ids + 1,
    states]`` (:class:`~esjax.agent.automaton.TurnAutomaton`) and its ``events``, ``[1 + steps + 3, rows]``
    (step-major, as the host's turn log): the block of the call's tokens (the fed one where ``fresh``, the
    automaton's hole id elsewhere; then the sampled ones) and where each row's turn ends in it
    (:func:`~esjax.agent.automaton.turn_ends`)."""
    pos, counts, active, greedy = fields[0], fields[1], fields[4] != 0, fields[5] != 0
    lo, hi = jax.lax.bitcast_convert_type(fields[2:4], jnp.uint32)
    keys = turn_keys(lo, hi)
    mask = active[:, None]

    def body(i, state):
        cache, cur, out, alive = state
        logits, cache = forward(config, params, cur[:, None], (pos + i)[:, None], mask, cache, prepared)
        tok, alive = sample_constrained(logits[:, -1], keys, counts + i, greedy, sampling, choices, alive)
        return cache, tok, out.at[:, i].set(tok), alive

    out = jnp.zeros((cur.shape[0], steps), jnp.int32)
    cache, last, out, alive = jax.lax.fori_loop(0, steps, body, (cache, cur, out, alive))
    if turns is None:
        return cache, last, out, alive
    fresh = fields[6] != 0
    states = [jnp.where(fresh, turns[cur, fields[7]], fields[7])]
    for i in range(steps):  # one gather per step: the automaton's table is token-major
        states.append(turns[out[:, i], states[-1]])
    fed = jnp.where(fresh, cur, turns.shape[0] - 1)
    ends = turn_ends(jnp.stack(states, 1).astype(jnp.int32), counts, active, events)
    return cache, last, jnp.concatenate([fed[None], out.T, ends]), alive


def decoded_parts(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A decode call's output with a turn automaton (read to the host) as its block of tokens ``[1 + steps, rows]``
    and where the turns end ``[3, rows]`` (see :func:`_decode`)."""
    return out[:-3], out[-3:]


# ------------------------------------------------------------------------------------------------- the lane
@dataclasses.dataclass
class RowState:
    """A row that starts a turn: its member, its turn's sampling seed and the index of its next token."""

    member: tuple[int, int, bool]  # (version, index, perturbed)
    lo: int
    hi: int
    greedy: bool
    count: int = 0
    choices: Sequence[Sequence[int]] | None = None  # a constrained turn: the token ids of every reply it allows


@dataclasses.dataclass(frozen=True)
class LanePrograms:
    """What a lane runs on the device: ``prefill`` (prompts into new rows' caches, their first tokens), ``insert``
    (those rows into the lane's cache), ``decode`` (``steps`` tokens of every live row, their automaton states and
    turn ends), ``shift`` (the cache moved left to make room) and ``prepare`` (the rows' noise factors). The real
    programs by default; a stand-in for a device (``benchmarks/rollout.py``'s simulated accelerator) replaces them,
    and the lane's host bookkeeping runs as it is."""

    prefill: Callable[..., Any] = _prefill
    insert: Callable[..., Any] = _insert
    decode: Callable[..., Any] = _decode
    shift: Callable[..., Any] = _shift
    prepare: Callable[..., Any] = prepare_jit


#: the real programs
DEVICE_PROGRAMS = LanePrograms()


class Lane:
    """A KV cache of ``rows`` rows and ``length`` slots for one θ (see the module docstring).

    The host's bookkeeping (which rows are live, their members, positions) is one numpy array per field over the
    lane's rows, so a decode step costs the host the same few array operations however many rows are live; the
    device holds the cache and each row's next token to feed (its last one drawn), everything else a decode step
    needs is passed in per call. Rows not live hold position 0, count 0, seed 0, greedy and no member.

    ``turns``: a :class:`~esjax.agent.automaton.TurnAutomaton` table on the device, and its ``events``; with them
    each decode call also advances the rows' automaton states and finds where their turns end (see :func:`_decode`),
    so the host reads a call's tokens and turn ends at once.
    """

    #: per-row host fields and their dtypes (``greedy`` is True for rows not live; ``reserved``: handed out by
    #: :meth:`free_row`, not yet prefilled; ``fresh``: prefilled since the last decode call)
    _FIELDS = {"pos": np.int32, "count": np.int32, "lo": np.uint32, "hi": np.uint32, "greedy": bool, "live": bool,
               "reserved": bool, "fresh": bool, "start": np.int64, "version": np.int32, "index": np.int32,
               "perturbed": bool}

    def __init__(self, config: ModelConfig, rows: int, length: int, dtype: Any, sampling: Sampling,
                 turns: jax.Array | None = None, events: TurnEvents | None = None,
                 programs: LanePrograms = DEVICE_PROGRAMS):
        self.config = config
        self.programs = programs
        self.length = length
        self.dtype = dtype
        self.sampling = sampling
        self.turns, self.events = turns, events
        self.cache = init_cache(config, rows, length, dtype)
        self.index = 0  # the host's copy of cache['index']
        self.row = self._rows({name: self._blank(name, rows) for name in self._FIELDS})
        self._prepared_members: tuple[np.ndarray, ...] | None = None
        self._members_changed = True  # a row's member may differ from those of ``_prepared``
        self.prefill_calls = 0  # programs the last prefill ran (its rows in chunks of at most max_rows)
        self._prepared: Prepared | None = None
        self._cur = jnp.zeros(rows, jnp.int32)  # each row's next token to feed (device)
        # constrained turns (device, created by the first): [rows, width, length] reply ids, [rows, width] alive
        self.choices: jax.Array | None = None
        self.alive: jax.Array | None = None

    def _blank(self, name: str, rows: int) -> np.ndarray:
        return np.full(rows, name == "greedy", self._FIELDS[name])

    def _rows(self, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The per-row fields, the first four of :data:`DECODE_FIELDS` as views of one int32 array (``_packed``: a
        decode call copies them at once)."""
        self._packed = np.stack([values[name].view(np.int32) for name in DECODE_FIELDS[:4]])
        return {**values, **{name: self._packed[i].view(self._FIELDS[name]) for i, name in
                             enumerate(DECODE_FIELDS[:4])}}

    @property
    def rows(self) -> int:
        return int(self.cache["valid"].shape[0])

    def live_rows(self) -> np.ndarray:
        """The live lane rows, ascending."""
        return np.flatnonzero(self.row["live"])

    def free_row(self) -> int:
        """Reserve the lowest lane row neither live nor reserved (the caller prefills it next), growing the lane
        (doubling its rows) when it is full."""
        free = ~(self.row["live"] | self.row["reserved"])
        if free.any():
            r = int(np.argmax(free))
        else:
            r = old = self.rows
            grow = lambda x, axis: jnp.concatenate([x, jnp.zeros(x.shape[:axis] + (old,) + x.shape[axis + 1:],
                                                                 x.dtype)], axis=axis)
            self.cache = {"k": grow(self.cache["k"], 1), "v": grow(self.cache["v"], 1),
                          "valid": grow(self.cache["valid"], 0), "index": self.cache["index"]}
            self._cur = grow(self._cur, 0)
            self.row = self._rows({name: np.concatenate([values, self._blank(name, old)])
                                   for name, values in self.row.items()})
            self._prepared_members = None
            self._members_changed = True
            if self.choices is not None:
                self.choices = jnp.concatenate([self.choices, jnp.full_like(self.choices, -1)])
                self.alive = jnp.concatenate([self.alive, jnp.zeros_like(self.alive)])
        self.row["reserved"][r] = True
        return r

    def release(self, rows: int | np.ndarray) -> None:
        """Free lane row(s) ``rows`` (a row past the lane's end is ignored)."""
        rows = np.asarray(rows)
        rows = rows[rows < self.rows]
        if rows.size:
            for name, values in self.row.items():
                values[rows] = name == "greedy"
            self._members_changed = True

    def _perturbation(self, noise, sigma: float, params: Any, versions: Any, indices: Any, perturbed: Any
                      ) -> Prepared | None:
        if noise is None or not np.any(perturbed):
            return None
        return self.programs.prepare(Perturbation.create(noise, sigma, versions, indices, perturbed), params)

    def _make_room(self, prompt_len: int, steps: int, starting: Sequence[int] = ()) -> None:
        """Shift the cache so the write slot is at least ``prompt_len`` and ``steps`` more slots fit."""
        if self.index >= prompt_len and self.index + steps <= self.length:
            return
        staying = self.row["live"].copy()
        staying[list(starting)] = False
        first = int(self.row["start"][staying].min()) if staying.any() else None
        shift = min(self.index if first is None else first, self.index - prompt_len)
        if self.index - shift + steps > self.length:
            raise RuntimeError(f"decode lane of {self.length} slots cannot hold a {prompt_len}-token prompt and "
                               f"{steps} steps beside rows spanning {self.index - (first or 0)} slots")
        if shift:
            self.cache = self.programs.shift(self.cache, jnp.int32(shift))
            self.index -= shift
            self.row["start"][self.row["live"]] -= shift

    def prefill(self, params: Any, noise, sigma: float, entries: Sequence[tuple[int, list[int], RowState]],
                steps: int, row_buckets: int = 1, max_rows: int | None = None) -> jax.Array | None:
        """Start rows ``(lane row, prompt ids, state)``: prefill them and insert them at the write slot.

        ``state.count`` is the index of the token to draw (> 0 when the prompt ends with tokens generated
        earlier in the turn). ``max_rows``: most rows in one prefill program (rounded up to a power of two; None:
        all at once). A prefill holds f32 attention scores of ``[rows, heads, prompt, prompt]``, so this bounds a
        tick's memory: all 512 rows of a version starting at once peaked at ~5 GB on a 0.35M-parameter policy.
        Returns the sampled tokens ``[n]`` (a device array, not yet read).
        """
        if not entries:
            return None
        n = len(entries)
        n_b = max(next_power_of_two(n), row_buckets)
        plen = PREFILL_BUCKETS.length(max(len(ids) for _, ids, _ in entries))
        rows = np.array([r for r, _, _ in entries], np.int64)
        self._make_room(plen, steps, rows)
        tokens, mask = left_pad([ids for _, ids, _ in entries], n_b, plen)
        pad = lambda values, fill, dtype: np.asarray(list(values) + [fill] * (n_b - n), dtype)
        states = [s for _, _, s in entries]
        versions = pad((s.member[0] for s in states), 0, np.int32)
        indices = pad((s.member[1] for s in states), 0, np.int32)
        perturbed = pad((s.member[2] for s in states), False, bool)
        lo, hi = pad((s.lo for s in states), 0, np.uint32), pad((s.hi for s in states), 0, np.uint32)
        counts = pad((s.count for s in states), 0, np.int32)
        greedy = pad((s.greedy for s in states), True, bool)
        choices, alive = self._pack_choices(entries, n_b)
        into = pad(rows, self.rows, np.int32)  # out of range: dropped
        chunk = n_b if max_rows is None else min(n_b, next_power_of_two(max_rows))
        firsts = []
        for at in range(0, n, chunk):  # every chunk the same shape: one program; chunks of padding only skipped
            part = slice(at, at + chunk)
            prepared = self._perturbation(noise, sigma, params, versions[part], indices[part], perturbed[part])
            part_choices, part_alive = (None, None) if choices is None else (choices[part], alive[part])
            k_new, v_new, first, part_alive = self.programs.prefill(
                self.config, self.sampling, params, prepared, tokens[part], mask[part], lo[part], hi[part],
                counts[part], greedy[part], part_choices, part_alive)
            self.cache, self._cur = self.programs.insert(self.cache, k_new, v_new, mask[part], into[part], self._cur,
                                                         first)
            if self.choices is not None:
                if part_choices is None:  # free turns only: clear what earlier turns of these rows left
                    part_choices = np.full((chunk, *self.choices.shape[1:]), -1, np.int32)
                    part_alive = np.zeros((chunk, self.choices.shape[1]), bool)
                self.choices, self.alive = _insert_choices(self.choices, self.alive, into[part], part_choices,
                                                           part_alive)
            firsts.append(first)
        lengths = np.array([len(ids) for _, ids, _ in entries], np.int64)
        row = self.row
        row["live"][rows] = True
        row["reserved"][rows] = False
        row["fresh"][rows] = True
        row["start"][rows] = self.index - lengths
        row["pos"][rows] = lengths
        row["count"][rows] = counts[:n] + 1
        for name, values in (("lo", lo), ("hi", hi), ("greedy", greedy), ("version", versions), ("index", indices),
                             ("perturbed", perturbed)):
            row[name][rows] = values[:n]
        self._members_changed = True
        self.prefill_calls = len(firsts)
        return (firsts[0] if len(firsts) == 1 else jnp.concatenate(firsts))[:n]

    def _pack_choices(self, entries: Sequence[tuple[int, list[int], RowState]], n_b: int
                      ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The starting rows' choices ``[n_b, width, length]`` and which match each row's partial turn (None when
        no row is constrained); grows the lane's choice arrays to hold them (created by the first)."""
        lists = [state.choices or () for _, _, state in entries]
        if not any(lists):
            return None, None
        width = max(self.choices.shape[1] if self.choices is not None else 16, next_power_of_two(max(map(len, lists))))
        length = max(self.choices.shape[2] if self.choices is not None else 16,
                     next_power_of_two(max(len(c) for choices in lists for c in choices)))
        if self.choices is None:
            self.choices = jnp.full((self.rows, width, length), -1, jnp.int32)
            self.alive = jnp.zeros((self.rows, width), bool)
        elif self.choices.shape[1:] != (width, length):
            old_w, old_l = self.choices.shape[1:]
            self.choices = jnp.pad(self.choices, ((0, 0), (0, width - old_w), (0, length - old_l)), constant_values=-1)
            self.alive = jnp.pad(self.alive, ((0, 0), (0, width - old_w)))
        ids = np.full((n_b, width, length), -1, np.int32)
        alive = np.zeros((n_b, width), bool)
        for i, ((_, prompt, state), choices) in enumerate(zip(entries, lists)):
            if choices:
                partial = prompt[len(prompt) - state.count:] if state.count else []
                ids[i], alive[i] = pack_choices(choices, partial, width, length)
        return ids, alive

    def decode(self, params: Any, noise, sigma: float, steps: int, states: np.ndarray | None = None) -> jax.Array:
        """``steps`` decode steps for every live row; returns the tokens ``[rows, steps]`` (device, not yet read), or
        with :attr:`turns` the call's block of tokens and where the turns end, from the automaton ``states [rows]``
        before the call (:func:`decoded_parts` splits them)."""
        self._make_room(0, steps)
        row = self.row
        members = (row["version"], row["index"], row["perturbed"])
        if self._members_changed and (self._prepared_members is None or not all(
                np.array_equal(a, b) for a, b in zip(members, self._prepared_members))):
            self._prepared = self._perturbation(noise, sigma, params, *members)
            self._prepared_members = tuple(m.copy() for m in members)
        self._members_changed = False
        fields = np.empty((len(DECODE_FIELDS), self.rows), np.int32)  # new each call: the call may read it later
        fields[:4] = self._packed
        for i, name in enumerate(("live", "greedy", "fresh"), start=4):
            fields[i] = row[name]
        fields[7] = 0 if states is None else states
        row["fresh"][:] = False
        self.cache, self._cur, out, self.alive = self.programs.decode(
            self.config, self.sampling, params, self._prepared, self.cache, self._cur, fields, self.choices,
            self.alive, self.turns, self.events, steps=steps)
        self.index += steps
        np.add(self._packed[:2], steps, out=self._packed[:2], where=row["live"])  # pos, count
        return out


def generate_rows(config: ModelConfig, params: Any, prompts: Sequence[Sequence[int]], *, noise=None,
                  sigma: float = 0.0, members: Sequence[tuple[int, int, bool]] | None = None,
                  max_new_tokens: int = 16, sampling: Sampling = Sampling(), seeds: Sequence[int] | None = None,
                  greedy: Sequence[bool] | None = None, steps: int = 1, stop_ids: Sequence[int] = (),
                  choices: Sequence[Sequence[Sequence[int]] | None] | None = None) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` for each prompt through one lane (each row with its own member); a row
    ends after a token in ``stop_ids`` (included). ``seeds``: one 64-bit turn seed per row (default: the row);
    ``choices``: per row, the replies its turn allows (None: free)."""
    n = len(prompts)
    seeds = list(range(n)) if seeds is None else list(seeds)
    members = list(members or [(0, 0, False)] * n)
    greedy = list(greedy or [False] * n)
    lane = Lane(config, next_power_of_two(n), PREFILL_BUCKETS.length(max(map(len, prompts))) + max_new_tokens + steps,
                params["embed"]["embedding"].dtype, sampling)
    choices = list(choices or [None] * n)
    entries = [(r, list(p), RowState(members[r], *split_seed(seeds[r]), greedy[r], choices=choices[r]))
               for r, p in enumerate(prompts)]
    first = np.asarray(lane.prefill(params, noise, sigma, entries, steps))
    outs = [[int(t)] for t in first]
    stop = set(stop_ids)
    done = [out[-1] in stop for out in outs]
    while not all(done) and min(len(o) for o, d in zip(outs, done) if not d) < max_new_tokens:
        tokens = np.asarray(lane.decode(params, noise, sigma, steps))
        for r, row in enumerate(outs):
            for t in tokens[r]:
                if done[r] or len(row) >= max_new_tokens:
                    break
                row.append(int(t))
                done[r] = int(t) in stop
    return [row[:max_new_tokens] for row in outs]
