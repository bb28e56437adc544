"""Candidate scoring: log-likelihood of K candidate continuations per prompt, per row's ES member.

The prompt is run once per row into a KV cache (left-padded, so every prompt ends at the same slot); the
cache is repeated for the row's K candidates, which run together in one batch (right-padded) on top of it.
Each candidate row keeps its prompt row's member, and noise is generated once per member group. Log-probs
go through the output head in time chunks so ``rows × K × length × vocab`` logits are never all live.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from esjax.agent.batching import check_ids, left_pad, pad_perturbation, right_pad
from esjax.agent.buckets import DEFAULT_BUCKETS, Buckets
from esjax.model.config import ModelConfig
from esjax.model.decoder import default_positions, forward, init_cache, logits_from_hidden
from esjax.model.perturb import Perturbation, Prepared, prepare_jit
from esjax.model.sharding import put_batch

#: Upper bound on the float32 logits materialized at once by ``token_logprobs``.
LOGITS_CHUNK_BYTES = 256 << 20


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
def _score_prefix_cached(config: ModelConfig, params, prepared: Prepared | None, p_tok, p_mask, c_tok, c_mask):
    """``prepared`` holds one noise draw per member group, shared by the prompt and its candidates."""
    rows, plen = p_tok.shape
    _, K, clen = c_tok.shape
    dtype = params["embed"]["embedding"].dtype
    cache = init_cache(config, rows, plen + clen, dtype)
    hidden_p, cache = forward(config, params, p_tok, default_positions(p_mask), p_mask, cache, prepared,
                              return_hidden=True)
    last = jnp.repeat(hidden_p[:, -1:], K, axis=0)  # predicts each candidate's first token
    cache = {"k": jnp.repeat(cache["k"], K, axis=1), "v": jnp.repeat(cache["v"], K, axis=1),
             "valid": jnp.repeat(cache["valid"], K, axis=0), "index": cache["index"]}
    prompt_len = p_mask.sum(axis=1).astype(jnp.int32)
    c_pos = jnp.repeat(prompt_len, K)[:, None] + jnp.arange(clen, dtype=jnp.int32)[None]
    c_tok = c_tok.reshape(rows * K, clen)
    c_mask = c_mask.reshape(rows * K, clen)
    hidden_c, _ = forward(config, params, c_tok, c_pos, c_mask, cache, prepared, return_hidden=True)
    pred = jnp.concatenate([last, hidden_c[:, :-1]], axis=1)
    logp = token_logprobs(config, params, pred, c_tok, prepared)
    return jnp.where(c_mask, logp, 0.0).sum(axis=1).reshape(rows, K)


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
    """

    out: Any
    rows: int
    candidate_lengths: list[list[int]]
    norm: ScoreNorm
    shape: dict[str, int]

    def result(self) -> np.ndarray:
        k_max = max([len(c) for c in self.candidate_lengths] + [1])
        if self.out is None:
            return np.zeros((0, 0), np.float32)
        raw = np.asarray(jax.device_get(self.out), np.float32)
        scores = np.full((self.rows, k_max), -np.inf, np.float32)  # missing candidates stay -inf
        for r, lens in enumerate(self.candidate_lengths):
            scores[r, : len(lens)] = normalize_scores(raw[r, : len(lens)], np.asarray(lens, np.float32), self.norm)
        return scores


def dispatch_scores(config: ModelConfig, params: Any, prompt_ids: Sequence[Sequence[int]],
                    candidate_ids: Sequence[Sequence[Sequence[int]]], perturbation: Perturbation | None = None, *,
                    buckets: Buckets = DEFAULT_BUCKETS, prefix_cache: bool = True,
                    norm: ScoreNorm = "sum") -> PendingScores:
    """:func:`score_candidates` without waiting: pads, dispatches the program and returns its pending scores.

    ``PendingScores.shape`` holds the padded call shape (``rows``, ``prompt_len``, ``candidates``,
    ``candidate_len``) and ``padded_tokens`` (tokens the program computes), for throughput accounting.
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
    for r, cands in enumerate(candidate_ids):
        check_ids(cands, config.vocab_size, f"candidate_ids[{r}]", allow_empty=True)
    k_max = max(max(len(c) for c in cand_lengths), 1)
    group = 1 if perturbation is None else perturbation.group_size
    rows_b = buckets.row(rows, multiple=group)
    k_b = buckets.candidate(k_max)
    plen = buckets.length(max(len(p) for p in prompt_ids))
    clen = buckets.length(max([n for lens in cand_lengths for n in lens] + [1]))
    shape = {"rows": rows_b, "prompt_len": plen, "candidates": k_b, "candidate_len": clen,
             "padded_tokens": rows_b * (plen + k_b * clen)}

    p_tok, p_mask = left_pad(prompt_ids, rows_b, plen)
    flat = [list(c) for cands in candidate_ids for c in list(cands) + [[]] * (k_b - len(cands))]
    flat += [[]] * ((rows_b - rows) * k_b)
    c_tok, c_mask = right_pad(flat, rows_b * k_b, clen)
    c_tok = c_tok.reshape(rows_b, k_b, clen)
    c_mask = c_mask.reshape(rows_b, k_b, clen)
    pert = pad_perturbation(perturbation, rows, rows_b)
    fn = _score_prefix_cached if prefix_cache else _score_full_sequence
    prepared = None if pert is None else prepare_jit(pert, params)
    out = fn(config, params, prepared, *(put_batch(a) for a in (p_tok, p_mask, c_tok, c_mask)))
    return PendingScores(out, rows, cand_lengths, norm, shape)


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
