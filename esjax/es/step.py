"""The ES update: a cohort ``(versions[N], indices[N], fitness[N])`` -> new parameters, version + 1.

Fitness is MAXIMIZED by default (``ESConfig.maximize=True``; ``maximize=False`` minimizes, e.g. a loss, as evosax
does). The public API (functional, optax-style; ``config`` is static, everything else traced)::

    config = ESConfig(noise=NoiseSpec(seed=0, mode="lowrank", rank=1), sigma=1.5e-3, learning_rate=7.5e-4)
    state = init(config, params)                                  # ESState(params, opt_state, version)
    state, metrics = update(config, state, versions, indices, fitness)   # jitted
    grad = es_gradient(config, params, versions, indices, weights)       # g = c · Σ w_i s_i ε_i

or, evosax-style, ``es = ES(config); state = es.init(params); state, metrics = es.update(state, cohort)``
where ``cohort`` has ``.versions``, ``.indices``, ``.fitness`` (e.g. :class:`esjax.loop.types.Cohort`).

:class:`ESConfig` says *what* the update computes; :class:`ESExecution` (an optional last argument of
``update``, ``es_gradient`` and ``ES``) says how it is laid out in memory, which changes the result at most by float
rounding.

What one update does:

1. **Shaping** (:mod:`esjax.es.shaping`): members with NaN/inf fitness are dropped (weight 0, excluded from
   the statistics, counted in ``metrics['n_dropped']``); the rest get weights ``w_i``.
2. **Gradient** ``g = Σ_i c_i w_i s_i ε_i`` over the ``n`` valid members, with ``c_i = 1/(n σ_{v_i})``
   (``scale='nes'``; each member divided by the σ it was evaluated with) or ``c_i = 1/n``
   (``scale='llm'``, the published LLM-ES convention: σ is folded into the learning rate). ``ε_i`` is the
   member's own noise from :mod:`esjax.es.noise` regenerated at its own version ``v_i`` (stale members
   keep their noise; no off-policy correction). Leaves outside the scope get zero gradient.
3. **Step**: an optax chain (:meth:`ESConfig.get_optimizer`) receives ``-g`` and adds the L2-style decays as
   transforms, ``optax.add_decayed_weights(wd)`` and :func:`anchor_decay` ``(ad)`` (as in OpenAI-ES; masked to
   the in-scope leaves), before the optimizer (``'sgd'`` or ``'adam'`` at ``learning_rate``, or any optax
   transformation): plain SGD gives ``θ ← θ + lr·(g − wd·θ − ad·(θ − θ_0))``.

Memory is O(params), independent of N: the weighted noise sum is :mod:`esjax.es.gradient`'s. The compiled
program depends only on N, the parameter shapes and the (static) config — never on the values of versions or
indices.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from esjax.es import shaping as shaping_lib
from esjax.es.gradient import chunked_draws, draw_chunk, scoped_leaves, weighted_noise_sum
from esjax.es.grouped import UPDATE_CHUNK_BYTES, grouped_step, leaf_groups
from esjax.es.noise import NoiseSpec, default_scope_warning, perturbed_leaves, perturbed_params
from esjax.es.sigma_schedules import SigmaSchedule, as_schedule

PyTree = Any
Scale = Literal["nes", "llm"]
OptimizerName = Literal["sgd", "adam"]

@dataclasses.dataclass(frozen=True)
class ESConfig:
    """Static description of the update (hashable: a jit static argument).

    Attributes:
      noise: the run's :class:`~esjax.es.noise.NoiseSpec` (seed, mode, rank, antithetic, scope).
      sigma: noise scale σ, a float or a schedule of the version (:mod:`esjax.es.sigma_schedules`).
      learning_rate: step size α (float or optax schedule) of the named optimizer.
      scale: ``'llm'`` (``c = 1/N``, σ folded into α) or ``'nes'`` (``c = 1/(Nσ)``).
      shaping: ``'centered_ranks'`` (default), ``'z_score'``, ``'raw'``, a ``fn(fitness, valid)``, or any
        evosax fitness-shaping function (negated automatically: evosax minimizes).
      optimizer: ``'sgd'`` or ``'adam'`` (at ``learning_rate``): a value, so equal configs are equal and share
        compiled programs; or any optax transformation (compared by identity: a new object recompiles).
      weight_decay: L2 coefficient toward 0 added to the descent direction.
      anchor_decay: L2 coefficient toward the initial parameters θ_0 (kept in the optimizer state).
      per_leaf_optimizer: a custom ``optimizer`` acts on every leaf on its own (optax's sgd, momentum, adam,
        decays, …), so it may be stepped group by group (:attr:`ESExecution.update_chunk_bytes`). Leave it False
        for a transformation that needs all leaves (``clip_by_global_norm``, ``apply_if_finite``): the update
        then steps it on all leaves at once. The named optimizers are per-leaf.
      maximize: the direction: True (default) raises fitness; False lowers it (fitness is a loss, evosax's
        convention: the update then shapes ``-fitness``). Metrics report fitness as given.

    Memory settings (draws per chunk, leaves per optimizer step) are not here: :class:`ESExecution`.
    """

    noise: NoiseSpec = NoiseSpec()
    sigma: float | SigmaSchedule = 1.5e-3
    learning_rate: float | Callable[[Any], Any] = 7.5e-4
    scale: Scale = "llm"
    shaping: str | Callable[..., Any] = "centered_ranks"
    optimizer: OptimizerName | optax.GradientTransformation = "sgd"
    weight_decay: float = 0.0
    anchor_decay: float = 0.0
    per_leaf_optimizer: bool = False
    maximize: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.noise, NoiseSpec):
            raise TypeError(f"ESConfig.noise must be a NoiseSpec, got {type(self.noise).__name__}")
        if self.scale not in ("nes", "llm"):
            raise ValueError(f"ESConfig.scale must be 'nes' or 'llm', got {self.scale!r}")
        if isinstance(self.optimizer, str) and self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"ESConfig.optimizer must be 'sgd', 'adam' or an optax transformation, got "
                             f"{self.optimizer!r}")
        if not isinstance(self.maximize, bool):
            raise TypeError(f"ESConfig.maximize must be True or False, got {self.maximize!r}")
        as_schedule(self.sigma)  # validates a float sigma
        shaping_lib.get_shaping(self.shaping)  # validates the name
        if self.weight_decay < 0 or self.anchor_decay < 0:
            raise ValueError("ESConfig.weight_decay and anchor_decay must be >= 0, got "
                             f"{self.weight_decay} and {self.anchor_decay}")

    def maximized(self, fitness: jax.Array) -> jax.Array:
        """``fitness`` in the direction the update raises: as it is (``maximize``) or negated."""
        return fitness if self.maximize else -fitness

    def sigma_at(self, version) -> jax.Array:
        """σ of members dispatched at ``version`` (array or scalar, traced or concrete)."""
        return jnp.asarray(as_schedule(self.sigma)(jnp.asarray(version, jnp.int32)), jnp.float32)

    def get_optimizer(self) -> optax.GradientTransformation:
        """The step as an optax chain: the decays (in-scope leaves only), then the optimizer."""
        if self.optimizer == "sgd":
            base = optax.sgd(self.learning_rate)
        elif self.optimizer == "adam":
            base = optax.adam(self.learning_rate)
        else:
            base = self.optimizer
        decays = []
        mask = functools.partial(scope_mask, self.noise)
        if self.weight_decay:
            decays.append(optax.add_decayed_weights(self.weight_decay, mask=mask))
        if self.anchor_decay:
            decays.append(optax.masked(anchor_decay(self.anchor_decay), mask))
        return optax.chain(*decays, base) if decays else base


@dataclasses.dataclass(frozen=True)
class ESExecution:
    """How the update is laid out in memory, apart from what it computes (:class:`ESConfig`); hashable, a jit
    static argument. The defaults are what the trainer runs with.

    Attributes:
      chunk_size: distinct noise draws generated together; ``None``: :func:`auto_chunk_size` (1 in full
        mode). Peak extra memory is a few × ``chunk_size`` × the largest dense leaf (full) or
        ``chunk_size·(m+n)·r`` per low-rank leaf.
      update_chunk_bytes: the update forms the gradient and steps the optimizer one group of leaves at a time
        (consecutive leaves whose float32 gradients fit this many bytes; a larger leaf is a group alone), so
        at most one group's float32 gradient is alive (:func:`leaf_groups`); ``None``: all leaves at once.
        The result is bit-identical either way for SGD, momentum and the decays (Adam: to float rounding).
        Only an optimizer that is per-leaf (:attr:`ESConfig.per_leaf_optimizer`) is stepped in groups.
    """

    chunk_size: int | None = None
    update_chunk_bytes: int | None = UPDATE_CHUNK_BYTES

    def __post_init__(self) -> None:
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"ESExecution.chunk_size must be >= 1 or None, got {self.chunk_size}")
        if self.update_chunk_bytes is not None and self.update_chunk_bytes < 0:
            raise ValueError(f"ESExecution.update_chunk_bytes must be >= 0 or None, got {self.update_chunk_bytes}")

    def get_chunk_size(self, noise: NoiseSpec, params: PyTree, n: int) -> int:
        """Draws per chunk for a cohort of ``n`` members on ``params`` (explicit or automatic)."""
        return draw_chunk(noise, params, n, self.chunk_size)

    def update_groups(self, config: ESConfig, params: PyTree) -> list[list[int]]:
        """The groups of leaf indices (flatten order) the update of ``config`` steps one after another."""
        shapes = [np.shape(x) for x in jax.tree_util.tree_leaves(params)]
        per_leaf = isinstance(config.optimizer, str) or config.per_leaf_optimizer
        return leaf_groups([4 * math.prod(s) for s in shapes], self.update_chunk_bytes if per_leaf else None)


#: The memory layout the update uses unless told otherwise (the trainer's).
DEFAULT_EXECUTION = ESExecution()


class ESState(NamedTuple):
    """Parameters θ_t, optimizer state (with θ_0 under anchor decay) and version ``t`` (int32 scalar)."""

    params: PyTree
    opt_state: optax.OptState
    version: jax.Array


def init(config: ESConfig, params: PyTree, version: int = 0, *, stacklevel: int = 2) -> ESState:
    """Initial state at ``version`` (0 for a fresh run).

    Warns (once per call) when the scope was left at its default and freezes floating vectors (biases, norm
    scales): :func:`~esjax.es.noise.default_scope_warning`. :func:`~esjax.es.noise.perturbed_leaves` lists
    what is perturbed and what is frozen."""
    message = default_scope_warning(params, config.noise)
    if message:
        warnings.warn(message, UserWarning, stacklevel=stacklevel)
    return ESState(params, config.get_optimizer().init(params), jnp.asarray(version, jnp.int32))


class AnchorState(NamedTuple):
    anchor: PyTree  # θ_0


def anchor_decay(coefficient: float) -> optax.GradientTransformation:
    """Adds ``coefficient · (θ − θ_0)`` to the updates: L2 decay toward the parameters the state was initialised
    with (θ_0, kept in the transformation's state), computed in float32."""

    def init_fn(params: PyTree) -> AnchorState:
        return AnchorState(jax.tree_util.tree_map(jnp.array, params))

    def update_fn(updates: PyTree, state: AnchorState, params: PyTree | None = None):
        if params is None:
            raise ValueError("anchor_decay needs the parameters (optax's update(updates, state, params))")
        updates = jax.tree_util.tree_map(
            lambda u, p, p0: u + coefficient * (p.astype(jnp.float32) - p0.astype(jnp.float32)),
            updates, params, state.anchor)
        return updates, state

    return optax.GradientTransformation(init_fn, update_fn)


def scope_mask(spec: NoiseSpec, params: PyTree) -> PyTree:
    """``params``' structure with True on the leaves the noise scope perturbs (the decays' optax mask)."""
    _, in_scope, treedef = scoped_leaves(spec, params)
    return jax.tree_util.tree_unflatten(treedef, in_scope)


def member_coefficients(config: ESConfig, versions, weights, valid=None) -> jax.Array:
    """``c_i w_i``: ``w_i / n`` (llm) or ``w_i / (n σ_{v_i})`` (nes), ``n`` = number of valid members."""
    weights = jnp.asarray(weights, jnp.float32).reshape(-1)
    if valid is None:
        n = jnp.float32(weights.shape[0])
    else:
        valid = jnp.asarray(valid, bool).reshape(-1)
        weights = jnp.where(valid, weights, 0.0)
        n = jnp.sum(valid.astype(jnp.float32))
    coefs = weights / jnp.maximum(n, 1.0)
    if config.scale == "nes":
        coefs = coefs / config.sigma_at(versions)
    return coefs


def es_gradient(config: ESConfig, params: PyTree, versions, indices, weights, valid=None,
                execution: ESExecution = DEFAULT_EXECUTION) -> PyTree:
    """Ascent direction ``g = Σ_i c_i w_i s_i ε_i`` (float32 tree like ``params``; 0 outside the scope).

    ``weights`` are shaped fitness ("larger = better"); ``valid`` (default: all) sets ``n`` in ``c``.
    """
    coefs = member_coefficients(config, versions, weights, valid)
    return weighted_noise_sum(config.noise, params, versions, indices, coefs, execution.chunk_size)


# ---------------------------------------------------------------------------------------------------------
# The update
# ---------------------------------------------------------------------------------------------------------


def _check_cohort(versions, indices, fitness) -> None:
    shapes = {"versions": np.shape(versions), "indices": np.shape(indices), "fitness": np.shape(fitness)}
    for name, s in shapes.items():
        if len(s) != 1:
            raise ValueError(f"ES update: {name} must be a 1-D array [N], got shape {s}")
    if len({s[0] for s in shapes.values()}) != 1:
        raise ValueError(f"ES update: versions, indices and fitness must have the same length N, got {shapes}")
    if shapes["fitness"][0] == 0:
        raise ValueError("ES update: the cohort is empty (N = 0)")


def check_members(state_version, versions, indices, caller: str = "ES update") -> None:
    """Raise ``ValueError`` unless every member id is ``(v, i)`` with ``0 <= v <= state_version``, ``i >= 0``.

    A member from a version ahead of the state cannot exist (its noise would be drawn around a θ not yet
    computed); a negative id would alias another member's noise. Only concrete values are checked: under an
    outer ``jax.jit`` the caller checks before tracing (as :class:`esjax.parallel.sharded.ShardedES` does).
    """
    if any(isinstance(x, jax.core.Tracer) for x in (state_version, versions, indices)):
        return
    versions, indices = np.asarray(versions), np.asarray(indices)
    if versions.size and (versions.min() < 0 or indices.min() < 0):
        raise ValueError(f"{caller}: versions and indices must be >= 0")
    if versions.size and versions.max() > int(state_version):
        raise ValueError(f"{caller}: a member's version {int(versions.max())} is ahead of the state "
                         f"(version {int(state_version)})")


def _update(config: ESConfig, state: ESState, versions, indices, fitness, weights=None,
            execution: ESExecution = DEFAULT_EXECUTION) -> tuple[ESState, dict[str, jax.Array]]:
    _check_cohort(versions, indices, fitness)
    versions = jnp.asarray(versions, jnp.int32)
    indices = jnp.asarray(indices, jnp.int32)
    fitness = jnp.asarray(fitness, jnp.float32)
    if weights is None:
        weights, valid = shaping_lib.shape(config.maximized(fitness), config.shaping)
    else:  # shaped before the jit (see update)
        valid = shaping_lib.valid_mask(fitness)
        weights = jnp.where(valid, jnp.asarray(weights, jnp.float32), 0.0)
    n_valid = jnp.sum(valid.astype(jnp.int32))
    coefs = member_coefficients(config, versions, weights, valid)
    n = versions.shape[0]
    chunk = execution.get_chunk_size(config.noise, state.params, n)
    draws = chunked_draws(config.noise, versions, indices, coefs, chunk)
    groups = execution.update_groups(config, state.params)
    params, opt_state, grad_sq, update_sq = grouped_step(config.get_optimizer(), config.noise, groups, state.params,
                                                         state.opt_state, draws)

    finite = jnp.where(valid, fitness, 0.0)
    nv = jnp.maximum(n_valid, 1).astype(jnp.float32)
    mean = jnp.sum(finite) / nv
    nan = jnp.float32(jnp.nan)
    lags = (state.version - versions).astype(jnp.float32)
    metrics = {
        "version": state.version + 1,
        "n_valid": n_valid,
        "n_dropped": fitness.shape[0] - n_valid,
        "noise_draws": jnp.sum(draws[2] != 0),
        "sigma": config.sigma_at(state.version),
        "grad_norm": jnp.sqrt(grad_sq),
        "update_norm": jnp.sqrt(update_sq),
        "fitness_mean": jnp.where(n_valid > 0, mean, nan),
        "fitness_std": jnp.where(n_valid > 0, jnp.sqrt(jnp.sum(jnp.where(valid, (finite - mean) ** 2, 0.0)) / nv), nan),
        "fitness_max": jnp.where(n_valid > 0, jnp.max(jnp.where(valid, fitness, -jnp.inf)), nan),
        "fitness_min": jnp.where(n_valid > 0, jnp.min(jnp.where(valid, fitness, jnp.inf)), nan),
        "lag_mean": jnp.mean(lags),
        "lag_max": jnp.max(lags),
    }
    return ESState(params, opt_state, state.version + 1), metrics


_update_jit = jax.jit(_update, static_argnums=(0, 6))


def update(config: ESConfig, state: ESState, versions, indices, fitness,
           execution: ESExecution = DEFAULT_EXECUTION) -> tuple[ESState, dict[str, jax.Array]]:
    """Apply one ES update (a jitted program; ``config`` and ``execution`` static). Fitness is maximized
    (``config.maximize``, the default) or minimized.

    Args:
      config: the :class:`ESConfig`.
      state: current :class:`ESState` at version ``t``.
      versions, indices: ``[N]`` member ids ``(v_i, i)``, ``0 ≤ v_i ≤ t`` and ``i ≥ 0`` (else ``ValueError``;
        checked when the values are concrete, see :func:`check_members`); stale members use their own noise.
      fitness: ``[N]`` raw fitness (higher is better unless ``config.maximize`` is False); NaN/inf members are
        dropped and counted.
      execution: the memory layout (:class:`ESExecution`): the same update whatever it is, up to float rounding.

    Returns:
      ``(new_state, metrics)`` with ``new_state.version = t + 1`` and metrics ``version, n_valid, n_dropped,
      noise_draws, sigma, grad_norm, update_norm, fitness_mean/std/max/min, lag_mean, lag_max``.

    An evosax shaping function is applied to concrete fitness before the jit, so it sees exactly the valid
    members and the compiled program does not depend on how many there are
    (:func:`esjax.es.shaping.evosax_shaping`). ``update.lower(...)`` / ``update.trace(...)`` give the jitted
    program (nothing is checked there; its arguments: ``config, state, versions, indices, fitness, weights=None,
    execution``).
    """
    check_members(state.version, versions, indices)
    weights = None
    if shaping_lib.is_evosax_style(config.shaping) and not isinstance(fitness, jax.core.Tracer):
        weights = shaping_lib.shape(config.maximized(jnp.asarray(fitness, jnp.float32)), config.shaping)[0]
    return _update_jit(config, state, versions, indices, fitness, weights, execution)


update.lower = _update_jit.lower
update.trace = _update_jit.trace


class ES:
    """Object wrapper (evosax-like) around :func:`init` / :func:`update` for one :class:`ESConfig`.

    ``es = ES(config); state = es.init(params)``, then per generation ``members, population = es.ask(state, N,
    params=True)``, evaluate, ``state, metrics = es.tell(state, members, fitness)`` (maximized unless
    ``config.maximize`` is False); or
    ``es.update(state, cohort)`` on a cohort assembled elsewhere (the trainer's coordinator). After ``init``,
    ``es.perturbed`` and ``es.frozen`` hold the paths of the leaves the scope perturbs and leaves alone.
    ``execution``: the update's memory layout (:class:`ESExecution`).
    """

    def __init__(self, config: ESConfig, execution: ESExecution = DEFAULT_EXECUTION):
        if not isinstance(config, ESConfig):
            raise TypeError(f"ES expects an ESConfig, got {type(config).__name__}")
        if not isinstance(execution, ESExecution):
            raise TypeError(f"ES expects an ESExecution, got {type(execution).__name__}")
        self.config = config
        self.execution = execution
        self.perturbed: list[str] = []
        self.frozen: list[str] = []

    def init(self, params: PyTree, version: int = 0) -> ESState:
        """Initial state; records ``perturbed`` / ``frozen`` and warns as :func:`init` does."""
        self.perturbed, self.frozen = perturbed_leaves(params, self.config.noise)
        return init(self.config, params, version, stacklevel=3)

    def sigma(self, version) -> jax.Array:
        """σ of members dispatched at ``version``."""
        return self.config.sigma_at(version)

    def update(self, state: ESState, cohort: Any = None, *, versions=None, indices=None,
               fitness=None) -> tuple[ESState, dict[str, jax.Array]]:
        """One update from a cohort object (``.versions``, ``.indices``, ``.fitness``; optional ``.version``
        checked against ``state.version``) or from the three arrays as keywords."""
        if cohort is not None:
            versions, indices, fitness = cohort.versions, cohort.indices, cohort.fitness
            expected = getattr(cohort, "version", None)
            if expected is not None and int(expected) != int(state.version):
                raise ValueError(f"ES.update: the cohort is for version {int(expected)} but the state is at "
                                 f"version {int(state.version)}")
        if versions is None or indices is None or fitness is None:
            raise ValueError("ES.update needs a cohort or versions=, indices= and fitness=")
        versions, indices = np.asarray(versions), np.asarray(indices)
        check_members(state.version, versions, indices, "ES.update")
        return update(self.config, state, versions.astype(np.int32), indices.astype(np.int32),
                      np.asarray(fitness, np.float32), self.execution)

    def ask(self, state: ESState, population: int, *, params: bool = False
            ) -> tuple[tuple[np.ndarray, np.ndarray], PyTree | None]:
        """The next ``population`` members to evaluate, evosax-style: ``((versions, indices), member_params)``.

        Members are ``(state.version, 0 … population-1)`` (antithetic pairs ``2j, 2j+1`` when the noise is
        antithetic). ``member_params`` is None unless ``params=True``, then each member's θ + σ·ε stacked on a
        leading axis (materialized: for small models; a large model applies the perturbation inside its forward
        from the member ids, see :mod:`esjax.model.perturb`)."""
        if population < 1 or (self.config.noise.antithetic and population % 2):
            raise ValueError(f"ES.ask: population must be a positive{' even' if self.config.noise.antithetic else ''}"
                             f" number, got {population}")
        version = int(state.version)
        versions = np.full(population, version, np.int32)
        indices = np.arange(population, dtype=np.int32)
        if not params:
            return (versions, indices), None
        sigma = self.config.sigma_at(version)
        stacked = jax.vmap(lambda i: perturbed_params(self.config.noise, state.params, version, i, sigma))(
            jnp.asarray(indices))
        return (versions, indices), stacked

    def tell(self, state: ESState, members: tuple[Any, Any], fitness) -> tuple[ESState, dict[str, jax.Array]]:
        """Apply the fitness of the members :meth:`ask` gave (``members = (versions, indices)``). Fitness is
        **maximized** by default (``ESConfig(maximize=False)`` minimizes, as evosax does); NaN members are
        dropped. Members asked at an older version may be told later: their own noise is used (bounded
        staleness)."""
        versions, indices = members
        return self.update(state, versions=versions, indices=indices, fitness=fitness)

    def gradient(self, params: PyTree, versions, indices, fitness) -> PyTree:
        """The ascent direction the update would use for this cohort (shaping included)."""
        fitness = self.config.maximized(jnp.asarray(fitness, jnp.float32))
        weights, valid = shaping_lib.shape(fitness, self.config.shaping)
        return es_gradient(self.config, params, versions, indices, weights, valid, self.execution)
