"""Building blocks of the decoder, ES-aware: every op takes optional per-group noise.

Activations have a leading row axis ``B``; per-group noise has a leading group axis ``G`` with
``B = G * rows_per_group`` (rows of a group are contiguous). A ``LowRank`` kernel noise goes through
``esjax.es.noise.lowrank_matmul`` (one shared base matmul); dense deltas (norm scales, biases) are added
per group.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from esjax.es.noise import lowrank_embed, lowrank_matmul
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


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, kernel_noise: LowRank | None,
          bias_noise: jax.Array | None, sigma: jax.Array) -> jax.Array:
    """``x @ (W + sigma*eps_group) + (b + delta_group)`` with the low-rank term off the shared base matmul."""
    if kernel_noise is None:
        y = x @ kernel
    else:
        groups = kernel_noise.a.shape[0]
        y = _ungroup(lowrank_matmul(_group(x, groups), kernel, kernel_noise.a, kernel_noise.b, sigma))
    if bias is not None:
        y = add_delta(y + bias, bias_noise)
    return y


def embed(tokens: jax.Array, table: jax.Array, noise: LowRank | None, sigma: jax.Array) -> jax.Array:
    """Token embedding; the low-rank perturbation is a row gather of ``A`` (``lowrank_embed``)."""
    if noise is None:
        return jnp.take(table, tokens, axis=0)
    groups = noise.a.shape[0]
    return _ungroup(lowrank_embed(_group(tokens, groups), table, noise.a, noise.b, sigma))


def tied_head(x: jax.Array, table: jax.Array, noise: LowRank | None, sigma: jax.Array) -> jax.Array:
    """``x @ (E + sigma*A Bᵀ/√r)ᵀ`` without transposing ``E``: ``x Eᵀ + sigma (x B) Aᵀ / √r``."""
    base = jnp.einsum("...d,vd->...v", x, table)
    if noise is None:
        return base
    groups, rank = noise.a.shape[0], noise.a.shape[-1]
    xb = jnp.einsum("g...d,gdr->g...r", _group(x, groups).astype(noise.b.dtype), noise.b)
    delta = jnp.einsum("g...r,gvr->g...v", xb, noise.a) * (sigma / math.sqrt(rank))
    return base + _ungroup(delta).astype(base.dtype)


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
