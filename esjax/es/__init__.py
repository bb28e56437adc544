"""ES engine: counter-based noise, fitness shaping, σ schedules, the jitted update, evosax interop.

Fitness is maximized everywhere here except in :mod:`esjax.es.evosax_compat`, which follows evosax
(minimization) because it is an evosax drop-in.
"""

from esjax.es import schedules, shaping
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
from esjax.es.schedules import Constant, Cosine, Linear, constant, cosine, linear
from esjax.es.shaping import centered_ranks, evosax_shaping, get_shaping, raw, shape, z_score
from esjax.es.step import ES, ESConfig, ESState, es_gradient, init, member_coefficients, update

__all__ = [
    "ES",
    "Constant",
    "Cosine",
    "ESConfig",
    "ESState",
    "Linear",
    "NoiseSpec",
    "Scope",
    "auto_chunk_size",
    "batched_pair_noise",
    "centered_ranks",
    "constant",
    "cosine",
    "es_gradient",
    "evosax_shaping",
    "get_shaping",
    "init",
    "leaf_id",
    "leaf_paths",
    "linear",
    "lowrank_embed",
    "lowrank_factor_tree",
    "lowrank_factors",
    "lowrank_matmul",
    "lowrank_product",
    "member_coefficients",
    "member_noise",
    "merge_draws",
    "pair_noise",
    "path_str",
    "perturbed_leaves",
    "perturbed_params",
    "raw",
    "schedules",
    "shape",
    "shaping",
    "update",
    "weighted_noise_sum",
    "z_score",
]
