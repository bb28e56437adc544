"""The ES update: equals a naive materialize-and-sum reference (both modes, both scales), equals evosax
Open_ES, never recompiles for new member ids, drops non-finite fitness, keeps O(params) memory, and
behaves statistically (gradient direction on a quadratic, low-rank updates accumulate to high rank)."""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from evosax.algorithms import Open_ES

from esjax.es import ES, ESConfig, ESExecution, NoiseSpec, Scope, init, update
from esjax.es import step as es_step
from esjax.es.grouped import leaf_groups
from esjax.es.noise import member_noise, path_str
from esjax.es.shaping import shape
from esjax.es.step import es_gradient

PARAMS = {
    "dense": {"kernel": jnp.linspace(-1.0, 1.0, 30).reshape(6, 5), "bias": jnp.full((5,), 0.5)},
    "stack": {"kernel": jnp.linspace(0.0, 2.0, 24).reshape(2, 4, 3)},
}
# A cohort with complete antithetic pairs, lone partners, a duplicate member, stale versions and bad fitness.
VERSIONS = np.array([3, 3, 3, 3, 2, 2, 3, 1, 3, 3, 2], np.int32)
INDICES = np.array([0, 1, 2, 3, 0, 1, 4, 5, 7, 0, 3], np.int32)
FITNESS = np.array([1.0, -0.5, 0.25, 2.0, np.nan, 0.75, 3.0, -2.0, 0.1, 1.5, np.inf], np.float32)
VALID = np.isfinite(FITNESS)

CONFIGS = {
    "full-llm": ESConfig(noise=NoiseSpec(seed=1, mode="full", scope=Scope("all")), sigma=0.1, learning_rate=0.2,
                         scale="llm"),
    "full-nes": ESConfig(noise=NoiseSpec(seed=1, mode="full", scope=Scope("all")), sigma=0.1, learning_rate=0.2,
                         scale="nes", shaping="z_score"),
    "lowrank-llm": ESConfig(noise=NoiseSpec(seed=2, mode="lowrank", rank=2, scope=Scope("all")), sigma=0.1,
                            learning_rate=0.2, scale="llm"),
    "lowrank-nes": ESConfig(noise=NoiseSpec(seed=2, mode="lowrank", rank=2, scope=Scope("all")),
                            sigma=lambda t: 0.05 + 0.01 * t, learning_rate=0.2, scale="nes"),
}
#: The draws per chunk each config is updated with (``ESExecution.chunk_size``; None: automatic, 1 in full mode).
CHUNKS = {"full-llm": 1, "full-nes": 4, "lowrank-llm": None, "lowrank-nes": 2}


def _weights(fitness: np.ndarray, method: str) -> np.ndarray:
    valid = np.isfinite(fitness)
    f = fitness[valid].astype(np.float64)
    w = np.zeros(fitness.shape)
    if method == "centered_ranks":
        from scipy.stats import rankdata  # imported here: collection stays cheap

        w[valid] = (rankdata(f) - 1) / (f.size - 1) - 0.5
    else:
        w[valid] = (f - f.mean()) / (f.std() + 1e-8)
    return w


@functools.cache
def _member_noise_fn(seed: int, mode: str, rank: int, antithetic: bool, shapes: tuple):
    """One compiled materializer per noise stream (scope does not change the noise, only where it is used)."""
    spec = NoiseSpec(seed=seed, mode=mode, rank=rank, antithetic=antithetic)
    return jax.jit(jax.vmap(lambda v, i: {k: member_noise(spec, k, shape, v, i) for k, shape in shapes}))


def _naive_gradient(config: ESConfig, params, versions, indices, fitness) -> dict[str, np.ndarray]:
    """Materialize every member's ε and sum in float64: g = Σ_i c_i w_i s_i ε_i (0 outside the scope)."""
    shaping = config.shaping if isinstance(config.shaping, str) else "centered_ranks"
    w = _weights(fitness, shaping)
    n = np.isfinite(fitness).sum()
    sig = np.array([float(config.sigma_at(int(v))) for v in versions]) if config.scale == "nes" else np.ones(len(w))
    coef = w / (n * sig)
    leaves = {path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    spec = config.noise
    fn = _member_noise_fn(spec.seed, spec.mode, spec.rank, spec.antithetic,
                          tuple((k, tuple(x.shape)) for k, x in leaves.items()))
    eps = fn(jnp.asarray(versions), jnp.asarray(indices))
    return {k: np.tensordot(coef, np.asarray(e, np.float64), axes=1) * spec.scope.contains(k, leaves[k])
            for k, e in eps.items()}


def _flat(tree) -> dict[str, np.ndarray]:
    return {path_str(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_update_equals_naive_reference(name):
    config = CONFIGS[name]
    state = init(config, PARAMS, version=3)
    new, metrics = update(config, state, VERSIONS, INDICES, FITNESS, ESExecution(chunk_size=CHUNKS[name]))
    ref = _naive_gradient(config, PARAMS, VERSIONS, INDICES, FITNESS)
    before, after = _flat(PARAMS), _flat(new.params)
    for k in ref:
        # SGD on -g: θ' = θ + lr·g.
        np.testing.assert_allclose(after[k], before[k] + 0.2 * ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert int(new.version) == 4 and int(metrics["version"]) == 4
    assert int(metrics["n_valid"]) == VALID.sum() and int(metrics["n_dropped"]) == 2
    assert float(metrics["fitness_max"]) == 3.0 and float(metrics["lag_max"]) == 2.0
    np.testing.assert_allclose(float(metrics["fitness_mean"]), FITNESS[VALID].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["sigma"]), float(config.sigma_at(3)), rtol=1e-6)
    # Distinct (version, pair) draws among valid members: (3,0) (3,1) (2,0) (3,2) (1,2) (3,3) (2,1) -> at most 7,
    # fewer if a merged coefficient is exactly zero.
    assert 1 <= int(metrics["noise_draws"]) <= 7


def test_update_compiles_once_for_any_member_ids():
    config = CONFIGS["full-llm"]
    state = init(config, PARAMS, version=1000)  # every id below is at or behind the state
    update(config, state, VERSIONS, INDICES, FITNESS)
    size = es_step._update_jit._cache_size()
    rng = np.random.default_rng(0)
    for _ in range(2):
        versions = rng.integers(0, 1000, VERSIONS.size).astype(np.int32)
        indices = rng.integers(0, 1000, VERSIONS.size).astype(np.int32)
        update(config, state, versions, indices, rng.normal(size=VERSIONS.size).astype(np.float32))
    assert es_step._update_jit._cache_size() == size
    lower = lambda v, i: update.lower(config, state, v, i, FITNESS).as_text()
    assert lower(VERSIONS, INDICES) == lower(VERSIONS[::-1].copy(), INDICES * 3 + 1)


def test_dropped_members_are_as_if_absent():
    config = CONFIGS["full-llm"]
    state = init(config, PARAMS, version=3)
    with_bad, m = update(config, state, VERSIONS, INDICES, FITNESS)
    without, _ = update(config, state, VERSIONS[VALID], INDICES[VALID], FITNESS[VALID])
    for k, x in _flat(with_bad.params).items():
        np.testing.assert_allclose(x, _flat(without.params)[k], rtol=1e-6, atol=1e-7)
    assert int(m["n_dropped"]) == 2
    # All members invalid: no direction, no NaN.
    nothing, m = update(config, state, VERSIONS, INDICES, np.full(VERSIONS.size, np.nan, np.float32))
    assert int(m["n_valid"]) == 0 and all(np.array_equal(x, _flat(PARAMS)[k]) for k, x in _flat(nothing.params).items())


def test_decays_scope_and_optimizer():
    """descent = -g + wd·θ + ad·(θ - θ_0) on in-scope leaves, through any optax transformation."""
    noise = NoiseSpec(seed=1, mode="full", scope=Scope("matrices"))
    wd, ad = 0.01, 0.5
    config = ESConfig(noise=noise, optimizer=optax.adam(0.05), weight_decay=wd, anchor_decay=ad)
    tx = optax.adam(0.05)
    tx_update = jax.jit(tx.update)
    state = init(config, PARAMS, version=3)
    ref_params, ref_opt = PARAMS, tx.init(PARAMS)
    theta0 = _flat(PARAMS)
    for step in range(2):
        fitness = FITNESS if step == 0 else FITNESS[::-1].copy()
        state, metrics = update(config, state, VERSIONS + step, INDICES, fitness)
        g = _naive_gradient(config, ref_params, VERSIONS + step, INDICES, fitness)
        theta = _flat(ref_params)
        descent = {k: (-g[k] + wd * theta[k] + ad * (theta[k] - theta0[k])) if k != "dense/bias"
                   else np.zeros_like(theta[k]) for k in theta}
        descent = {"dense": {"kernel": descent["dense/kernel"], "bias": descent["dense/bias"]},
                   "stack": {"kernel": descent["stack/kernel"]}}
        updates, ref_opt = tx_update(descent, ref_opt, ref_params)
        ref_params = optax.apply_updates(ref_params, updates)
        for k, x in _flat(state.params).items():
            np.testing.assert_allclose(x, _flat(ref_params)[k], rtol=1e-5, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(float(metrics["update_norm"]), float(optax.tree.norm(updates)), rtol=1e-4)
    # Outside the scope nothing moves, not even by the decays.
    np.testing.assert_array_equal(_flat(state.params)["dense/bias"], theta0["dense/bias"])


def test_es_object_with_cohort_and_errors():
    es = ES(CONFIGS["full-llm"])
    state = es.init(PARAMS, version=3)
    cohort = types.SimpleNamespace(version=3, versions=VERSIONS.astype(np.int64), indices=INDICES.astype(np.int64),
                                   fitness=FITNESS.astype(np.float64))
    new, m = es.update(state, cohort)
    direct, _ = update(es.config, state, VERSIONS, INDICES, FITNESS)
    assert all(np.array_equal(x, _flat(direct.params)[k]) for k, x in _flat(new.params).items())
    with pytest.raises(ValueError, match="cohort is for version 3"):
        es.update(new, cohort)
    with pytest.raises(ValueError, match="same length"):
        es.update(state, versions=VERSIONS, indices=INDICES[:-1], fitness=FITNESS)
    with pytest.raises(ValueError, match="ahead of the state"):
        es.update(es.init(PARAMS, version=1), cohort=types.SimpleNamespace(versions=VERSIONS, indices=INDICES,
                                                                              fitness=FITNESS))
    with pytest.raises(ValueError, match="scale"):
        ESConfig(scale="openai")


def test_matches_evosax_open_es():
    """Same noise (evosax's population built from ours), centered ranks, SGD, NES scale: the same step."""
    dims, n, std, lr = 40, 16, 0.3, 0.05
    mean = jnp.linspace(-1.0, 1.0, dims)
    noise = NoiseSpec(seed=9, mode="full", scope=Scope("all"))
    config = ESConfig(noise=noise, sigma=std, learning_rate=lr, scale="nes", shaping="centered_ranks")
    evo = Open_ES(n, mean, optimizer=optax.sgd(lr), std_schedule=optax.constant_schedule(std))
    key = jax.random.key(0)
    state, e_state = init(config, mean), evo.init(key, mean, evo.default_params)
    eps = _member_noise_fn(9, "full", 1, True, (("", (dims,)),))
    for t in range(2):
        population = np.asarray(state.params) + std * np.asarray(eps(jnp.full(n, t), jnp.arange(n))[""])
        fitness = np.sum((population - 0.25) ** 2, axis=-1)  # evosax minimizes; our update maximizes -f
        state, _ = update(config, state, np.full(n, t, np.int32), np.arange(n, dtype=np.int32), -fitness)
        e_state, _ = evo.tell(key, jnp.asarray(population), jnp.asarray(fitness), e_state, evo.default_params)
        np.testing.assert_allclose(state.params, evo.get_mean(e_state), rtol=1e-5, atol=1e-6)


def test_full_gradient_points_along_true_gradient():
    dims, n = 200, 4096
    rng = np.random.default_rng(0)
    h = rng.uniform(0.5, 2.0, dims).astype(np.float32)
    target = rng.normal(size=dims).astype(np.float32)
    theta = jnp.zeros(dims)
    true = 2 * h * (target - np.asarray(theta))  # ∇ of f(θ) = -Σ h (θ - t)²
    noise = NoiseSpec(seed=0, mode="full", scope=Scope("all"))
    sigma = 0.05
    eps = jax.jit(jax.vmap(lambda i: member_noise(noise, "", (dims,), 0, i)))(jnp.arange(n))
    fitness = -jnp.sum(h * (theta + sigma * eps - target) ** 2, axis=-1)
    config = ESConfig(noise=noise, sigma=sigma, scale="nes")
    grad = jax.jit(es_gradient, static_argnums=0)
    for method in ("z_score", "centered_ranks"):
        weights, valid = shape(fitness, method)
        g = grad(config, theta, np.zeros(n, np.int32), np.arange(n, dtype=np.int32), weights, valid)
        cos = float(np.dot(g, true) / (np.linalg.norm(g) * np.linalg.norm(true)))
        assert cos > 0.9, (method, cos)


def test_lowrank_rank1_updates_accumulate_to_high_rank():
    m, n_cols, pop = 32, 24, 16
    params = {"w": jnp.zeros((m, n_cols))}
    config = ESConfig(noise=NoiseSpec(seed=3, mode="lowrank", rank=1, antithetic=False), learning_rate=1.0)
    state = init(config, params)
    rng = np.random.default_rng(0)
    ranks = []
    for t in range(3):
        state, _ = update(config, state, np.full(pop, t, np.int32), np.arange(pop, dtype=np.int32),
                          rng.normal(size=pop).astype(np.float32))
        ranks.append(np.linalg.matrix_rank(np.asarray(state.params["w"]), tol=1e-5))
    assert ranks[0] >= min(pop, m, n_cols) - 1  # one update: rank ~ N·r
    assert ranks[-1] >= min(3 * pop, m, n_cols) - 1  # three updates: full rank


def test_gradient_memory_is_independent_of_population():
    params = {"w": jnp.zeros((200, 100))}
    param_bytes = 200 * 100 * 4

    def temp_bytes(config, n):
        lowered = jax.jit(es_gradient, static_argnums=0).lower(
            config, params, np.zeros(n, np.int32), np.arange(n, dtype=np.int32), np.ones(n, np.float32))
        return lowered.compile().memory_analysis().temp_size_in_bytes

    full = ESConfig(noise=NoiseSpec(mode="full"))
    small, large = temp_bytes(full, 32), temp_bytes(full, 2048)
    assert large < 8 * param_bytes, (small, large)  # a few noise-sized buffers, never N of them
    assert large < small + 64 * 1024, (small, large)  # growth: only the [N] id/weight vectors
    lowrank = ESConfig(noise=NoiseSpec(mode="lowrank", rank=1))
    chunk_factors = ESExecution().get_chunk_size(lowrank.noise, params, 2048) * (200 + 100) * 4
    assert temp_bytes(lowrank, 2048) < 2 * param_bytes + 8 * chunk_factors


def test_configs_built_twice_are_equal_and_share_one_compiled_update():
    """ESConfig holds values (optimizer by name), so the config a resume builds again equals the first: one jit
    cache entry, no recompilation."""
    from run_settings import es_config_of

    from esjax.config import load_config

    overrides = ["es.optimizer=adam", "es.weight_decay=0.01", "es.anchor_decay=0.1"]
    first, second = (es_config_of(load_config(None, overrides)) for _ in range(2))
    assert first == second and hash(first) == hash(second)
    update(first, init(first, PARAMS, version=3), VERSIONS, INDICES, FITNESS)
    from esjax.es.step import _update_jit

    size = _update_jit._cache_size()
    update(second, init(second, PARAMS, version=3), VERSIONS, INDICES, FITNESS)
    assert _update_jit._cache_size() == size
    with pytest.raises(ValueError, match="ESConfig.optimizer"):
        ESConfig(optimizer="lion")


# ---------------------------------------------------------------------------------------------------------
# One group of leaves at a time (ESExecution.update_chunk_bytes)
# ---------------------------------------------------------------------------------------------------------


def test_leaf_groups_fill_the_budget_in_order():
    sizes = [5, 1, 1, 10, 2, 2]
    assert leaf_groups(sizes, 4) == [[0], [1, 2], [3], [4, 5]]
    assert leaf_groups(sizes, 0) == [[i] for i in range(6)]
    assert leaf_groups(sizes, None) == [list(range(6))] and leaf_groups([], None) == []
    budget = ESExecution(update_chunk_bytes=35 * 4)  # f32 bytes of dense/bias + dense/kernel: stack/kernel does not fit
    assert budget.update_groups(ESConfig(), PARAMS) == [[0, 1], [2]]  # flatten order: dense/bias, dense/kernel, stack
    clip = ESConfig(optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1)))
    assert ESExecution(update_chunk_bytes=0).update_groups(clip, PARAMS) == [[0, 1, 2]]  # not per-leaf: all at once
    with pytest.raises(ValueError, match="update_chunk_bytes"):
        ESExecution(update_chunk_bytes=-1)


_MOMENTUM = optax.sgd(0.2, momentum=0.9)
#: Each config with the ``update_chunk_bytes`` budgets it is stepped with and the leaf groups each gives: every
#: leaf alone (budget 0); once (each budget is another compile) also a group of two leaves beside one alone.
GROUPED = {
    "full-sgd-f32": (ESConfig(noise=NoiseSpec(seed=1, mode="full", scope=Scope("all")), sigma=0.1,
                              learning_rate=0.2), {0: 3}),
    "full-momentum-chunk2": (ESConfig(noise=NoiseSpec(seed=1, mode="full", scope=Scope("all")), learning_rate=0.2,
                                      optimizer=_MOMENTUM, per_leaf_optimizer=True), {0: 3}),
    "lowrank-sgd-decays": (ESConfig(noise=NoiseSpec(seed=2, mode="lowrank", rank=2, scope=Scope("all")),
                                    learning_rate=0.2, weight_decay=0.01, anchor_decay=0.5, scale="nes"),
                           {0: 3, 35 * 4: 2}),
    "lowrank-sgd-bf16": (ESConfig(noise=NoiseSpec(seed=2, mode="lowrank", rank=1), learning_rate=0.2), {0: 3}),
    "lowrank-adam": (ESConfig(noise=NoiseSpec(seed=2, mode="lowrank", rank=1, scope=Scope("all")), learning_rate=0.2,
                              optimizer="adam", weight_decay=0.01), {0: 3}),
}
GROUPED_CHUNKS = {"full-momentum-chunk2": 2, "lowrank-sgd-bf16": 3}  # ESExecution.chunk_size (else automatic)


@pytest.mark.parametrize("name", list(GROUPED))
def test_grouped_update_equals_all_leaves_at_once(name):
    """Every leaf sums the same draws in the same order and the optimizer is per-leaf, so stepping one group of
    leaves after another gives the all-at-once update bit for bit (two steps, so optimizer state carries over).

    Adam is the exception, to float rounding only: XLA rewrites its bias corrections (``m / (1 - b1^t)``, a
    division by a scalar shared by the leaves of a program) differently depending on how many leaves share
    them, a value-changing rewrite (``(a / b) / c -> a / (b·c)`` or a reciprocal) this code cannot pin down.
    """
    config, budgets = GROUPED[name]
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), PARAMS) if name.endswith("bf16") else PARAMS

    def two_steps(budget):
        e = ESExecution(chunk_size=GROUPED_CHUNKS.get(name), update_chunk_bytes=budget)
        state, m1 = update(config, init(config, params, version=3), VERSIONS, INDICES, FITNESS, e)
        state, m2 = update(config, state, VERSIONS + 1, INDICES, FITNESS[::-1].copy(), e)
        return [np.asarray(x) for x in jax.tree.leaves((state, m1, m2))], len(e.update_groups(config, params))

    whole, groups = two_steps(None)
    assert groups == 1
    for budget, want_groups in budgets.items():
        got, groups = two_steps(budget)
        assert groups == want_groups
        for a, b in zip(got, whole):
            if "adam" in name:
                np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
            else:
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (name, budget)


def test_a_transformation_not_declared_per_leaf_sees_all_leaves():
    """clip_by_global_norm needs every leaf: without per_leaf_optimizer it is stepped whole whatever the budget
    (the same update as update_chunk_bytes=None); declared per-leaf (wrongly) it clips each group on its own."""
    base = ESConfig(noise=NoiseSpec(seed=1, mode="full", scope=Scope("all")),
                    optimizer=optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.2)))
    state = init(base, PARAMS, version=3)

    def run(budget, per_leaf_optimizer=False):
        config = dataclasses.replace(base, per_leaf_optimizer=per_leaf_optimizer)
        execution = ESExecution(update_chunk_bytes=budget)
        return _flat(update(config, state, VERSIONS, INDICES, FITNESS, execution)[0].params)

    whole, safe = run(None), run(0)
    wrong = run(0, per_leaf_optimizer=True)
    assert all(np.array_equal(safe[k], whole[k]) for k in whole)
    assert not all(np.allclose(wrong[k], whole[k]) for k in whole)
