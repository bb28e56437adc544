"""Counter-based ES noise: a pure function of (seed, leaf id, version, pair), never stored.

A population member is ``(version, index)``. With antithetic sampling, members ``2j`` and ``2j+1`` share
one noise draw ``eps`` with signs ``+1`` and ``-1``. Every draw goes through threefry ``fold_in`` on a key
derived from the global seed and the *path* of the parameter leaf (not its position in a dict), so any
process on any device count regenerates bit-identical noise: with ``jax_threefry_partitionable`` (the
default) the bits depend on (key, element index) only, not on how the leaf is sharded.

Two modes:

* ``full``: ``eps`` has the leaf's shape, i.i.d. standard normal.
* ``lowrank``: for a kernel whose last two axes are ``(m, n)`` (``[in, out]`` in Flax's convention),
  ``eps = A @ B.T / sqrt(r)`` with ``A ~ N(0, 1)^{m x r}``, ``B ~ N(0, 1)^{n x r}``. Leading axes (e.g. the
  layer axis of a scanned, layer-stacked ``[L, m, n]`` kernel) get independent factors per index. Leaves
  with fewer than two axes fall back to full noise. ``x @ (W + sigma * eps)`` is then computed as
  ``x @ W + sigma * ((x @ A) @ B.T) / sqrt(r)`` so one base matmul serves the whole population.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import numbers
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp

PyTree = Any
NoiseMode = Literal["full", "lowrank"]

_PRNG_IMPL = "threefry2x32"


# ---------------------------------------------------------------------------------------------------------
# Parameter paths and leaf ids
# ---------------------------------------------------------------------------------------------------------


def _key_name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def path_str(key_path: Sequence[Any]) -> str:
    """``('layers', 'attn', 'q', 'kernel')``-style key path as ``'layers/attn/q/kernel'``."""
    return "/".join(_key_name(entry) for entry in key_path)


def leaf_id(path: str) -> int:
    """Stable 31-bit id of a parameter path: the same in every process, run and sharding."""
    digest = hashlib.blake2b(path.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def leaf_paths(params: PyTree) -> list[str]:
    """Paths of all leaves of ``params`` in flatten order."""
    return [path_str(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


# ---------------------------------------------------------------------------------------------------------
# Which leaves are matrices
# ---------------------------------------------------------------------------------------------------------

#: Leaves under a ``layers`` key are stacks of one slice per decoder layer on their first axis (the decoder
#: scans over it, and so do Flax's scanned modules): their noise is drawn independently per layer.
STACKED = re.compile(r"(^|/)layers/")


def is_matrix(path: str, shape: Sequence[int]) -> bool:
    """Whether a leaf is a matrix, or a stack of matrices: the one definition of what low-rank noise factors
    and ``Scope('matrices')`` holds. A leaf's leading stack axis (:data:`STACKED`) does not count, so a
    layer-stacked norm scale or bias ``[L, d]`` is a vector per layer (independent dense noise per layer),
    not an ``L × d`` matrix whose low-rank noise would tie the layers together."""
    return len(shape) - (1 if STACKED.search(path) else 0) >= 2


# ---------------------------------------------------------------------------------------------------------
# Scope: which leaves are perturbed
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scope:
    """Which parameter leaves receive noise.

    ``kind='matrices'`` perturbs the matrices (:func:`is_matrix`: kernels, embeddings, layer-stacked kernels);
    ``kind='all'`` perturbs every floating-point leaf. ``include`` / ``exclude`` are regular expressions
    searched in the leaf path (``re.search``); a leaf must match some ``include`` pattern (when given) and no
    ``exclude`` pattern.
    """

    kind: Literal["matrices", "all"] = "matrices"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("matrices", "all"):
            raise ValueError(f"Scope.kind must be 'matrices' or 'all', got {self.kind!r}")
        for pattern in (*self.include, *self.exclude):
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"Scope pattern {pattern!r} is not a valid regular expression: {err}") from err

    def contains(self, path: str, leaf: Any) -> bool:
        shape = getattr(leaf, "shape", ())
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            return False
        if self.kind == "matrices" and not is_matrix(path, shape):
            return False
        if self.include and not any(re.search(p, path) for p in self.include):
            return False
        return not any(re.search(p, path) for p in self.exclude)


#: The scope a :class:`NoiseSpec` gets when none is given. Compared by identity (``is``), not equality, so
#: :func:`default_scope_warning` can tell "left at the default" from an explicit ``Scope('matrices')``.
DEFAULT_SCOPE = Scope()


def perturbed_leaves(params: PyTree, spec: NoiseSpec) -> tuple[list[str], list[str]]:
    """``(perturbed, frozen)``: the paths of the leaves of ``params`` that ``spec``'s scope perturbs and of
    those it leaves alone (integer leaves included), each in flatten order."""
    perturbed, frozen = [], []
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        path = path_str(key_path)
        (perturbed if spec.scope.contains(path, leaf) else frozen).append(path)
    return perturbed, frozen


def default_scope_warning(params: PyTree, spec: NoiseSpec) -> str | None:
    """The warning for floating vectors (biases, norm scales) that the *default* scope freezes, or ``None``.

    ``Scope('matrices')`` perturbs only matrices, so a library user who left the scope at its default and has
    biases never trains them, silently. An explicit scope (even ``Scope('matrices')``) is taken as meant."""
    if spec.scope is not DEFAULT_SCOPE:
        return None
    vectors = [path_str(kp) for kp, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
               if jnp.issubdtype(getattr(leaf, "dtype", jnp.int32), jnp.floating)
               and not spec.scope.contains(path_str(kp), leaf)]
    if not vectors:
        return None
    shown = ", ".join(vectors[:8]) + (f" and {len(vectors) - 8} more" if len(vectors) > 8 else "")
    return (f"the default noise scope Scope('matrices') perturbs only matrices, so these floating leaves stay "
            f"at their initial values: {shown}. Pass NoiseSpec(scope=Scope('all')) to "
            "perturb every floating leaf (or Scope('matrices') to keep them frozen and silence this warning)")


# ---------------------------------------------------------------------------------------------------------
# The noise specification
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NoiseSpec:
    """Everything that determines the noise of every member. Hashable, so it can be a static jit arg.

    Attributes:
      seed: global seed of the run, an integer in ``[0, 2**32)`` (threefry keys hold 32 bits of it: a seed
        outside would alias another, e.g. ``2**32`` and ``0`` would draw the same noise).
      mode: ``'full'`` or ``'lowrank'``.
      rank: rank ``r`` of low-rank perturbations (ignored in full mode).
      antithetic: members ``2j``/``2j+1`` share noise with signs ``+``/``-`` (else every member is its own
        pair with sign ``+``).
      scope: which leaves are perturbed.
    """

    seed: int = 0
    mode: NoiseMode = "lowrank"
    rank: int = 1
    antithetic: bool = True
    scope: Scope = DEFAULT_SCOPE

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise TypeError(f"NoiseSpec.seed must be an integer in [0, 2**32), got {self.seed!r}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"NoiseSpec.seed must be in [0, 2**32) = [0, {2**32 - 1}], got {self.seed}: threefry "
                             "keeps 32 bits of it, so a seed outside that range would draw another seed's noise")
        if self.mode not in ("full", "lowrank"):
            raise ValueError(f"NoiseSpec.mode must be 'full' or 'lowrank', got {self.mode!r}")
        if self.rank < 1:
            raise ValueError(f"NoiseSpec.rank must be >= 1, got {self.rank}")

    # -- member identity --------------------------------------------------------------------------------
    def pair_and_sign(self, index: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Noise pair and sign of member ``index`` (traced or concrete)."""
        index = jnp.asarray(index, jnp.int32)
        if not self.antithetic:
            return index, jnp.ones((), jnp.float32) * jnp.ones_like(index, jnp.float32)
        return index // 2, jnp.where(index % 2 == 0, 1.0, -1.0).astype(jnp.float32)

    def is_lowrank_leaf(self, path: str, shape: Sequence[int]) -> bool:
        """Whether the leaf's noise is low-rank factors (a matrix in low-rank mode) rather than dense."""
        return self.mode == "lowrank" and is_matrix(path, shape)

    # -- keys ------------------------------------------------------------------------------------------
    def leaf_key(self, path: str) -> jax.Array:
        base = jax.random.key(self.seed, impl=_PRNG_IMPL)
        return jax.random.fold_in(base, leaf_id(path))

    def draw_key(self, path: str, version: jax.Array, pair: jax.Array) -> jax.Array:
        """Key of the noise draw shared by both members of ``pair`` at ``version`` for leaf ``path``."""
        key = jax.random.fold_in(self.leaf_key(path), jnp.asarray(version, jnp.uint32))
        return jax.random.fold_in(key, jnp.asarray(pair, jnp.uint32))


# ---------------------------------------------------------------------------------------------------------
# Drawing noise for one leaf
# ---------------------------------------------------------------------------------------------------------


def _lowrank_factor_shapes(shape: Sequence[int], rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    *lead, m, n = shape
    return (*lead, m, rank), (*lead, n, rank)


def pair_noise(spec: NoiseSpec, path: str, shape: Sequence[int], version, pair, dtype=jnp.float32):
    """Unsigned noise of one (version, pair) for one leaf.

    Full mode (or a leaf that is not a matrix, :func:`is_matrix`): an array of ``shape``. Low-rank mode: the
    factors ``(A, B)`` with shapes ``(*lead, m, r)`` and ``(*lead, n, r)``.
    """
    key = spec.draw_key(path, version, pair)
    if spec.is_lowrank_leaf(path, shape):
        a_shape, b_shape = _lowrank_factor_shapes(shape, spec.rank)
        key_a, key_b = jax.random.split(key)
        return (jax.random.normal(key_a, a_shape, dtype), jax.random.normal(key_b, b_shape, dtype))
    return jax.random.normal(key, tuple(shape), dtype)


#: Draws with at most this many elements share one threefry kernel in :func:`batched_pair_noise` (padded).
SMALL_DRAW = 8192
#: Draws with more elements than this get a kernel of their own (grouping would multiply peak memory).
LARGE_DRAW = 1 << 24


def batched_pair_noise(spec: NoiseSpec, leaves: Sequence[tuple[str, Sequence[int]]], versions, pairs,
                       small_draw: int = SMALL_DRAW, large_draw: int = LARGE_DRAW) -> list[Any]:
    """``vmap(pair_noise)`` over members for many leaves at once, bit-identical, in a few threefry kernels.

    Why: XLA on CPU needs about a second to compile each ``jax.random.normal`` call, so one call per leaf
    (two per low-rank leaf) makes the update's compile time grow with the leaf count. Here all keys come from
    one vectorized ``fold_in`` chain and the draws are grouped by element count (every draw of at most
    ``small_draw`` elements in one padded group; draws above ``large_draw`` elements stay alone so peak
    memory does not grow). Exactness: threefry is partitionable (bits depend on the
    key and the flat element index only), so ``normal(k, (M,))[:n].reshape(shape) == normal(k, shape)``
    for ``n = prod(shape) <= M``.

    Returns, per leaf, ``[G, *shape]`` (dense) or ``(A [G, *lead, m, r], B [G, *lead, n, r])``.
    """
    if not leaves:
        return []
    versions = jnp.asarray(versions, jnp.uint32).reshape(-1)
    pairs = jnp.asarray(pairs, jnp.uint32).reshape(-1)
    ids = jnp.asarray([leaf_id(path) for path, _ in leaves], jnp.uint32)
    base = jax.random.key(spec.seed, impl=_PRNG_IMPL)
    leaf_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base, ids)  # [P]

    def member_keys(key):
        return jax.vmap(lambda v, p: jax.random.fold_in(jax.random.fold_in(key, v), p))(versions, pairs)

    draw_keys = jax.vmap(member_keys)(leaf_keys)  # [P, G]
    split_keys = None
    requests = []  # (leaf, part, shape)
    for j, (path, shape) in enumerate(leaves):
        if spec.is_lowrank_leaf(path, shape):
            a_shape, b_shape = _lowrank_factor_shapes(shape, spec.rank)
            requests += [(j, 0, a_shape), (j, 1, b_shape)]
        else:
            requests.append((j, -1, tuple(shape)))
    if any(part >= 0 for _, part, _ in requests):
        split_keys = jax.vmap(jax.vmap(jax.random.split))(draw_keys)  # [P, G, 2]
    sizes = [math.prod(shape) for _, _, shape in requests]
    padded = max([n for n in sizes if n <= small_draw], default=0)
    groups: dict[tuple[int, int], list[int]] = {}
    for q, n in enumerate(sizes):
        groups.setdefault((padded, 0) if n <= small_draw else (n, q if n > large_draw else 0), []).append(q)
    out: list[Any] = [None] * len(requests)
    for (size, _), members in groups.items():
        keys = jnp.stack([draw_keys[requests[q][0]] if requests[q][1] < 0
                          else split_keys[requests[q][0], :, requests[q][1]] for q in members])  # [Q, G]
        draws = jax.vmap(jax.vmap(lambda k, size=size: jax.random.normal(k, (size,), jnp.float32)))(keys)
        for i, q in enumerate(members):
            shape = requests[q][2]
            out[q] = draws[i, :, : math.prod(shape)].reshape(draws.shape[1], *shape)
    per_leaf: list[Any] = []
    q = 0
    for path, shape in leaves:
        if spec.is_lowrank_leaf(path, shape):
            per_leaf.append((out[q], out[q + 1]))
            q += 2
        else:
            per_leaf.append(out[q])
            q += 1
    return per_leaf


def lowrank_product(a: jax.Array, b: jax.Array) -> jax.Array:
    """``A @ B.T / sqrt(r)`` over the last two axes (leading axes broadcast)."""
    rank = a.shape[-1]
    return jnp.einsum("...mr,...nr->...mn", a, b) / math.sqrt(rank)


def member_noise(spec: NoiseSpec, path: str, shape: Sequence[int], version, index, dtype=jnp.float32):
    """Signed, dense noise ``s_i * eps_i`` of member ``(version, index)`` for one leaf (leaf shape)."""
    pair, sign = spec.pair_and_sign(index)
    draw = pair_noise(spec, path, shape, version, pair, jnp.float32)
    eps = lowrank_product(*draw) if spec.is_lowrank_leaf(path, shape) else draw
    return (sign * eps).astype(dtype)


# ---------------------------------------------------------------------------------------------------------
# Whole-tree helpers
# ---------------------------------------------------------------------------------------------------------


def _map_scoped(spec: NoiseSpec, params: PyTree, fn: Callable[[str, Any], Any], default: Callable[[Any], Any]):
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for key_path, leaf in flat:
        path = path_str(key_path)
        out.append(fn(path, leaf) if spec.scope.contains(path, leaf) else default(leaf))
    return jax.tree_util.tree_unflatten(treedef, out)


def perturbed_params(spec: NoiseSpec, params: PyTree, version, index, sigma) -> PyTree:
    """Materialize ``theta + sigma * s_i * eps_i`` for one member (used by full mode and as a reference)."""

    def perturb(path: str, leaf: jax.Array) -> jax.Array:
        eps = member_noise(spec, path, leaf.shape, version, index, jnp.float32)
        return (leaf.astype(jnp.float32) + sigma * eps).astype(leaf.dtype)

    return _map_scoped(spec, params, perturb, lambda leaf: leaf)


def lowrank_factors(spec: NoiseSpec, path: str, shape: Sequence[int], versions, indices, active=None,
                    dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
    """Low-rank factors for a batch of members of one leaf whose last two axes are ``(m, n)``.

    Returns ``A`` of shape ``(batch, *lead, m, r)`` carrying each member's sign (and zero where
    ``active`` is False, i.e. an unperturbed row) and ``B`` of shape ``(batch, *lead, n, r)``.
    """
    if len(shape) < 2:
        raise ValueError(f"low-rank factors need a leaf with >= 2 axes; {path!r} has shape {tuple(shape)}")
    versions = jnp.asarray(versions, jnp.int32)
    indices = jnp.asarray(indices, jnp.int32)
    lowrank_spec = dataclasses.replace(spec, mode="lowrank")

    def one(version, index):
        pair, sign = lowrank_spec.pair_and_sign(index)
        a, b = pair_noise(lowrank_spec, path, shape, version, pair, jnp.float32)
        return sign * a, b

    a, b = jax.vmap(one)(versions, indices)
    if active is not None:
        mask = jnp.asarray(active, jnp.float32).reshape((-1,) + (1,) * (a.ndim - 1))
        a = a * mask
    return a.astype(dtype), b.astype(dtype)


def lowrank_factor_tree(spec: NoiseSpec, params: PyTree, versions, indices, active=None, dtype=jnp.float32):
    """Per-leaf ``(A, B)`` factors (or ``None`` for unperturbed leaves) for a batch of members.

    Leaves in scope that are not matrices (:func:`is_matrix`) get ``None`` here too: low-rank population
    forwards factor matrices only; full-mode runs perturb every in-scope leaf through :func:`perturbed_params`.
    """

    def factors(path: str, leaf: jax.Array):
        if not is_matrix(path, leaf.shape):
            return None
        return lowrank_factors(spec, path, leaf.shape, versions, indices, active, dtype)

    return _map_scoped(spec, params, factors, lambda leaf: None)


def lowrank_matmul(x: jax.Array, kernel: jax.Array, a: jax.Array | None, b: jax.Array | None,
                   sigma) -> jax.Array:
    """Per-row perturbed matmul ``x @ (W + sigma * A_i B_i^T / sqrt(r))`` without forming ``A_i B_i^T``.

    Args:
      x: ``[batch, ..., m]`` activations; row ``i`` belongs to member ``i`` of the factors.
      kernel: ``[m, n]`` shared base kernel.
      a: ``[batch, m, r]`` signed factors (zero rows are unperturbed), or None for the plain matmul.
      b: ``[batch, n, r]`` factors.
      sigma: noise scale.
    """
    base = x @ kernel
    if a is None:
        return base
    xa = jnp.einsum("b...m,bmr->b...r", x.astype(a.dtype), a)
    return base + lowrank_delta(xa, b, sigma).astype(base.dtype)


def lowrank_delta(xa: jax.Array, b: jax.Array, sigma) -> jax.Array:
    """The low-rank part ``sigma * (x A_i) B_i^T / sqrt(r)`` of :func:`lowrank_matmul`, from the product ``x A_i``.

    ``xa``: ``[batch, ..., r]`` (row ``i`` times its member's ``A_i``); ``b``: ``[batch, n, r]``. The decoder's
    layers (:mod:`esjax.model.layers`) form ``x A_i`` their own way (one product for several kernels) and add
    this term to their base matmul, as :func:`lowrank_matmul` does.
    """
    rank = xa.shape[-1]
    return jnp.einsum("b...r,bnr->b...n", xa, b) * (sigma / math.sqrt(rank))


def lowrank_embed(tokens: jax.Array, table: jax.Array, a: jax.Array | None, b: jax.Array | None,
                  sigma) -> jax.Array:
    """Per-row perturbed embedding lookup: row ``v`` of ``E + sigma * A B^T / sqrt(r)`` via a gather of ``A``.

    ``tokens``: ``[batch, ...]`` ids; ``table``: ``[vocab, d]``; ``a``: ``[batch, vocab, r]``;
    ``b``: ``[batch, d, r]``.
    """
    base = jnp.take(table, tokens, axis=0)
    if a is None:
        return base
    rank = a.shape[-1]
    flat = tokens.reshape(tokens.shape[0], -1)
    rows = jnp.take_along_axis(a, flat[..., None], axis=1)  # [batch, T, r]
    delta = jnp.einsum("btr,bdr->btd", rows, b) * (sigma / math.sqrt(rank))
    return base + delta.reshape(base.shape).astype(base.dtype)
