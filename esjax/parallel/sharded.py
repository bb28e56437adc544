"""The ES update and the population forward under one ``('data', 'model')`` mesh.

Why this module exists: the ES update (:mod:`esjax.es.step`) and the decoder (:mod:`esjax.model`) are
written sharding-agnostic. Here they are compiled with explicit in/out shardings taken from the model's
logical axis rules (:mod:`esjax.model.sharding`, the one place where meshes and shardings are declared), so that

* θ, the optimizer state, θ_0 and the update's gradient accumulator are sharded the same way (heads, MLP
  width and vocabulary over ``model``); the compiled update never materializes a full replica of θ on one
  device (checked with :func:`update_memory` / the output shardings);
* noise is generated shard-locally: with ``jax_threefry_partitionable`` (JAX's default) threefry bits are a
  function of (key, element index), so every device draws only its slice and the values are bit-identical to
  the single-device draw (:func:`check_partitionable`);
* population rows (members × episodes) are sharded over ``data``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from esjax.es import step as es_step
from esjax.es.noise import path_str
from esjax.model.config import ModelConfig
from esjax.model.decoder import forward
from esjax.model.perturb import Perturbation
from esjax.model.sharding import param_shardings, put_batch, put_global

PyTree = Any


# ---------------------------------------------------------------------------------------------------------
# Shardings of the ES state (θ, optimizer state, version, θ_0)
# ---------------------------------------------------------------------------------------------------------


def _param_index(model_config: ModelConfig, mesh: Mesh) -> dict[str, tuple[tuple[int, ...], NamedSharding]]:
    from esjax.model.params import param_shapes

    shapes = jax.tree_util.tree_flatten_with_path(param_shapes(model_config))[0]
    shards = jax.tree.leaves(param_shardings(model_config, mesh), is_leaf=lambda x: isinstance(x, NamedSharding))
    return {path_str(kp): (tuple(s.shape), sh) for (kp, s), sh in zip(shapes, shards)}


def like_params_shardings(tree: PyTree, model_config: ModelConfig, mesh: Mesh) -> PyTree:
    """Shardings for any tree that holds params-like subtrees (optimizer moments, θ_0, gradients).

    A leaf whose path ends with a parameter's path and has that parameter's shape gets the parameter's
    sharding (``.../mu/layers/attn/q_proj/kernel`` → like ``layers/attn/q_proj/kernel``); everything else
    (step counters, version) is replicated.
    """
    index = _param_index(model_config, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(key_path, leaf):
        path, shape = path_str(key_path), tuple(np.shape(leaf))
        for ppath, (pshape, sharding) in index.items():
            if shape == pshape and (path == ppath or path.endswith("/" + ppath)):
                return sharding
        return replicated

    return jax.tree_util.tree_map_with_path(pick, tree)


def state_shardings(es_config: Any, model_config: ModelConfig, mesh: Mesh, dtype: Any = None) -> Any:
    """``ESState``-shaped tree of ``NamedSharding`` for ``init(es_config, params)`` on ``mesh``."""
    from esjax.model.params import param_shapes

    abstract = jax.eval_shape(lambda p: es_step.init(es_config, p), param_shapes(model_config, dtype))
    return like_params_shardings(abstract, model_config, mesh)


# ---------------------------------------------------------------------------------------------------------
# The sharded update
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ShardedES:
    """The ES update compiled for one mesh with θ (and its update) sharded by the model's rules.

    ``update_fn`` has the signature of :func:`esjax.es.step.update` (``(config, state, versions, indices,
    fitness) -> (state, metrics)``), so it can be handed to ``esjax.loop.es_update.ESUpdate(update_fn=...)``.
    Cohort arrays are tiny and replicated; metrics come back replicated.

    Args:
      es_config: the ``ESConfig`` (static).
      model_config: the decoder config (gives the parameter layout and logical axes).
      mesh: a ``('data', 'model')`` mesh.
      donate: donate the input state's buffers (saves one copy of θ; only when no older version of θ is
        kept alive, i.e. K = 0 or θ_{t−k} are not needed).
      execution: the update's memory layout (an ``ESExecution``; default: its defaults).
    """

    es_config: Any
    model_config: ModelConfig
    mesh: Mesh
    donate: bool = False
    dtype: Any = None
    execution: Any = es_step.DEFAULT_EXECUTION

    def __post_init__(self) -> None:
        check_partitionable()
        self.shardings = state_shardings(self.es_config, self.model_config, self.mesh, self.dtype)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        rep = self.replicated
        self._jit = jax.jit(
            lambda state, versions, indices, fitness: es_step.update(self.es_config, state, versions, indices, fitness,
                                                                     self.execution),
            in_shardings=(self.shardings, rep, rep, rep),
            out_shardings=(self.shardings, rep),
            donate_argnums=(0,) if self.donate else (),
        )

    def place(self, state: Any) -> Any:
        """Put an ``ESState`` (e.g. restored on host, or freshly initialized) onto the mesh."""
        return put_global(state, self.shardings)

    def init(self, params: PyTree, version: int = 0) -> Any:
        """``esjax.es.step.init`` with θ placed on the mesh first (so θ_0 and moments are sharded too)."""
        params = put_global(params, self.shardings.params)
        return self.place(es_step.init(self.es_config, params, version))

    def _cohort(self, versions, indices, fitness):
        return (np.asarray(versions, np.int32), np.asarray(indices, np.int32), np.asarray(fitness, np.float32))

    def update(self, state: Any, versions, indices, fitness) -> tuple[Any, dict[str, jax.Array]]:
        """One sharded update (state stays on the mesh); member ids are checked as by :func:`esjax.es.step.update`."""
        cohort = self._cohort(versions, indices, fitness)
        es_step.check_members(state.version, cohort[0], cohort[1], "ShardedES.update")
        return self._jit(state, *cohort)

    def update_fn(self, config: Any, state: Any, versions, indices, fitness):
        """Drop-in for :func:`esjax.es.step.update` (``config`` must be this object's ``es_config``)."""
        if config != self.es_config:
            raise ValueError("ShardedES.update_fn called with a different ESConfig than it was compiled for")
        return self.update(state, versions, indices, fitness)

    def lower(self, n: int):
        """The update lowered for a cohort of ``n`` (abstract inputs: nothing is allocated)."""
        from esjax.model.params import param_shapes

        abstract = jax.eval_shape(lambda p: es_step.init(self.es_config, p),
                                  param_shapes(self.model_config, self.dtype))
        abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract,
                                self.shardings)
        cohort = (jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((n,), jnp.int32),
                  jax.ShapeDtypeStruct((n,), jnp.float32))
        return self._jit.lower(abstract, *cohort)


def update_memory(sharded: ShardedES, n: int) -> dict[str, Any]:
    """Per-device bytes of the compiled update: arguments, outputs, temporaries (``memory_analysis``), and
    whether every output leaf of θ is sharded like θ (no replica gathered onto one device)."""
    compiled = sharded.lower(n).compile()
    stats = compiled.memory_analysis()
    from esjax.model.params import param_shapes

    shapes = jax.tree.leaves(param_shapes(sharded.model_config, sharded.dtype))
    outs = jax.tree.leaves(compiled.output_shardings[0].params)
    wanted = jax.tree.leaves(sharded.shardings.params)
    same = all(o.is_equivalent_to(w, len(s.shape)) for o, w, s in zip(outs, wanted, shapes))
    return {
        "argument_bytes": int(getattr(stats, "argument_size_in_bytes", 0)),
        "output_bytes": int(getattr(stats, "output_size_in_bytes", 0)),
        "temp_bytes": int(getattr(stats, "temp_size_in_bytes", 0)),
        "alias_bytes": int(getattr(stats, "alias_size_in_bytes", 0)),
        "params_sharded_like_input": bool(same),
    }


# ---------------------------------------------------------------------------------------------------------
# Population forward with rows over 'data'
# ---------------------------------------------------------------------------------------------------------


def shard_perturbation(perturbation: Perturbation, mesh: Mesh) -> Perturbation:
    """Member ids per row over ``data`` (σ replicated), matching the rows of the tokens."""
    return dataclasses.replace(
        perturbation,
        sigma=jax.device_put(perturbation.sigma, NamedSharding(mesh, PartitionSpec())),
        versions=put_batch(perturbation.versions, mesh),
        indices=put_batch(perturbation.indices, mesh),
        active=put_batch(perturbation.active, mesh),
    )


def population_forward(model_config: ModelConfig, mesh: Mesh,
                       head: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None) -> Callable:
    """A jitted ``fn(params, tokens, mask, perturbation) -> out`` with θ sharded by the model rules and rows
    over ``data``. ``head(logits, tokens, mask)`` reduces the logits inside the same program (e.g. to a
    per-row score, so ``[rows, T, vocab]`` never leaves the devices); default: the logits themselves."""
    p_shard = param_shardings(model_config, mesh)

    def run(params, tokens, mask, perturbation):
        logits, _ = forward(model_config, params, tokens, mask=mask, perturbation=perturbation)
        return logits if head is None else head(logits, tokens, mask)

    fn = jax.jit(run)

    def call(params, tokens, mask, perturbation):
        params = jax.device_put(params, p_shard)  # no-op when already placed
        return fn(params, put_batch(tokens, mesh), put_batch(mask, mesh), shard_perturbation(perturbation, mesh))

    return call


# ---------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------


def check_partitionable() -> None:
    """Raise if ``jax_threefry_partitionable`` is off (noise would then depend on the sharding)."""
    if not jax.config.jax_threefry_partitionable:
        raise RuntimeError("esjax needs jax_threefry_partitionable=True (JAX's default) so sharded noise equals "
                           "single-device noise; something turned it off")


def per_device_bytes(tree: PyTree) -> dict[int, int]:
    """Measured bytes per device id of the addressable shards of every array in ``tree``."""
    out: dict[int, int] = {}
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            for shard in leaf.addressable_shards:
                out[shard.device.id] = out.get(shard.device.id, 0) + int(shard.data.nbytes)
    return out
