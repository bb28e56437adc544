"""An evosax-style OpenAI-ES whose population lives in esjax's counter-based noise.

:class:`CounterOpenES` is a drop-in for ``evosax.algorithms.Open_ES`` (evosax 0.3 API: ``default_params``,
``init(key, mean, params)``, ``ask(key, state, params)``, ``tell(key, population, fitness, state, params)``
-> ``(state, metrics)``) for flat-vector or pytree solutions.

**Convention: as an evosax drop-in it MINIMIZES by default** (``maximize=False``), like every evosax algorithm:
``tell`` takes evosax fitness (lower is better), and ``fitness_shaping_fn`` is an evosax shaping function.
``maximize=True`` takes fitness that is better higher, as :mod:`esjax.es` does by default (``ESConfig.maximize``);
the best-so-far tracking follows the same direction. Internally the fitness to minimize is negated and handed to
the same shaping adapter and weighted noise sum as :func:`esjax.es.step.update`, so the step is exactly evosax's
``grad = Σ_i w_i z_i / (N σ)``, ``mean ← optimizer(grad)``.

Differences from ``Open_ES`` that matter:

* Member ``i`` of generation ``t`` is esjax member ``(t, i)``: its noise is a pure function of
  ``(seed, leaf path, t, i // 2)`` with antithetic partners ``2j`` / ``2j+1`` (evosax pairs ``j`` with
  ``j + N/2``). The ``key`` arguments are accepted for API compatibility and ignored: reproducibility
  comes from ``seed``.
* ``tell`` never needs the population's values: it regenerates each member's noise in chunks (memory
  O(dims), not O(N·dims)). With ``lazy_population=True``, ``ask`` returns :class:`Members` (two int
  arrays) instead of an ``N × dims`` array; materialize some or all with :meth:`CounterOpenES.population`.
* ``state.mean`` keeps the solution's pytree structure (``get_mean`` returns it); metrics hold raveled
  vectors like evosax's.
* Members whose fitness is NaN/inf are dropped from the update (``N`` counts the valid ones).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import optax
from evosax.core.fitness_shaping import centered_rank_fitness_shaping_fn
from flax import struct
from jax import flatten_util

from esjax.es import shaping as shaping_lib
from esjax.es.gradient import weighted_noise_sum
from esjax.es.noise import NoiseMode, NoiseSpec, Scope, perturbed_params

PyTree = Any
ALL_LEAVES = Scope(kind="all")
UNIT_STD = optax.constant_schedule(1.0)


@struct.dataclass
class Members:
    """A lazily identified population: member ``k`` is esjax member ``(versions[k], indices[k])``."""

    versions: jax.Array
    indices: jax.Array


@struct.dataclass
class State:
    mean: PyTree
    std: jax.Array
    opt_state: optax.OptState
    best_solution: jax.Array
    best_fitness: jax.Array
    generation_counter: jax.Array


@struct.dataclass
class Params:
    pass


class CounterOpenES:
    """OpenAI-ES with counter-based noise, evosax 0.3 interface (minimizes unless ``maximize=True``; see the module
    docstring)."""

    def __init__(
        self,
        population_size: int,
        solution: PyTree,
        use_antithetic_sampling: bool = True,
        optimizer: optax.GradientTransformation | None = None,
        std_schedule: Callable[[Any], Any] = UNIT_STD,
        fitness_shaping_fn: Callable[..., jax.Array] = centered_rank_fitness_shaping_fn,
        *,
        seed: int = 0,
        mode: NoiseMode = "full",
        rank: int = 1,
        scope: Scope = ALL_LEAVES,
        lazy_population: bool = False,
        chunk_size: int | None = None,
        maximize: bool = False,
    ):
        if population_size < 1 or (use_antithetic_sampling and population_size % 2):
            raise ValueError(f"population_size must be >= 1 (and even with antithetic sampling), got {population_size}")
        self.population_size = int(population_size)
        self.solution = solution
        self.optimizer = optimizer if optimizer is not None else optax.sgd(1e-3)
        self.std_schedule = std_schedule
        self.fitness_shaping_fn = fitness_shaping_fn
        self.spec = NoiseSpec(seed=seed, mode=mode, rank=rank, antithetic=use_antithetic_sampling, scope=scope)
        self.lazy_population = lazy_population
        self.chunk_size = chunk_size
        self.maximize = bool(maximize)
        flat, self._unravel = flatten_util.ravel_pytree(solution)
        self.num_dims = int(flat.size)

    @property
    def default_params(self) -> Params:
        return Params()

    def _ravel(self, tree: PyTree) -> jax.Array:
        return flatten_util.ravel_pytree(tree)[0]

    def get_mean(self, state: State) -> PyTree:
        return state.mean

    @partial(jax.jit, static_argnames=("self",))
    def init(self, key: jax.Array, mean: PyTree, params: Params) -> State:
        """Initial state around ``mean`` (``key`` unused: the noise comes from ``seed``)."""
        mean = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), mean)
        return State(
            mean=mean,
            std=jnp.asarray(self.std_schedule(0), jnp.float32),
            opt_state=self.optimizer.init(mean),
            best_solution=jnp.full((self.num_dims,), jnp.nan, jnp.float32),
            best_fitness=jnp.asarray(-jnp.inf if self.maximize else jnp.inf, jnp.float32),
            generation_counter=jnp.asarray(0, jnp.int32),
        )

    def members(self, state: State) -> Members:
        """The ids of this generation's population."""
        n = self.population_size
        return Members(jnp.full((n,), state.generation_counter, jnp.int32), jnp.arange(n, dtype=jnp.int32))

    @partial(jax.jit, static_argnames=("self",))
    def population(self, state: State, members: Members | None = None) -> PyTree:
        """Materialize members (default: the whole generation) as a pytree with a leading member axis."""
        members = self.members(state) if members is None else members
        one = lambda v, i: perturbed_params(self.spec, state.mean, v, i, state.std)
        return jax.vmap(one)(members.versions, members.indices)

    @partial(jax.jit, static_argnames=("self",))
    def ask(self, key: jax.Array, state: State, params: Params) -> tuple[PyTree | Members, State]:
        """This generation's population: materialized, or :class:`Members` if ``lazy_population``."""
        members = self.members(state)
        if self.lazy_population:
            return members, state
        return self.population(state, members), state

    @partial(jax.jit, static_argnames=("self",))
    def tell(self, key: jax.Array, population: PyTree | Members, fitness: jax.Array, state: State,
             params: Params) -> tuple[State, dict[str, Any]]:
        """Update the mean from evosax fitness (MINIMIZED, or maximized with ``maximize=True``). ``population`` may
        be :class:`Members`."""
        fitness = jnp.asarray(fitness, jnp.float32)
        loss = -fitness if self.maximize else fitness  # what is minimized (evosax's default: the fitness itself)
        if isinstance(population, Members):
            members, flat_population = population, None
        else:
            members = self.members(state)
            flat_population = jax.vmap(self._ravel)(population)

        # Best so far (failed evaluations cannot improve it), as evosax does; kept in the caller's direction.
        archive = jnp.where(jnp.isnan(loss), jnp.inf, loss)
        best = jnp.argmin(archive)
        if flat_population is not None:
            best_member = flat_population[best]
        else:
            best_member = self._ravel(perturbed_params(self.spec, state.mean, members.versions[best],
                                                       members.indices[best], state.std))
        best_loss = -state.best_fitness if self.maximize else state.best_fitness
        improved = archive[best] < best_loss
        best_solution = jnp.where(improved, best_member, state.best_solution)
        best_fitness = jnp.where(improved, archive[best], best_loss)
        generation_best = archive[best]
        if self.maximize:
            best_fitness, generation_best = -best_fitness, -generation_best

        # the loss -> esjax's maximized convention -> the shared adapter (w = -fn(pop, loss)).
        shaped = shaping_lib.evosax_shaping(self.fitness_shaping_fn, flat_population, state, params)
        valid = jnp.isfinite(fitness)
        weights = shaped(-loss, valid)
        n = jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0)
        coefs = weights / (n * state.std)
        grad = weighted_noise_sum(self.spec, state.mean, members.versions, members.indices, coefs,
                                  self.chunk_size)
        descent = jax.tree_util.tree_map(lambda g: -g, grad)
        updates, opt_state = self.optimizer.update(descent, state.opt_state, state.mean)
        mean = optax.apply_updates(state.mean, updates)

        new_state = state.replace(
            mean=mean,
            std=jnp.asarray(self.std_schedule(state.generation_counter), jnp.float32),
            opt_state=opt_state,
            best_solution=best_solution,
            best_fitness=best_fitness,
            generation_counter=state.generation_counter + 1,
        )
        flat_mean = self._ravel(state.mean)
        metrics = {
            "generation_counter": state.generation_counter,
            "best_fitness_in_generation": generation_best,
            "best_solution_in_generation": best_member,
            "best_fitness": best_fitness,
            "best_solution": best_solution,
            "best_solution_norm": jnp.linalg.norm(best_solution),
            "mean": flat_mean,
            "mean_norm": jnp.linalg.norm(flat_mean),
            "n_valid": jnp.sum(valid.astype(jnp.int32)),
        }
        return new_state, metrics
