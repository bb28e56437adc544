"""ES engine: counter-based noise, fitness shaping, σ schedules, the jitted update, evosax interop.

For library users: ``ES(ESConfig(...))`` with ``init`` / ``ask`` / ``tell`` (evosax-shaped, fitness maximized), or
the functional ``init`` / ``update`` on cohorts of ``(version, index)`` members; ``__all__`` lists that face.

Fitness is maximized everywhere here except in :mod:`esjax.es.evosax_compat`, which follows evosax
(minimization) because it is an evosax drop-in.
"""

# ruff: noqa: F401  (the names below __all__ stay importable from esjax.es for existing code)

from esjax.es import shaping, sigma_schedules
from esjax.es.gradient import auto_chunk_size, merge_draws, weighted_noise_sum
from esjax.es.noise import (
    NoiseSpec,
    Scope,
    batched_pair_noise,
    leaf_id,
    leaf_paths,
    lowrank_embed,
    lowrank_factor_tree,
    lowrank_factors,
    lowrank_matmul,
    lowrank_product,
    member_noise,
    pair_noise,
    path_str,
    perturbed_leaves,
    perturbed_params,
)
from esjax.es.shaping import centered_ranks, evosax_shaping, get_shaping, raw, shape, z_score
from esjax.es.sigma_schedules import Constant, Cosine, Linear, constant, cosine, linear
from esjax.es.step import ES, ESConfig, ESExecution, ESState, es_gradient, init, member_coefficients, update

#: The library face: the ES object (ask / tell / update), its config and state, the functional init / update, what
#: a scope perturbs, the perturbed forward's building blocks, the default shaping and the σ schedules. Everything
#: else imported above stays importable from here or from its submodule (noise, gradient, shaping, sigma_schedules,
#: step).
__all__ = [
    "ES",
    "ESConfig",
    "ESExecution",
    "ESState",
    "NoiseSpec",
    "Scope",
    "centered_ranks",
    "constant",
    "cosine",
    "init",
    "linear",
    "lowrank_factors",
    "lowrank_matmul",
    "perturbed_leaves",
    "perturbed_params",
    "update",
]
