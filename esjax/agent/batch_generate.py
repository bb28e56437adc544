"""Static-batch generation from a KV cache (the batch runs until its last row stops; generate mode's rollouts use
the continuous decode lanes of :mod:`esjax.agent.lanes`): greedy / temperature / top-p, stop tokens and stop strings.

Prompts are left-padded into one bucketed batch and prefilled once; decoding then runs inside a jitted
``lax.while_loop`` (exits early when every row has stopped). Stop *token ids* are checked on device;
stop *strings* need detokenization, so with stop strings the loop returns to the host every
``check_every`` tokens, rows whose text contains a stop string are marked done, and decoding resumes with
the same compiled program. Each row keeps its ES member for the whole generation; its noise is drawn
once per ``generate`` call (``prepare_jit``) and dropped at the end, never stored.

Sampling keys: row ``r`` draws token ``n`` with ``fold_in(row_key_r, n)``, where ``row_key_r`` is
``fold_in(key(seed), r)`` for one int ``seed``, or ``key(seed[r])`` for one seed per row (e.g. the same seed
for every member on a task: common random numbers).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from esjax.agent.batching import check_ids, left_pad, pad_perturbation
from esjax.agent.buckets import DEFAULT_BUCKETS, Buckets, next_power_of_two
from esjax.model.config import ModelConfig
from esjax.model.decoder import default_positions, forward, forward_last, init_cache
from esjax.model.perturb import Perturbation, prepare_jit
from esjax.model.sharding import put_batch


def top_p_filter(logits: jax.Array, top_p: jax.Array | float) -> jax.Array:
    """``logits [B, V]`` with every token outside the nucleus (the smallest set of most likely tokens whose
    probability reaches ``top_p``) set to -inf."""
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each sorted token
    keep = before < top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= threshold, logits, -jnp.inf)


def sample_tokens(logits: jax.Array, keys: jax.Array, step: jax.Array, temperature: jax.Array, top_p: jax.Array,
                  greedy: bool, use_top_p: bool) -> jax.Array:
    """One token per row from float32 ``logits [B, V]``; ``keys [B]`` typed PRNG keys."""
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / jnp.maximum(temperature, 1e-6)
    if use_top_p:
        logits = top_p_filter(logits, top_p)
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)
    return jax.vmap(jax.random.categorical)(step_keys, logits).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("config", "cache_len", "greedy", "use_top_p"))
def _prefill(config: ModelConfig, params, perturbation, tokens, mask, keys, temperature, top_p, stop_ids, *,
             cache_len: int, greedy: bool, use_top_p: bool):
    rows = tokens.shape[0]
    cache = init_cache(config, rows, cache_len, params["embed"]["embedding"].dtype)
    positions = default_positions(mask)
    logits, cache = forward_last(config, params, tokens, positions, mask, cache, perturbation)
    first = sample_tokens(logits, keys, jnp.zeros((), jnp.int32), temperature, top_p, greedy, use_top_p)
    next_pos = positions[:, -1] + 1
    return cache, first, next_pos, jnp.isin(first, stop_ids)


@functools.partial(jax.jit, static_argnames=("config", "greedy", "use_top_p"), donate_argnames=("cache", "out"))
def _decode(config: ModelConfig, params, perturbation, cache, out, pos, done, n, limit, keys, temperature, top_p,
            stop_ids, *, greedy: bool, use_top_p: bool):
    """Generate tokens ``n .. limit-1`` (``out[:, n-1]`` is the last sampled, not yet fed, token)."""
    prepared = perturbation  # already prepared once per generate call (see prepare_jit)
    rows = out.shape[0]
    ones = jnp.ones((rows, 1), bool)

    def cond(state):
        _, _, _, done, n = state
        return (n < limit) & ~jnp.all(done)

    def body(state):
        cache, out, pos, done, n = state
        cur = jax.lax.dynamic_index_in_dim(out, n - 1, axis=1, keepdims=True)
        logits, cache = forward(config, params, cur, pos[:, None], ones, cache, prepared)
        tok = sample_tokens(logits[:, -1], keys, n, temperature, top_p, greedy, use_top_p)
        tok = jnp.where(done, 0, tok)
        out = jax.lax.dynamic_update_index_in_dim(out, tok, n, axis=1)
        done = done | jnp.isin(tok, stop_ids)
        return cache, out, pos + 1, done, n + 1

    return jax.lax.while_loop(cond, body, (cache, out, pos, done, n))


def _row_keys(seed: int | Sequence[int], rows: int, padded_rows: int) -> jax.Array:
    if isinstance(seed, int | np.integer):
        base = jax.random.key(int(seed))
        return jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(padded_rows))
    seeds = [int(s) for s in seed]
    if len(seeds) != rows:
        raise ValueError(f"generate: {len(seeds)} seeds for {rows} rows")
    seeds += [0] * (padded_rows - rows)
    return jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))


def _stop_index(tokens: list[int], stop: Sequence[str], tokenizer: Any) -> int | None:
    """Length of the shortest prefix of ``tokens`` whose text contains a stop string (None: no stop)."""
    text = tokenizer.decode(tokens)
    if not any(s in text for s in stop):
        return None
    for n in range(1, len(tokens) + 1):
        prefix = tokenizer.decode(tokens[:n])
        if any(s in prefix for s in stop):
            return n
    return len(tokens)


def generate(config: ModelConfig, params: Any, prompt_ids: Sequence[Sequence[int]],
             perturbation: Perturbation | None = None, *, max_new_tokens: int = 32, temperature: float = 0.0,
             top_p: float = 1.0, stop: Sequence[str] = (), stop_token_ids: Sequence[int] | None = None,
             tokenizer: Any = None, seed: int | Sequence[int] = 0, buckets: Buckets = DEFAULT_BUCKETS,
             check_every: int = 8) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` per row; returns the new token ids of each row.

    A row ends after a stop token (included in its output; default ``config.eos_token_ids``) or after the
    token that completes a stop string (included; the caller cuts the text). ``temperature == 0`` is
    greedy; ``top_p < 1`` samples from the nucleus. Stop strings need ``tokenizer`` (anything with
    ``decode(list[int]) -> str``, e.g. ``tokenizers.Tokenizer``).
    """
    rows = len(prompt_ids)
    if rows == 0:
        return []
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    if stop and tokenizer is None:
        raise ValueError("generate: stop strings need a tokenizer (anything with .decode(ids))")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"generate: need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    check_ids(prompt_ids, config.vocab_size, "prompt_ids")
    group = 1 if perturbation is None else perturbation.group_size
    rows_b = buckets.row(rows, multiple=group)
    plen = buckets.length(max(len(p) for p in prompt_ids))
    new_b = buckets.length(max_new_tokens)
    stop_ids = list(config.eos_token_ids if stop_token_ids is None else stop_token_ids)
    stop_arr = np.full((next_power_of_two(max(len(stop_ids), 1)),), -1, np.int32)
    stop_arr[: len(stop_ids)] = stop_ids
    greedy, use_top_p = temperature == 0, (temperature > 0 and top_p < 1)

    tokens, mask = left_pad(prompt_ids, rows_b, plen)
    pert = pad_perturbation(perturbation, rows, rows_b)
    pert = None if pert is None else prepare_jit(pert, params)
    keys = _row_keys(seed, rows, rows_b)
    temp = jnp.asarray(temperature, jnp.float32)
    top = jnp.asarray(top_p, jnp.float32)
    stop_j = jnp.asarray(stop_arr)
    cache, first, pos, done = _prefill(config, params, pert, put_batch(tokens), put_batch(mask), keys, temp, top,
                                       stop_j, cache_len=plen + new_b, greedy=greedy, use_top_p=use_top_p)
    out = jnp.zeros((rows_b, new_b), jnp.int32).at[:, 0].set(first)
    done = done | (jnp.arange(rows_b) >= rows)
    n = 1
    stop_at: dict[int, int] = {}
    while True:
        if stop:
            host_out = np.asarray(out)
            host_done = np.array(done)
            for r in range(rows):
                if r not in stop_at and not host_done[r]:
                    cut = _stop_index(host_out[r, :n].tolist(), stop, tokenizer)
                    if cut is not None:
                        stop_at[r] = cut
                        host_done[r] = True
            done = jnp.asarray(host_done)
        if n >= max_new_tokens or bool(jnp.all(done)):
            break
        limit = min(n + check_every, max_new_tokens) if stop else max_new_tokens
        cache, out, pos, done, n_arr = _decode(config, params, pert, cache, out, pos, done, jnp.int32(n),
                                               jnp.int32(limit), keys, temp, top, stop_j, greedy=greedy,
                                               use_top_p=use_top_p)
        n = int(n_arr)
    host_out = np.asarray(out)
    results = []
    stop_set = set(stop_ids)
    for r in range(rows):
        seq = host_out[r, : min(n, max_new_tokens)].tolist()
        for i, t in enumerate(seq):
            if t in stop_set:
                seq = seq[: i + 1]
                break
        if r in stop_at:
            seq = seq[: stop_at[r]]
        results.append(seq)
    return results
