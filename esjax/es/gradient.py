"""The ES gradient's sum ``Σ_i coef_i s_i ε_i`` with O(params) memory, whatever N is.

Members are first merged by noise draw (antithetic partners and duplicates share one draw, whose coefficient is
their sum); the draws are accumulated in chunks with ``lax.scan``, an all-zero chunk skipped with ``lax.cond``,
so each noise tensor is generated once per distinct draw. Within a chunk all leaves' draws come from
:func:`~esjax.es.noise.batched_pair_noise` (a few threefry kernels, not one per leaf). Dense leaves add
``tensordot(coef, ε)``; low-rank leaves one einsum ``Σ_c coef_c A_c B_cᵀ/√r`` per chunk. The update
(:mod:`esjax.es.step`) turns fitness into the coefficients and this sum into a step.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from esjax.es.noise import NoiseSpec, batched_pair_noise, path_str

PyTree = Any
Draws = tuple[jax.Array, jax.Array, jax.Array]  # versions, pairs, coefficients of the merged draws: [n_chunks, chunk]

MAX_LOWRANK_CHUNK = 256


def auto_chunk_size(spec: NoiseSpec, leaves: list[tuple[str, tuple[int, ...]]], n: int) -> int:
    """Default number of draws generated together.

    Full mode: 1 (each dense draw is as large as its leaf). Low-rank mode: as many as fit in the size of the
    largest low-rank leaf, ``max(m·n) / max((m + n)·r)`` per layer, clamped to ``[1, 256]``, so the chunk's
    factors never outweigh the parameters.
    """
    lowrank = [s for path, s in leaves if spec.is_lowrank_leaf(path, s)]
    if not lowrank:
        return 1
    leaf = max(math.prod(s) for s in lowrank)
    factors = max(math.prod(s[:-2]) * (s[-2] + s[-1]) * spec.rank for s in lowrank)
    return max(1, min(MAX_LOWRANK_CHUNK, leaf // factors, n))


def scoped_leaves(spec: NoiseSpec, params: PyTree) -> tuple[list[tuple[str, Any]], list[bool], Any]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [(path_str(kp), leaf) for kp, leaf in flat]
    in_scope = [spec.scope.contains(path, leaf) for path, leaf in leaves]
    return leaves, in_scope, treedef


def merge_draws(spec: NoiseSpec, versions: jax.Array, indices: jax.Array, coefs: jax.Array):
    """Merge members by noise draw: ``(draw_versions[N], draw_pairs[N], draw_coefs[N])``.

    Each distinct ``(version, pair)`` appears once with coefficient ``Σ coef_i s_i`` of its members; draws
    with a zero coefficient (and the padding) come last. Traced-shape-only: works under jit.
    """
    n = versions.shape[0]
    pairs, signs = spec.pair_and_sign(indices)
    signed = coefs.astype(jnp.float32) * signs
    order = jnp.lexsort((pairs, versions))
    v_s, p_s, c_s = versions[order], pairs[order], signed[order]
    starts = jnp.concatenate([jnp.ones((1,), bool), (v_s[1:] != v_s[:-1]) | (p_s[1:] != p_s[:-1])])
    segment = jnp.cumsum(starts.astype(jnp.int32)) - 1
    merged = jax.ops.segment_sum(c_s, segment, num_segments=n)
    first = jnp.nonzero(starts, size=n, fill_value=0)[0]
    d_v, d_p = v_s[first], p_s[first]
    live = jnp.argsort(merged == 0, stable=True)
    return d_v[live], d_p[live], merged[live]


def _chunk_sums(spec: NoiseSpec, scoped: list[tuple[str, tuple[int, ...]]], v, p, c) -> list[jax.Array]:
    """``Σ_c coef_c · draw_c`` for every scoped leaf, with all draws from a few threefry kernels."""
    sums = []
    # Materialized before use: fused into its consumer, threefry's float math would round differently (XLA
    # contracts a·b + c to an FMA inside a fusion), so a leaf's sum would depend on which leaves share a program.
    for (path, shape), draws in zip(scoped, jax.lax.optimization_barrier(batched_pair_noise(spec, scoped, v, p))):
        if spec.is_lowrank_leaf(path, shape):
            a, b = draws
            a = a * c.reshape((-1,) + (1,) * (a.ndim - 1))
            sums.append(jnp.einsum("c...mr,c...nr->...mn", a, b) / math.sqrt(spec.rank))
        else:
            sums.append(jnp.tensordot(c, draws, axes=1))
    return sums


def chunked_draws(spec: NoiseSpec, versions, indices, coefs, chunk: int) -> Draws:
    """The merged draws (:func:`merge_draws`) padded with zero-coefficient draws and cut into ``[n_chunks, chunk]``.

    Computed once per update and shared by every leaf, so each leaf sums the same draws in the same order
    whether the leaves are summed together or one group at a time.
    """
    n = versions.shape[0]
    d_v, d_p, d_c = merge_draws(spec, versions, indices, coefs)
    pad = (-n) % chunk
    if pad:
        d_v, d_p = (jnp.concatenate([x, jnp.zeros((pad,), jnp.int32)]) for x in (d_v, d_p))
        d_c = jnp.concatenate([d_c, jnp.zeros((pad,), jnp.float32)])
    return tuple(x.reshape(-1, chunk) for x in (d_v, d_p, d_c))


def leaf_noise_sums(spec: NoiseSpec, leaves: list[tuple[str, Any]], draws: Draws | None,
                    after: jax.Array | None = None) -> list[jax.Array]:
    """``Σ coef · draw`` (float32, the leaf's shape) for in-scope ``(path, leaf)`` pairs over :func:`chunked_draws`.

    Sums start from the parameters (θ·0, NaN-safe) so sharding propagation lays them out like θ instead of
    replicating them; one ``lax.scan`` over the chunks holds the noise code once (a chunk whose coefficients are
    all zero is skipped by a ``lax.cond``): a first chunk outside the loop would compile every threefry kernel
    twice. ``after``: a scalar that is never negative (the previous group's ``|update|²``, NaN included) that
    the starts depend on, so XLA cannot allocate or start these sums before it exists: groups of leaves run one
    after another.
    """
    if not leaves or draws is None:
        return [_start(leaf) for _, leaf in leaves]
    scoped = [(path, tuple(leaf.shape)) for path, leaf in leaves]

    def add(acc, v, p, c):
        return [a + d for a, d in zip(acc, _chunk_sums(spec, scoped, v, p, c))]

    def body(acc, x):
        v, p, c = x
        return jax.lax.cond(jnp.any(c != 0), lambda a: add(a, v, p, c), lambda a: a, acc), None

    # `after < 0` never holds, but XLA cannot know: the starts (exactly θ·0) wait for the previous group.
    starts = [_start(leaf if after is None else jnp.where(after < 0, 0, leaf)) for _, leaf in leaves]
    return jax.lax.scan(body, starts, draws)[0]


def _start(leaf: Any) -> jax.Array:
    return jnp.nan_to_num(leaf.astype(jnp.float32) * 0.0)


def draw_chunk(spec: NoiseSpec, params: PyTree, n: int, chunk_size: int | None = None) -> int:
    """Draws per chunk for ``n`` members: ``chunk_size`` or :func:`auto_chunk_size` over all in-scope leaves,
    at most ``n`` (one value for the whole tree, so summing leaves in groups changes no arithmetic)."""
    leaves, in_scope, _ = scoped_leaves(spec, params)
    chunk = chunk_size or auto_chunk_size(spec, [(p, tuple(x.shape)) for (p, x), s in zip(leaves, in_scope) if s], n)
    return max(1, min(chunk, n))


def weighted_noise_sum(spec: NoiseSpec, params: PyTree, versions, indices, coefs,
                       chunk_size: int | None = None) -> PyTree:
    """``Σ_i coef_i · s_i ε_i`` as a float32 tree like ``params`` (zeros outside the scope).

    ``ε_i`` is exactly what :func:`~esjax.es.noise.member_noise` gives member ``(versions[i], indices[i])``
    (low-rank product for ≥2-axis leaves in low-rank mode, dense otherwise). See the module docstring for
    how draws are shared and chunked.
    """
    versions = jnp.asarray(versions, jnp.int32).reshape(-1)
    indices = jnp.asarray(indices, jnp.int32).reshape(-1)
    coefs = jnp.asarray(coefs, jnp.float32).reshape(-1)
    leaves, in_scope, treedef = scoped_leaves(spec, params)
    n = versions.shape[0]
    draws = chunked_draws(spec, versions, indices, coefs, draw_chunk(spec, params, n, chunk_size)) if n else None
    sums = iter(leaf_noise_sums(spec, [x for x, s in zip(leaves, in_scope) if s], draws))
    out = [next(sums) if s else zero_gradient(leaf) for (_, leaf), s in zip(leaves, in_scope)]
    return jax.tree_util.tree_unflatten(treedef, out)


def zero_gradient(leaf: Any) -> jax.Array:
    """The gradient of a leaf outside the scope: zeros (float32 for floating leaves)."""
    return jnp.zeros(jnp.shape(leaf), _grad_dtype(leaf))


def _grad_dtype(leaf: Any):
    dtype = getattr(leaf, "dtype", jnp.float32)
    return jnp.float32 if jnp.issubdtype(dtype, jnp.floating) else dtype
