"""Per-row ES members for the batched forward: which member each batch row evaluates, and its noise.

A :class:`Perturbation` says, for every batch row, which population member ``(version, index)`` it runs
(or ``active=False``: the plain model). Rows come in contiguous groups of ``group_size`` rows that share
one member (e.g. one member × several episodes); noise is generated once per group, inside the jitted
forward, from the counter-based keys of ``esjax.es.noise`` — never stored between calls.

:func:`prepare` turns it into what the decoder consumes:

* low-rank mode: per group and per leaf, the signed factors ``(A, B)`` for kernels and the embedding
  (as ``lowrank_factors``: one shared base matmul for all rows), and small dense deltas ``sigma * s * eps``
  for any other in-scope leaf (norm scales, biases), so the forward equals ``perturbed_params`` for any scope;
* full mode: one materialized perturbed copy of the parameters per group (as ``perturbed_params``), the
  forward is vmapped over groups. Memory is ``groups × params``: for small models and as the reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from esjax.es.noise import NoiseSpec, batched_pair_noise, path_str


class LowRank(NamedTuple):
    """Signed factors of one leaf per group: ``a [G, *lead, m, r]`` (zero: inactive), ``b [G, *lead, n, r]``."""

    a: jax.Array
    b: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Perturbation:
    """Which member each batch row evaluates. ``spec`` and ``group_size`` are static (part of the jit key).

    Attributes:
      spec: the run's noise specification.
      sigma: noise scale (a traced scalar: changing it does not recompile).
      versions, indices: ``[rows]`` int32 member ids.
      active: ``[rows]`` bool; False rows run the unperturbed model.
      (:meth:`create` keeps these on the host, as numpy arrays; inside a jitted program they are traced.)
      group_size: rows ``[k*g, (k+1)*g)`` share one member (only row ``k*g``'s id is read).
    """

    spec: NoiseSpec = dataclasses.field(metadata=dict(static=True))
    sigma: jax.Array
    versions: jax.Array
    indices: jax.Array
    active: jax.Array
    group_size: int = dataclasses.field(default=1, metadata=dict(static=True))

    @classmethod
    def create(cls, spec: NoiseSpec, sigma: float, versions: Any, indices: Any, active: Any = None,
               group_size: int = 1) -> Perturbation:
        versions = np.asarray(versions, np.int32).reshape(-1)
        indices = np.asarray(indices, np.int32).reshape(-1)
        if versions.shape != indices.shape:
            raise ValueError(f"Perturbation: versions {versions.shape} and indices {indices.shape} differ in length")
        active = np.ones(versions.shape, bool) if active is None else np.asarray(active, bool).reshape(-1)
        if active.shape != versions.shape:
            raise ValueError(f"Perturbation: active has {active.shape[0]} rows, versions {versions.shape[0]}")
        if group_size < 1 or versions.shape[0] % group_size:
            raise ValueError(f"Perturbation: {versions.shape[0]} rows are not a multiple of group_size={group_size}")
        # host arrays: the jitted program they go to copies them (a few µs each, against ~20-30 µs for an eager
        # jnp.asarray: four of those were a visible share of the loop's host time per policy call)
        return cls(spec, np.asarray(sigma, np.float32), versions, indices, active, group_size)

    @property
    def rows(self) -> int:
        return int(self.versions.shape[0])

    @property
    def groups(self) -> int:
        return self.rows // self.group_size

    def group_members(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(versions, indices, active) of each group, ``[groups]``."""
        g = self.group_size
        return self.versions[::g], self.indices[::g], self.active[::g]

    def pad_rows(self, rows: int) -> Perturbation:
        """Append inactive rows up to ``rows`` (a multiple of ``group_size``)."""
        extra = rows - self.rows
        if extra < 0 or rows % self.group_size:
            raise ValueError(f"cannot pad {self.rows} rows to {rows} with group_size={self.group_size}")
        if extra == 0:
            return self
        xp = np if isinstance(self.versions, np.ndarray) else jnp  # host rows stay on the host
        pad = lambda x, v: xp.concatenate([x, xp.full((extra,), v, x.dtype)])
        return dataclasses.replace(self, versions=pad(self.versions, 0), indices=pad(self.indices, 0),
                                   active=pad(self.active, False))


#: ``prepare`` pads only draws of at most this many elements to one shared size (``small_draw`` of
#: ``batched_pair_noise``; larger draws are grouped by exact size). The update's default (8192) pads e.g. the
#: ``[L, 1]`` factors of stacked norm scales to 8192 normals each; ``prepare`` runs on every policy call, where
#: that padding is most of the threefry work (2.2x the normals actually used on the benchmark model; there
#: ``prepare_jit`` drops from ~12 to ~4 ms of CPU), so it trades a few more threefry kernels (compile time)
#: for it. The bits are the same for any value.
PREPARE_SMALL_DRAW = 512


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prepared:
    """A perturbation expanded for one forward: per-group noise (low-rank) or per-group params (full)."""

    mode: str = dataclasses.field(metadata=dict(static=True))
    groups: int = dataclasses.field(metadata=dict(static=True))
    sigma: jax.Array
    noise: Any = None          # low-rank: tree like params with LowRank / dense delta [G, ...] / None leaves
    group_params: Any = None   # full: params with a leading [G] axis


def prepare(perturbation: Perturbation | Prepared | None, params: Any) -> Prepared | None:
    """Generate the noise a forward needs (traceable; cheap for low-rank, ``G × params`` for full).

    Equals drawing each leaf with ``esjax.es.noise`` (``lowrank_factors`` / ``member_noise`` /
    ``perturbed_params``), but in a few batched threefry calls (``esjax.es.noise.batched_pair_noise``).
    """
    if perturbation is None or isinstance(perturbation, Prepared):
        return perturbation
    spec = perturbation.spec
    versions, indices, active = perturbation.group_members()
    pairs, signs = spec.pair_and_sign(indices)
    sigma = perturbation.sigma
    groups = perturbation.groups
    scale = jnp.where(active, sigma, 0.0).astype(jnp.float32) * signs  # [G]: sigma * s_i, 0 if inactive

    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [(path_str(kp), leaf) for kp, leaf in flat]
    in_scope = [(path, tuple(leaf.shape)) for path, leaf in leaves if spec.scope.contains(path, leaf)]
    draws = dict(zip([path for path, _ in in_scope],
                     batched_pair_noise(spec, in_scope, versions, pairs, small_draw=PREPARE_SMALL_DRAW)))

    def per_group(x: jax.Array, v: jax.Array) -> jax.Array:
        return x * v.reshape((-1,) + (1,) * (x.ndim - 1))

    out = []
    for path, leaf in leaves:
        if not spec.scope.contains(path, leaf):
            out.append(None)
            continue
        if spec.is_lowrank_leaf(path, leaf.shape):  # kernels and the embedding: factors, applied in the matmul
            a, b = draws[path]
            out.append(LowRank(per_group(a, signs * active.astype(jnp.float32)), b))
            continue
        eps = draws[path]
        delta = per_group(eps, scale)  # [G, *shape] = sigma * s_i * eps_i
        if spec.mode == "full":
            out.append((leaf[None].astype(jnp.float32) + delta).astype(leaf.dtype))
        else:
            out.append(delta)
    tree = jax.tree_util.tree_unflatten(treedef, out)
    if spec.mode == "full":
        # leaves out of scope are shared by every group: broadcast them (vmap needs a group axis everywhere)
        stacked = jax.tree.map(lambda new, leaf: jnp.broadcast_to(leaf, (groups, *leaf.shape)) if new is None
                               else new, tree, params, is_leaf=lambda x: x is None)
        return Prepared("full", groups, sigma, group_params=stacked)
    return Prepared("lowrank", groups, sigma, noise=tree)


#: ``prepare`` as its own program. The policy primitives call this once per call and pass the result to
#: their jitted forwards: drawing threefry noise for every leaf dominates XLA compile time on CPU (seconds),
#: so it is compiled once per (spec, member-group count) rather than once per padded batch shape.
prepare_jit = jax.jit(prepare)
