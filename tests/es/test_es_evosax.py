"""The evosax-style CounterOpenES: evosax 0.3 API, lazy populations, the same step as Open_ES, and the same
final fitness as Open_ES on BBOB sphere / rastrigin (D = 100, same hyperparameters, fixed seeds)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from evosax.algorithms import Open_ES
from evosax.problems import BBOBProblem

from esjax.es.evosax_compat import CounterOpenES, Members


def test_api_lazy_population_and_pytree_solutions():
    solution = {"w": jnp.zeros((3, 4)), "b": jnp.ones((4,))}
    es = CounterOpenES(8, solution, optimizer=optax.sgd(0.1), std_schedule=optax.constant_schedule(0.5), seed=3)
    lazy = CounterOpenES(8, solution, optimizer=optax.sgd(0.1), std_schedule=optax.constant_schedule(0.5), seed=3,
                         lazy_population=True)
    params = es.default_params
    key = jax.random.key(0)
    state = es.init(key, solution, params)
    population, _ = es.ask(key, state, params)
    assert population["w"].shape == (8, 3, 4) and population["b"].shape == (8, 4)
    # Antithetic partners 2j / 2j+1 mirror each other around the mean.
    np.testing.assert_allclose(population["b"][0] - 1.0, -(population["b"][1] - 1.0), atol=1e-6)

    members, _ = lazy.ask(key, state, params)
    assert isinstance(members, Members) and members.indices.shape == (8,)
    materialized = lazy.population(state, members)
    for k in solution:
        np.testing.assert_array_equal(materialized[k], population[k])

    fitness = jax.vmap(lambda p: jnp.sum(p["w"] ** 2) + jnp.sum((p["b"] - 2.0) ** 2))(population)
    s_full, m_full = es.tell(key, population, fitness, state, params)
    s_lazy, m_lazy = lazy.tell(key, members, fitness, state, params)
    for k in solution:
        np.testing.assert_allclose(s_full.mean[k], s_lazy.mean[k], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(m_full["best_solution"], m_lazy["best_solution"], rtol=1e-6, atol=1e-7)
    assert float(m_full["best_fitness"]) == float(jnp.min(fitness))
    assert int(s_full.generation_counter) == 1
    # The second generation draws new noise.
    pop2, _ = es.ask(key, s_full, params)
    assert not np.allclose(pop2["b"] - s_full.mean["b"], population["b"] - state.mean["b"])
    # The state keeps its dtypes across generations: the second tell reuses the first one's compilation.
    compiled = CounterOpenES.tell._cache_size()
    es.tell(key, pop2, fitness, s_full, params)
    assert CounterOpenES.tell._cache_size() == compiled
    with pytest.raises(ValueError, match="even"):
        CounterOpenES(7, solution)


def test_tell_equals_open_es_tell_on_the_same_population():
    dims, n = 30, 12
    mean = jnp.linspace(-2.0, 2.0, dims)
    kw = dict(optimizer=optax.sgd(0.03), std_schedule=optax.constant_schedule(0.2))
    ours, evo = CounterOpenES(n, mean, seed=1, **kw), Open_ES(n, mean, **kw)
    key = jax.random.key(1)
    o_state, e_state = ours.init(key, mean, ours.default_params), evo.init(key, mean, evo.default_params)
    population, _ = ours.ask(key, o_state, ours.default_params)
    fitness = jnp.sum(jnp.abs(population - 0.5), axis=-1).at[3].set(jnp.inf)  # minimized; one with a tie
    fitness = fitness.at[3].set(fitness[5])
    o_state, o_metrics = ours.tell(key, population, fitness, o_state, ours.default_params)
    e_state, e_metrics = evo.tell(key, population, fitness, e_state, evo.default_params)
    np.testing.assert_allclose(ours.get_mean(o_state), evo.get_mean(e_state), rtol=1e-5, atol=1e-6)
    for k in ("best_fitness", "best_solution", "mean_norm"):
        np.testing.assert_allclose(o_metrics[k], e_metrics[k], rtol=1e-6)


def _run(es, problem, state, key, generations):
    """An evosax loop (ask, eval, tell) as a scan; returns the fitness of the mean after every generation."""
    params = es.default_params

    def step(carry, key):
        state, pstate = carry
        k_ask, k_eval, k_tell = jax.random.split(key, 3)
        population, state = es.ask(k_ask, state, params)
        fitness, pstate, _ = problem.eval(k_eval, population, pstate)
        state, _ = es.tell(k_tell, population, fitness, state, params)
        f_mean, _, _ = problem.eval(k_eval, es.get_mean(state)[None], pstate)
        return (state, pstate), f_mean[0]

    _, curve = jax.lax.scan(step, (state, problem.init(key)), jax.random.split(key, generations))
    return curve


@pytest.mark.parametrize("fn_name, generations", [("sphere", 300), ("rastrigin", 200)])
def test_bbob_final_fitness_matches_open_es(fn_name, generations):
    dims, n, runs = 100, 32, 4
    problem = BBOBProblem(fn_name, num_dims=dims, f_opt=0.0, seed=0)  # f_opt = 0: compare the function itself
    start = problem.sample(jax.random.key(123))
    kw = dict(optimizer=optax.sgd(0.1), std_schedule=optax.constant_schedule(0.1))
    evo, ours = Open_ES(n, start, **kw), CounterOpenES(n, start, seed=0, **kw)
    keys = jax.random.split(jax.random.key(7), runs)

    evo_curves = jax.jit(jax.vmap(lambda k: _run(evo, problem, evo.init(k, start, evo.default_params), k,
                                                 generations)))(keys)

    def ours_run(k, first_generation):
        # Independent noise streams for the runs: start each at a different generation (version) of one seed.
        state = ours.init(k, start, ours.default_params).replace(generation_counter=first_generation)
        return _run(ours, problem, state, k, generations)

    our_curves = jax.jit(jax.vmap(ours_run))(keys, jnp.arange(runs, dtype=jnp.int32) * 100_000)
    initial = float(problem.eval(keys[0], start[None], problem.init(keys[0]))[0][0])
    # Final fitness: the mean's fitness over the last 50 generations, averaged over the runs.
    evo_final = float(jnp.mean(evo_curves[:, -50:]))
    our_final = float(jnp.mean(our_curves[:, -50:]))
    assert evo_final < 0.5 * initial  # the setting actually optimizes
    assert abs(our_final - evo_final) <= 0.1 * evo_final, (fn_name, initial, evo_final, our_final)
