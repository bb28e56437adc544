"""Many leaves' ES noise in a few threefry calls, bit-identical to ``esjax.es.noise``.

Why: on CPU, XLA needs about a second to compile *each* ``jax.random.normal`` call (the threefry rounds
become one huge fused kernel), and a population forward draws ~2 factors per leaf — 30+ calls, tens of
seconds of compile per program even for a 2-layer model. Here the keys of all leaves are derived in one
vectorized ``fold_in`` chain and the draws are grouped by element count (all small draws in one group,
padded), so a forward needs a handful of threefry kernels regardless of depth or leaf count.

It reproduces ``esjax.es.noise`` exactly: the same key chain ``fold_in(fold_in(fold_in(key(seed),
leaf_id(path)), version), pair)``, the same ``split`` into the A/B factor keys, and, because threefry is
partitionable (bits depend on the key and the element's flat index only), ``normal(k, (N,))[:n]`` reshaped
equals ``normal(k, shape)`` for ``n = prod(shape) <= N``. ``tests/test_model_perturb.py`` checks bit
equality against ``lowrank_factors`` / ``member_noise`` so a change in ``esjax.es.noise`` cannot go unnoticed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp

from esjax.es.noise import _PRNG_IMPL, NoiseSpec, leaf_id

Part = Literal["a", "b", "full"]
#: Draws with at most this many elements all share one kernel (padded to the largest of them); larger
#: draws are grouped by exact size (layer-stacked kernels share a few sizes), so padding wastes little.
SMALL_DRAW = 1024


def draw_normals(spec: NoiseSpec, requests: Sequence[tuple[str, tuple[int, ...], Part]], versions: jax.Array,
                 pairs: jax.Array) -> list[jax.Array]:
    """Unsigned standard-normal draws ``[G, *shape]`` for each ``(path, shape, part)`` and each member.

    ``part='a'`` / ``'b'``: the low-rank factor drawn from the first / second half of the split draw key
    (shapes ``(*lead, m, r)`` / ``(*lead, n, r)``); ``'full'``: a dense draw from the draw key itself.
    """
    if not requests:
        return []
    paths = sorted({p for p, _, _ in requests})
    row = {p: i for i, p in enumerate(paths)}
    base = jax.random.key(spec.seed, impl=_PRNG_IMPL)
    ids = jnp.asarray([leaf_id(p) for p in paths], jnp.uint32)
    leaf_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base, ids)  # [P]
    versions = jnp.asarray(versions, jnp.uint32)
    pairs = jnp.asarray(pairs, jnp.uint32)

    def member_keys(key):
        return jax.vmap(lambda v, p: jax.random.fold_in(jax.random.fold_in(key, v), p))(versions, pairs)

    draw_keys = jax.vmap(member_keys)(leaf_keys)  # [P, G]
    split_keys = jax.vmap(jax.vmap(jax.random.split))(draw_keys)  # [P, G, 2]

    def key_of(path: str, part: Part) -> jax.Array:
        i = row[path]
        return draw_keys[i] if part == "full" else split_keys[i, :, 0 if part == "a" else 1]

    sizes = [math.prod(shape) for _, shape, _ in requests]
    small = max([n for n in sizes if n <= SMALL_DRAW], default=0)
    classes: dict[int, list[int]] = {}
    for j, n in enumerate(sizes):
        classes.setdefault(small if n <= SMALL_DRAW else n, []).append(j)
    out: list[jax.Array | None] = [None] * len(requests)
    for size, members in classes.items():
        keys = jnp.stack([key_of(requests[j][0], requests[j][2]) for j in members])  # [Q, G]
        draws = jax.vmap(jax.vmap(lambda k, size=size: jax.random.normal(k, (size,), jnp.float32)))(keys)
        for q, j in enumerate(members):
            shape = requests[j][1]
            out[j] = draws[q, :, : math.prod(shape)].reshape(draws.shape[1], *shape)
    return out  # type: ignore[return-value]
