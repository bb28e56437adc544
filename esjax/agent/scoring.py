"""Candidate scoring: log-likelihood of K candidate continuations per prompt, per row's ES member.

The prompt is run once per row into a KV cache (left-padded, so every prompt ends at the same slot). A row's
candidates are then **packed** one after another into a single sequence on top of that cache: every
candidate token sees the prompt and the earlier tokens of its own candidate only (a segment mask ANDed with
the causal one), and its RoPE position restarts at the prompt's end. Packing computes each real candidate
token once: a ``[rows, K, longest]`` layout pads every candidate to the longest one and every row to the
largest K, which on WebShop pages (12 titles of 5–24 tokens; item pages with up to 50 short options)
computed three padded tokens per real one. The program returns per-token log-probs ``[rows, length]``;
the host sums them per candidate, so the candidate count is not part of the compiled shape. Log-probs go
through the output head in time chunks so ``rows × length × vocab`` logits are never all live. Each row
keeps its ES member; noise is generated once per member group.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from esjax.agent.batching import check_ids, left_pad, pad_perturbation, right_pad
from esjax.agent.buckets import DEFAULT_BUCKETS, Buckets
from esjax.model.config import ModelConfig
from esjax.model.decoder import default_positions, forward, init_cache, logits_from_hidden
from esjax.model.perturb import Perturbation, Prepared, prepare_jit
from esjax.model.sharding import put_batch, to_host

#: Upper bound on the float32 logits materialized at once by ``token_logprobs``.
LOGITS_CHUNK_BYTES = 32 << 20


def _time_chunk(rows: int, length: int, vocab: int) -> int:
    target = max(1, LOGITS_CHUNK_BYTES // max(1, rows * vocab * 4))
    chunk = 1
    for c in range(1, length + 1):
        if length % c == 0 and c <= target:
            chunk = c
    return chunk


def token_logprobs(config: ModelConfig, params: Any, hidden: jax.Array, targets: jax.Array,
                   prepared: Prepared | None) -> jax.Array:
    """``log p(targets[b, t] | hidden[b, t])`` for final-normed ``hidden [B, T, d]``, in time chunks."""
    B, T, _ = hidden.shape
    chunk = _time_chunk(B, T, config.vocab_size)
    h = jnp.moveaxis(hidden.reshape(B, T // chunk, chunk, -1), 1, 0)
    y = jnp.moveaxis(targets.reshape(B, T // chunk, chunk), 1, 0)

    def one(args):
        hc, yc = args
        logp = jax.nn.log_softmax(logits_from_hidden(config, params, hc, prepared), axis=-1)
        return jnp.take_along_axis(logp, yc[..., None], axis=-1)[..., 0]

    out = jax.lax.map(one, (h, y))  # [T/chunk, B, chunk]
    return jnp.moveaxis(out, 0, 1).reshape(B, T)


@functools.partial(jax.jit, static_argnames=("config",))
def _score_packed(config: ModelConfig, params, prepared: Prepared | None, p_tok, p_mask, c_tok, c_seg, c_off):
    """Per-token log-probs ``[rows, L]`` of packed candidates (``c_seg``: candidate index, -1 = padding;
    ``c_off``: offset in its candidate). ``prepared`` holds one noise draw per member group."""
    rows, plen = p_tok.shape
    length = c_tok.shape[1]
    dtype = params["embed"]["embedding"].dtype
    cache = init_cache(config, rows, plen + length, dtype)
    hidden_p, cache = forward(config, params, p_tok, default_positions(p_mask), p_mask, cache, prepared,
                              return_hidden=True)
    c_mask = c_seg >= 0
    c_pos = p_mask.sum(axis=1).astype(jnp.int32)[:, None] + c_off
    own_segment = c_seg[:, :, None] == c_seg[:, None, :]  # [rows, L, L]
    visible = jnp.concatenate([jnp.ones((rows, length, plen), bool), own_segment], axis=2)
    hidden_c, _ = forward(config, params, c_tok, c_pos, c_mask, cache, prepared, visible=visible,
                          return_hidden=True)
    last = hidden_p[:, -1:]  # predicts every candidate's first token
    previous = jnp.concatenate([last, hidden_c[:, :-1]], axis=1)
    pred = jnp.where((c_off == 0)[..., None], last, previous)
    logp = token_logprobs(config, params, pred, c_tok, prepared)
    return jnp.where(c_mask, logp, 0.0)


@functools.partial(jax.jit, static_argnames=("config",))
def _score_full_sequence(config: ModelConfig, params, prepared: Prepared | None, p_tok, p_mask, c_tok, c_mask):
    rows, plen = p_tok.shape
    _, K, clen = c_tok.shape
    tok = jnp.concatenate([jnp.repeat(p_tok, K, axis=0), c_tok.reshape(rows * K, clen)], axis=1)
    mask = jnp.concatenate([jnp.repeat(p_mask, K, axis=0), c_mask.reshape(rows * K, clen)], axis=1)
    hidden, _ = forward(config, params, tok, default_positions(mask), mask, None, prepared, return_hidden=True)
    pred = hidden[:, plen - 1:-1]
    logp = token_logprobs(config, params, pred, tok[:, plen:], prepared)
    return jnp.where(mask[:, plen:], logp, 0.0).sum(axis=1).reshape(rows, K)


ScoreNorm = Literal["sum", "mean"]


def normalize_scores(summed: Any, lengths: Any, norm: ScoreNorm) -> Any:
    """Summed candidate log-likelihoods → the policy's scores: ``'sum'`` as is, ``'mean'`` per token.

    Summing favours short candidates by construction (every token costs log-probability), so a two-token
    ``next page`` outscores any long product title; the per-token mean compares candidates of different
    lengths on one scale. Works on numpy and jax arrays (the pretraining loss uses the same function).
    """
    if norm == "sum":
        return summed
    if norm == "mean":
        return summed / np.maximum(lengths, 1) if isinstance(summed, np.ndarray) else \
            summed / jnp.maximum(lengths, 1)
    raise ValueError(f"score norm must be 'sum' or 'mean', got {norm!r}")


@dataclasses.dataclass
class PendingScores:
    """Scores of a dispatched policy call; :meth:`result` waits for the device and finishes them on the host.

    JAX dispatches asynchronously, so a caller can pad and dispatch its next call while this one computes.
    ``out`` is per-token log-probs ``[rows, L]`` of packed candidates (summed here per candidate) or, for the
    full-sequence reference, per-candidate sums ``[rows, K]``.
    """

    out: Any
    rows: int
    candidate_lengths: list[list[int]]
    norm: ScoreNorm
    shape: dict[str, int]
    packed: bool = True

    def result(self) -> np.ndarray:
        k_max = max([len(c) for c in self.candidate_lengths] + [1])
        if self.out is None:
            return np.zeros((0, 0), np.float32)
        raw = to_host(self.out).astype(np.float32, copy=False)
        scores = np.full((self.rows, k_max), -np.inf, np.float32)  # missing candidates stay -inf
        for r, lens in enumerate(self.candidate_lengths):
            if not lens:
                continue
            lengths = np.asarray(lens, np.int64)
            if self.packed:  # candidate k of row r: the slice [start_k, start_k + len_k) of its row (padding is 0)
                sums = np.add.reduceat(np.append(raw[r], np.float32(0)), np.cumsum(lengths) - lengths)
                summed = np.where(lengths > 0, sums, 0.0).astype(np.float32)  # reduceat of an empty slice
            else:
                summed = raw[r, : len(lens)]
            scores[r, : len(lens)] = normalize_scores(summed, lengths.astype(np.float32), self.norm)
        return scores


@dataclasses.dataclass(frozen=True)
class ScoringPrograms:
    """What a scoring call runs on the device: ``prepare(perturbation, params)`` (the rows' noise factors, once per
    call) and ``score(config, params, prepared, p_tok, p_mask, c_tok, c_seg, c_off)`` (the packed-candidate program,
    whose output :class:`PendingScores` reads). The real programs by default; a stand-in for a device (the
    simulated accelerator of ``benchmarks/rollout.py``) or a recorder of call shapes replaces them, and everything
    around the call (padding, bucketing, reading the scores) runs as it is."""

    score: Callable[..., Any] = _score_packed
    prepare: Callable[..., Any] = prepare_jit


#: the real programs
DEVICE_PROGRAMS = ScoringPrograms()


def dispatch_scores(config: ModelConfig, params: Any, prompt_ids: Sequence[Sequence[int]],
                    candidate_ids: Sequence[Sequence[Sequence[int]]], perturbation: Perturbation | None = None, *,
                    buckets: Buckets = DEFAULT_BUCKETS, prefix_cache: bool = True,
                    norm: ScoreNorm = "sum", programs: ScoringPrograms = DEVICE_PROGRAMS) -> PendingScores:
    """:func:`score_candidates` without waiting: pads, dispatches the program and returns its pending scores.
    ``programs``: what runs on the device (:class:`ScoringPrograms`; the full-sequence reference always runs the
    real one).

    ``PendingScores.shape`` holds the padded call shape (``rows``, ``prompt_len``, ``candidate_len``: the
    packed candidate tokens per row, or candidates × longest candidate for the full-sequence reference) and
    ``padded_tokens`` (tokens the program computes), for throughput accounting.
    """
    rows = len(prompt_ids)
    if len(candidate_ids) != rows:
        raise ValueError(f"score_candidates: {rows} prompts but {len(candidate_ids)} candidate lists")
    if norm not in ("sum", "mean"):
        raise ValueError(f"score norm must be 'sum' or 'mean', got {norm!r}")
    cand_lengths = [[len(c) for c in cands] for cands in candidate_ids]
    if rows == 0:
        return PendingScores(None, 0, [], norm, {})
    check_ids(prompt_ids, config.vocab_size, "prompt_ids")
    try:  # one pass over every row's candidates; row by row only to name a bad one
        check_ids([c for cands in candidate_ids for c in cands], config.vocab_size, "candidates", allow_empty=True)
    except ValueError:
        for r, cands in enumerate(candidate_ids):
            check_ids(cands, config.vocab_size, f"candidate_ids[{r}]", allow_empty=True)
        raise
    group = 1 if perturbation is None else perturbation.group_size
    rows_b = buckets.row(rows, multiple=group)
    plen = buckets.length(max(len(p) for p in prompt_ids))
    p_tok, p_mask = left_pad(prompt_ids, rows_b, plen)
    pert = pad_perturbation(perturbation, rows, rows_b)
    prepared = None if pert is None else programs.prepare(pert, params)
    if prefix_cache:
        c_tok, c_seg, c_off = pack_candidates(candidate_ids, cand_lengths, rows_b, buckets)
        arrays, fn = (p_tok, p_mask, c_tok, c_seg, c_off), programs.score
        cand_tokens = c_tok.shape[1]
    else:
        k_b = buckets.candidate(max(max(len(c) for c in cand_lengths), 1))
        clen = buckets.length(max([n for lens in cand_lengths for n in lens] + [1]))
        flat = [list(c) for cands in candidate_ids for c in list(cands) + [[]] * (k_b - len(cands))]
        flat += [[]] * ((rows_b - rows) * k_b)
        c_tok, c_mask = right_pad(flat, rows_b * k_b, clen)
        arrays = (p_tok, p_mask, c_tok.reshape(rows_b, k_b, clen), c_mask.reshape(rows_b, k_b, clen))
        fn, cand_tokens = _score_full_sequence, k_b * clen
    shape = {"rows": rows_b, "prompt_len": plen, "candidate_len": cand_tokens,
             "padded_tokens": rows_b * (plen + cand_tokens)}
    out = fn(config, params, prepared, *(put_batch(a) for a in arrays))
    return PendingScores(out, rows, cand_lengths, norm, shape, packed=prefix_cache)


def pack_candidates(candidate_ids: Sequence[Sequence[Sequence[int]]], lengths: Sequence[Sequence[int]], rows: int,
                    buckets: Buckets) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's candidates back to back: ``tokens``, ``segment`` (candidate index; -1 = padding) and
    ``offset`` (position in the candidate), each ``[rows, L]`` with ``L`` the bucket of the longest row."""
    totals = [sum(lens) for lens in lengths]
    length = buckets.length(max(totals + [1]))
    tokens = np.zeros((rows, length), np.int32)
    segment = np.full((rows, length), -1, np.int32)
    offset = np.zeros((rows, length), np.int32)
    for r, (cands, lens, total) in enumerate(zip(candidate_ids, lengths, totals)):
        if not total:
            continue
        lens = np.asarray(lens, np.int64)
        starts = np.cumsum(lens) - lens
        tokens[r, :total] = np.fromiter(itertools.chain.from_iterable(cands), np.int32, total)
        segment[r, :total] = np.repeat(np.arange(len(lens), dtype=np.int32), lens)
        offset[r, :total] = np.arange(total) - np.repeat(starts, lens)
    return tokens, segment, offset


def score_candidates(config: ModelConfig, params: Any, prompt_ids: Sequence[Sequence[int]],
                     candidate_ids: Sequence[Sequence[Sequence[int]]], perturbation: Perturbation | None = None, *,
                     buckets: Buckets = DEFAULT_BUCKETS, prefix_cache: bool = True,
                     norm: ScoreNorm = "sum") -> np.ndarray:
    """Log-likelihood of each candidate given its row's prompt, summed or per token: ``float32 [rows, max K]``.

    Args:
      prompt_ids: one non-empty token list per row.
      candidate_ids: per row, a list of candidate token lists (rows may have different counts; missing
        entries score ``-inf``; an empty candidate scores 0).
      perturbation: per-row members (``rows`` rows), or None for the plain model.
      buckets: padding policy for rows, prompt / candidate lengths and candidate counts.
      prefix_cache: False runs every prompt+candidate as a full sequence (the reference / baseline).
      norm: ``'sum'`` of the candidate's token log-probs, or their ``'mean'`` (see :func:`normalize_scores`).
    """
    return dispatch_scores(config, params, prompt_ids, candidate_ids, perturbation, buckets=buckets,
                           prefix_cache=prefix_cache, norm=norm).result()
