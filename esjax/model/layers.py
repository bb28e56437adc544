"""Building blocks of the decoder, ES-aware: every op takes optional per-group noise.

Activations have a leading row axis ``B``; per-group noise has a leading group axis ``G`` with
``B = G * rows_per_group`` (rows of a group are contiguous). A ``LowRank`` kernel noise is applied off one
shared base matmul, ``x W + sigma (x A_g) B_gᵀ / √r`` (``esjax.es.noise.lowrank_matmul``'s arithmetic: the term is
its :func:`~esjax.es.noise.lowrank_delta`), with the ``x A_g`` products of the layers that read the same ``x`` in
one matmul (:func:`dense_shared_input`); dense deltas (norm scales, biases) are added per group.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from esjax.es.noise import lowrank_delta, lowrank_embed
from esjax.model.config import ModelConfig
from esjax.model.perturb import LowRank

_NEG = -0.7 * float(np.finfo(np.float32).max)


def _group(x: jax.Array, groups: int) -> jax.Array:
    return x.reshape(groups, x.shape[0] // groups, *x.shape[1:])


def _ungroup(x: jax.Array) -> jax.Array:
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def add_delta(x: jax.Array, delta: jax.Array | None) -> jax.Array:
    """``x [B, ..., n] + delta [G, n]`` with rows grouped ``G``-ways (delta None: x)."""
    if delta is None:
        return x
    g = _group(x, delta.shape[0])
    d = delta.reshape(delta.shape[0], *(1,) * (g.ndim - 2), delta.shape[-1]).astype(x.dtype)
    return _ungroup(g + d)


#: The shared-matmul path of :func:`_factor_products` (every row times every group's factor) is taken while its
#: extra ``groups * rank`` columns are at most this fraction of the base matmuls' output columns (so at most
#: this fraction more matmul work); beyond it, a per-group batched product.
SHARED_COLUMNS_FRACTION = 1 / 16


def _own_slot(values: jax.Array, groups: int) -> jax.Array:
    """``[G, R, .., G, k] -> [G, R, .., k]``: each group's own slot ``values[g, ..., g, :]`` (a gather, exact).

    Not a select-and-sum: XLA (CPU) fuses that, with the rank-1 terms, into the base matmuls' YNN epilogues,
    which here run slower than the base matmul plus the elementwise pass that follows it anyway.
    """
    index = jnp.arange(groups).reshape(groups, *(1,) * (values.ndim - 1))
    index = jnp.broadcast_to(index, (*values.shape[:-2], 1, values.shape[-1]))
    return jnp.take_along_axis(values, index, axis=-2, mode="promise_in_bounds")[..., 0, :]


def _factor_products(x: jax.Array, factor: jax.Array, out_columns: int) -> jax.Array:
    """``x_g @ F_g`` per group of rows: ``x [B, ..., m]``, ``factor [G, m, r]`` -> ``[G, B/G, ..., r]``.

    ``out_columns``: output columns of the base matmul(s) on the same ``x`` (the work to compare with).
    With few groups this is one matmul of all rows against all groups' factors (``[B.., m] @ [m, G*r]``),
    each row then keeping its own group's columns. Why: ``x`` then reaches this matmul in the same layout
    as the base matmul ``x @ W``, so XLA computes ``x`` (e.g. ``silu(gate) * up``, ``rms_norm(h)``) once;
    a per-group batched product needs ``x`` regrouped, and XLA (CPU) recomputes the whole producer of ``x``
    for that second layout. The sums over ``m`` run in another order than in the batched product (float
    reassociation: ~1e-7 relative on ``x A``).
    """
    groups, m, rank = factor.shape
    x = x.astype(factor.dtype)
    if groups * rank > SHARED_COLUMNS_FRACTION * out_columns:
        return jnp.einsum("g...m,gmr->g...r", _group(x, groups), factor)
    columns = jnp.moveaxis(factor, 0, 1).reshape(m, groups * rank)  # column g*r+k = factor[g, :, k]
    every = _group(x @ columns, groups)  # [G, R, .., G*r]
    return _own_slot(every.reshape(*every.shape[:-1], groups, rank), groups)


#: One linear layer for :func:`dense_shared_input`: ``(kernel [m, n], bias [n] | None, kernel noise
#: LowRank | None, bias noise [G, n] | None)``.
Linear = tuple


def dense_shared_input(x: jax.Array, linears: list[Linear], sigma: jax.Array) -> list[jax.Array]:
    """Several :func:`dense` layers on the same input (q/k/v; gate/up) with one ``x A`` product for all.

    Each output is ``x @ (W + sigma*eps_group) + (b + delta_group)``; the base matmuls stay separate (the
    plain model's), the members' ``x A_g`` of all perturbed kernels come from one matmul.
    """
    ys = [x @ kernel for kernel, *_ in linears]
    perturbed = [i for i, (_, _, noise, _) in enumerate(linears) if noise is not None]
    if perturbed:
        factors = jnp.concatenate([linears[i][2].a for i in perturbed], axis=-1)  # [G, m, sum of ranks]
        xa = _factor_products(x, factors, sum(linears[i][0].shape[-1] for i in perturbed))
        offset = 0
        for i in perturbed:
            a, b = linears[i][2]
            rank = a.shape[-1]
            delta = lowrank_delta(xa[..., offset:offset + rank], b, sigma)
            ys[i] = ys[i] + _ungroup(delta).astype(ys[i].dtype)
            offset += rank
    for i, (_, bias, _, bias_noise) in enumerate(linears):
        if bias is not None:
            ys[i] = add_delta(ys[i] + bias, bias_noise)
    return ys


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, kernel_noise: LowRank | None,
          bias_noise: jax.Array | None, sigma: jax.Array) -> jax.Array:
    """``x @ (W + sigma*eps_group) + (b + delta_group)`` with the low-rank term off the shared base matmul:
    ``x W + sigma (x A_g) B_gᵀ / √r`` (as ``esjax.es.noise.lowrank_matmul``, through its ``lowrank_delta``)."""
    return dense_shared_input(x, [(kernel, bias, kernel_noise, bias_noise)], sigma)[0]


def embed(tokens: jax.Array, table: jax.Array, noise: LowRank | None, sigma: jax.Array) -> jax.Array:
    """Token embedding; the low-rank perturbation is a row gather of ``A`` (``lowrank_embed``)."""
    if noise is None:
        return jnp.take(table, tokens, axis=0)
    groups = noise.a.shape[0]
    return _ungroup(lowrank_embed(_group(tokens, groups), table, noise.a, noise.b, sigma))


def tied_head(x: jax.Array, table: jax.Array, noise: LowRank | None, sigma: jax.Array) -> jax.Array:
    """``x @ (E + sigma*A Bᵀ/√r)ᵀ`` without transposing ``E``: ``x Eᵀ + sigma (x B) Aᵀ / √r``.

    With many tokens, the rank-r term goes into the base matmul's contraction: ``[x, s] @ [E, A_cols]ᵀ``
    with ``A_cols [vocab, G*r]`` every group's ``A`` and ``s [B.., G*r]`` each row's ``sigma (x B_g) / √r``
    in its own group's columns (zeros elsewhere). That saves a pass over the ``[B.., vocab]`` logits (read,
    add, write) for a copy of ``E`` widened by ``G*r`` columns (and ``G*r / hidden`` more matmul work), so it
    is used while the rows outnumber the widened table's width and ``G*r`` is at most
    ``SHARED_COLUMNS_FRACTION`` of ``hidden``; rows of unperturbed groups add exact zeros.
    """
    if noise is None:
        return jnp.einsum("...d,vd->...v", x, table)
    groups, vocab, rank = noise.a.shape
    xb = _factor_products(x, noise.b, vocab)  # [G, R, .., r]
    hidden = x.shape[-1]
    if x.size // hidden <= hidden + groups * rank or groups * rank > SHARED_COLUMNS_FRACTION * hidden:
        base = jnp.einsum("...d,vd->...v", x, table)
        return base + _ungroup(lowrank_delta(xb, noise.a, sigma)).astype(base.dtype)
    scale = sigma / math.sqrt(rank)
    own = jnp.arange(groups).reshape(groups, *(1,) * (xb.ndim - 2), 1, 1) == jnp.arange(groups)[:, None]
    spread = jnp.where(own, (xb * scale)[..., None, :], 0).reshape(*xb.shape[:-1], groups * rank)
    columns = jnp.moveaxis(noise.a, 0, 1).reshape(vocab, groups * rank)
    wide_x = jnp.concatenate([x, _ungroup(spread).astype(x.dtype)], axis=-1)
    wide_table = jnp.concatenate([table, columns.astype(table.dtype)], axis=-1)
    return jnp.einsum("...d,vd->...v", wide_x, wide_table)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, scale_noise: jax.Array | None = None) -> jax.Array:
    """RMSNorm computed in float32, then ``scale * x`` in the activation dtype (as Hugging Face does)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    normed = normed.astype(x.dtype)
    if scale_noise is None:
        return scale.astype(x.dtype) * normed
    groups = scale_noise.shape[0]
    s = (scale[None].astype(jnp.float32) + scale_noise).astype(x.dtype)  # [G, d]
    g = _group(normed, groups)
    return _ungroup(s.reshape(groups, *(1,) * (g.ndim - 2), -1) * g)


# ---------------------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------------------


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies (float32, ``[head_dim/2]``) incl. llama3 / linear scaling, as transformers computes."""
    dim = config.head_dim
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (1.0 / (np.float32(config.rope_theta) ** exponent)).astype(np.float32)
    s = config.rope_scaling
    if s is None:
        return inv_freq
    if s.kind == "linear":
        return (inv_freq / np.float32(s.factor)).astype(np.float32)
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor
                                                                                   - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``cos, sin`` of shape ``[B, T, head_dim]`` (float32) for integer ``positions [B, T]``."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(config))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE on ``x [B, T, heads, head_dim]`` in x's dtype."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


# ---------------------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------------------


def attention(q: jax.Array, k: jax.Array, v: jax.Array, q_slots: jax.Array, k_valid: jax.Array,
              visible: jax.Array | None = None) -> jax.Array:
    """Grouped-query causal attention.

    ``q [B, T, H, D]``; ``k, v [B, S, KV, D]``; ``q_slots [T]``: the cache slot of each query (key slot
    ``j`` is visible to a query at slot ``i`` iff ``j <= i`` and ``k_valid[b, j]``, and ``visible[b, i, j]``
    when given: packed sequences use it to keep segments apart). Scores and softmax in float32; fully
    masked (padding) queries get a uniform distribution instead of NaN.
    """
    B, T, H, D = q.shape
    kv_heads = k.shape[2]
    qg = q.reshape(B, T, kv_heads, H // kv_heads, D)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * (D ** -0.5)
    causal = jnp.arange(k.shape[1])[None, :] <= q_slots[:, None]  # [T, S]
    allowed = causal[None, None, None] & k_valid[:, None, None, None, :]
    if visible is not None:
        allowed = allowed & visible[:, None, None]
    scores = jnp.where(allowed, scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(B, T, H * D)
