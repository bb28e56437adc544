"""ES contract: NaN/inf members are excluded from every statistic also through the evosax shaping adapter
(eager, jitted and inside CounterOpenES), seeds outside [0, 2**32) are refused instead of aliasing, and the
functional update refuses members from versions ahead of the state, as ES.update does; the direction (maximize /
minimize) is explicit on both faces; esjax.es exports its __all__ only."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from evosax.core.fitness_shaping import centered_rank_fitness_shaping_fn, standardize_fitness_shaping_fn

from esjax.es import ES, ESConfig, NoiseSpec, Scope, init, shaping, step, update
from esjax.es.evosax_compat import CounterOpenES
from esjax.es.noise import pair_noise, perturbed_params

# Four valid members and three invalid ones (NaN, +inf, -inf) in between.
FITNESS = np.array([3.0, np.nan, 1.0, np.inf, 4.0, -np.inf, 2.0], np.float32)
VALID = np.isfinite(FITNESS)


def below_median(population, fitness, state, params):
    """A user-written evosax shaping function (evosax minimizes): 1 for members at or below the median.

    Not NaN-aware: with a NaN in ``fitness`` the median is NaN and every weight 0, so it only gives the
    right weights when it sees the valid members alone."""
    return (fitness <= jnp.median(fitness)).astype(jnp.float32)


def test_evosax_centered_ranks_ignore_invalid_members_eager_and_jitted():
    # Over the four valid members 3, 1, 4, 2 the centered ranks are 1/6, -1/2, 1/2, -1/6. evosax itself would
    # rank the three invalid members last and divide by N - 1 = 6 (weights -1/2 + r/6 for r = 3, 0, 2, 1 ...),
    # shifting every valid member's weight.
    want = np.array([1 / 6, 0, -0.5, 0, 0.5, 0, -1 / 6], np.float32)
    adapted = shaping.evosax_shaping(centered_rank_fitness_shaping_fn)
    eager = np.asarray(adapted(jnp.asarray(FITNESS), jnp.asarray(VALID)))
    jitted = np.asarray(jax.jit(adapted)(jnp.asarray(FITNESS), jnp.asarray(VALID)))
    np.testing.assert_allclose(eager, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(jitted, want, rtol=1e-6, atol=1e-7)
    # What evosax does with the NaN members in: the valid members' weights differ.
    evosax_in_place = -np.asarray(centered_rank_fitness_shaping_fn(
        None, jnp.where(jnp.asarray(VALID), -FITNESS, jnp.nan), None, None))
    assert not np.allclose(evosax_in_place[VALID], want[VALID])
    # Through shape() with the evosax function passed directly: the same weights, invalid members at 0.
    weights, valid = shaping.shape(FITNESS, centered_rank_fitness_shaping_fn)
    np.testing.assert_allclose(np.asarray(weights), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(valid), VALID)


@pytest.mark.parametrize("fn", [standardize_fitness_shaping_fn, below_median], ids=["standardize", "user_fn"])
def test_evosax_shaping_sees_only_the_valid_members(fn):
    f = FITNESS[VALID]  # 3, 1, 4, 2
    if fn is below_median:  # minimized -f: -3, -1, -4, -2, median -2.5: members 3 and 4 get weight -1
        want_valid = np.array([-1.0, 0.0, -1.0, 0.0], np.float32)
    else:  # evosax standardizes -f with ddof 0 and eps 1e-8 inside the square root; negated back
        want_valid = (f - f.mean()) / np.sqrt(f.var() + 1e-8)
    want = np.zeros(FITNESS.shape, np.float32)
    want[VALID] = want_valid
    adapted = shaping.evosax_shaping(fn)
    for run in (adapted, jax.jit(adapted)):  # eager: cut out on the host; jitted: NaN-aware or lax.switch
        got = np.asarray(run(jnp.asarray(FITNESS), jnp.asarray(VALID)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Jitted with a different number of invalid members (the same compiled switch picks another branch).
    two_bad = np.array([3.0, 1.0, np.nan, 4.0, 2.0, np.nan, 5.0], np.float32)
    got = np.asarray(jax.jit(adapted)(jnp.asarray(two_bad), jnp.asarray(np.isfinite(two_bad))))
    np.testing.assert_allclose(got, np.asarray(adapted(jnp.asarray(two_bad), jnp.asarray(np.isfinite(two_bad)))),
                               rtol=1e-5, atol=1e-6)
    assert got[2] == got[5] == 0


def _flat(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


PARAMS = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(4, 3), "b": jnp.full((3,), 0.5)}
VERSIONS = np.array([2, 2, 2, 1, 1, 2, 0], np.int32)
INDICES = np.array([0, 1, 2, 0, 1, 3, 4], np.int32)


@pytest.mark.parametrize("fn", [centered_rank_fitness_shaping_fn, below_median], ids=["centered_ranks", "user_fn"])
def test_update_with_an_evosax_shaping_drops_invalid_members_exactly(fn):
    config = ESConfig(noise=NoiseSpec(seed=4, mode="full", scope=Scope("all")), sigma=0.1, learning_rate=0.3,
                      scale="nes", shaping=fn)
    state = init(config, PARAMS, version=2)
    with_bad, metrics = update(config, state, VERSIONS, INDICES, FITNESS)
    without, _ = update(config, state, VERSIONS[VALID], INDICES[VALID], FITNESS[VALID])
    for a, b in zip(_flat(with_bad.params), _flat(without.params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert int(metrics["n_dropped"]) == 3 and int(metrics["n_valid"]) == 4
    assert not np.allclose(_flat(with_bad.params)[0], np.asarray(PARAMS["b"]))  # it did move
    # The evosax function is applied before the jit: another count of invalid members reuses the program.
    compiled = step._update_jit._cache_size()
    one_bad = FITNESS.copy()
    one_bad[[3, 5]] = [5.0, 0.5]
    update(config, state, VERSIONS, INDICES, one_bad)
    assert step._update_jit._cache_size() == compiled


def test_counter_open_es_tell_drops_invalid_members():
    """tell (jitted, evosax's centered ranks) with NaN/inf members = the esjax update over the valid ones."""
    n, std, lr = 8, 0.2, 0.1
    mean = jnp.linspace(-1.0, 1.0, 5)
    es = CounterOpenES(n, mean, optimizer=optax.sgd(lr), std_schedule=optax.constant_schedule(std), seed=6,
                       lazy_population=True)
    key = jax.random.key(0)
    state = es.init(key, mean, es.default_params)
    members, _ = es.ask(key, state, es.default_params)
    fitness = np.array([0.5, np.nan, -1.0, 2.0, np.inf, 1.5, 0.25, -0.5], np.float32)  # evosax: minimized
    valid = np.isfinite(fitness)
    new_state, metrics = es.tell(key, members, jnp.asarray(fitness), state, es.default_params)
    assert int(metrics["n_valid"]) == 6
    # By hand: centered ranks of the six valid members (maximizing -f), NES scale over n = 6, one SGD step.
    w = np.zeros(n)
    from scipy.stats import rankdata  # imported here: collection stays cheap

    w[valid] = (rankdata(-fitness[valid]) - 1) / 5 - 0.5
    spec = NoiseSpec(seed=6, mode="full", scope=Scope("all"))
    eps = np.stack([np.asarray(pair_noise(spec, "", (5,), 0, i // 2)) * (1 if i % 2 == 0 else -1) for i in range(n)])
    grad = (w[:, None] * eps).sum(0) / (6 * std)
    np.testing.assert_allclose(np.asarray(new_state.mean), np.asarray(mean) + lr * grad, rtol=1e-5, atol=1e-6)


def test_direction_is_explicit_on_both_faces():
    """esjax.es maximizes by default and minimizes with ESConfig(maximize=False); CounterOpenES minimizes by default
    (as evosax) and maximizes with maximize=True. Each face, given the negated fitness in the other direction, takes
    the same step bit for bit; metrics and the best so far keep the caller's sign."""
    config = ESConfig(noise=NoiseSpec(seed=3, mode="full", scope=Scope("all")), sigma=0.1, learning_rate=0.1)
    params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)}
    fitness = np.array([0.5, -1.0, 2.0, 1.5], np.float32)
    versions, indices = np.zeros(4, np.int32), np.arange(4, dtype=np.int32)
    up, _ = update(config, init(config, params), versions, indices, fitness)
    minimizing = dataclasses.replace(config, maximize=False)
    down, metrics = update(minimizing, init(minimizing, params), versions, indices, -fitness)
    assert np.asarray(up.params["w"]).tobytes() == np.asarray(down.params["w"]).tobytes()
    assert float(metrics["fitness_max"]) == 1.0 and float(metrics["fitness_min"]) == -2.0  # as given
    with pytest.raises(TypeError, match="maximize"):
        ESConfig(maximize="yes")

    mean = jnp.linspace(-1.0, 1.0, 5)
    kw = dict(optimizer=optax.sgd(0.1), std_schedule=optax.constant_schedule(0.2), seed=6)
    losses, gains = CounterOpenES(4, mean, **kw), CounterOpenES(4, mean, maximize=True, **kw)
    key, params = jax.random.key(0), losses.default_params
    population, _ = losses.ask(key, losses.init(key, mean, params), params)
    lost, m_lost = losses.tell(key, population, jnp.asarray(fitness), losses.init(key, mean, params), params)
    gained, m_gained = gains.tell(key, population, jnp.asarray(-fitness), gains.init(key, mean, params), params)
    assert np.asarray(lost.mean).tobytes() == np.asarray(gained.mean).tobytes()
    assert float(m_lost["best_fitness"]) == -1.0 and float(m_gained["best_fitness"]) == 1.0
    np.testing.assert_array_equal(m_lost["best_solution"], m_gained["best_solution"])
    assert float(gains.init(key, mean, params).best_fitness) == -np.inf


@pytest.mark.parametrize("seed", [2**32, 2**32 + 7, -1, 2**63])
def test_seeds_outside_32_bits_are_refused(seed):
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        NoiseSpec(seed=seed)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        CounterOpenES(4, jnp.zeros(3), seed=seed)


def test_seed_range_ends_and_types():
    top, zero = NoiseSpec(seed=2**32 - 1, mode="full"), NoiseSpec(seed=0, mode="full")
    # Both ends of the range are accepted and draw different noise (2**32 - 1 used to be the alias of -1).
    draw = lambda spec: np.asarray(pair_noise(spec, "w", (4,), 0, 0))
    assert not np.array_equal(draw(top), draw(zero))
    assert NoiseSpec(seed=np.uint32(7)).seed == 7
    for bad in (1.5, "3", True):
        with pytest.raises(TypeError, match="integer"):
            NoiseSpec(seed=bad)


def test_functional_update_refuses_members_ahead_of_the_state():
    config = ESConfig(noise=NoiseSpec(seed=1, mode="full", scope=Scope("all")), sigma=0.1, learning_rate=0.1)
    state = init(config, PARAMS, version=1)
    fitness = np.arange(4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"version 2 is ahead of the state \(version 1\)"):
        update(config, state, np.array([1, 1, 2, 0], np.int32), np.arange(4, dtype=np.int32), fitness)
    with pytest.raises(ValueError, match=">= 0"):
        update(config, state, np.array([1, -1, 0, 0], np.int32), np.arange(4, dtype=np.int32), fitness)
    with pytest.raises(ValueError, match=">= 0"):
        update(config, state, np.ones(4, np.int32), np.array([0, 1, -2, 3], np.int32), fitness)
    # The same refusal and message as the object API; members at or behind the state are fine.
    with pytest.raises(ValueError, match="ahead of the state"):
        ES(config).update(state, versions=np.array([1, 1, 2, 0]), indices=np.arange(4), fitness=fitness)
    new, _ = update(config, state, np.array([1, 1, 0, 0], np.int32), np.arange(4, dtype=np.int32), fitness)
    assert int(new.version) == 2


def test_init_reports_the_scope_and_warns_when_the_default_scope_freezes_vectors():
    """The issue-35 example: ``{"w", "b"}`` under the default scope leaves ``b`` at 0 forever; ES.init says
    so (once, naming ``b`` and the fix) and lists the perturbed and frozen leaves; an explicit scope is silent."""
    import warnings

    from esjax.es import perturbed_leaves

    params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2), "step": jnp.zeros((), jnp.int32)}
    es = ES(ESConfig(sigma=0.1, learning_rate=0.1))
    with pytest.warns(UserWarning, match=r"stay at their initial values: b\. .*Scope\('all'\)") as caught:
        es.init(params)
    assert len(caught) == 1 and caught[0].filename == __file__
    assert (es.perturbed, es.frozen) == (["w"], ["b", "step"])
    with pytest.warns(UserWarning, match="b"):
        init(ESConfig(noise=NoiseSpec(seed=3)), params)  # the functional init too
    assert perturbed_leaves(params, NoiseSpec(scope=Scope("all"))) == (["b", "w"], ["step"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for scope in (Scope("matrices"), Scope("all"), Scope("matrices", include=("w",))):
            ES(ESConfig(noise=NoiseSpec(scope=scope))).init(params)
        ES(ESConfig()).init({"w": jnp.zeros((3, 2))})  # nothing frozen


def _readme_library_blocks() -> list[str]:
    section = (Path(__file__).resolve().parents[2] / "README.md").read_text().split("## Using esjax as a library", 1)[1]
    section = section.split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]


def test_readme_library_example_runs_and_keeps_up_with_evosax_open_es(capsys):
    """README's ask/tell example, run as written: an MLP fits sin(x) (stated quality), and evosax's Open_ES with the
    same population, σ and Adam step on the same problem ends in the same range."""
    from evosax.algorithms import Open_ES
    from jax.flatten_util import ravel_pytree

    first, second = _readme_library_blocks()[:2]
    scope: dict = {}
    exec(compile(first, "README.md (library example)", "exec"), scope)
    mse, params, state = scope["mse"], scope["params"], scope["state"]
    before, after = float(mse(params)), float(mse(state.params))
    assert capsys.readouterr().out.strip() == f"MSE {before:.3f} -> {after:.4f} after 300 generations"
    assert before > 1.0 and after < 0.01  # the quality README states (MSE 1.117 -> 0.0034)

    flat, unravel = ravel_pytree(params)
    evo = Open_ES(64, flat, optimizer=optax.adam(0.03), std_schedule=optax.constant_schedule(0.05))
    losses = jax.vmap(lambda f: mse(unravel(f)))

    @jax.jit
    def generation(evo_state, key):
        k_ask, k_tell = jax.random.split(key)
        population, evo_state = evo.ask(k_ask, evo_state, evo.default_params)
        evo_state, _ = evo.tell(k_tell, population, losses(population), evo_state, evo.default_params)  # minimizes
        return evo_state, None

    key = jax.random.key(0)
    evo_state, _ = jax.lax.scan(generation, evo.init(key, flat, evo.default_params), jax.random.split(key, 300))
    evo_after = float(mse(unravel(evo.get_mean(evo_state))))
    assert evo_after < 0.01 and after <= 2 * evo_after + 0.002, (after, evo_after)

    exec(compile(second, "README.md (update on explicit cohorts)", "exec"), scope)  # the second block runs too
    assert int(scope["state"].version) == 1 and int(scope["metrics"]["n_dropped"]) == 1


def test_ask_gives_antithetic_members_and_their_parameters():
    es = ES(ESConfig(noise=NoiseSpec(seed=3, mode="full", scope=Scope("all")), sigma=0.1, learning_rate=0.1,
                     scale="nes"))
    state = es.init({"w": jnp.ones((2, 3)), "b": jnp.zeros(3)})
    (versions, indices), population = es.ask(state, 6, params=True)
    assert versions.tolist() == [0] * 6 and indices.tolist() == list(range(6))
    np.testing.assert_allclose(population["w"][0] + population["w"][1], 2 * jnp.ones((2, 3)), atol=1e-6)
    expected = perturbed_params(es.config.noise, state.params, 0, 4, 0.1)
    np.testing.assert_array_equal(population["b"][4], expected["b"])
    assert es.ask(state, 6)[1] is None
    with pytest.raises(ValueError, match="even"):
        es.ask(state, 5)
    told, _ = es.tell(state, (versions, indices), jnp.arange(6.0))
    direct, _ = es.update(state, versions=versions, indices=indices, fitness=jnp.arange(6.0))
    np.testing.assert_array_equal(told.params["w"], direct.params["w"])


def test_library_face_is_short_and_documented():
    import esjax.es as library

    assert len(library.__all__) <= 16
    exported = {name for name, value in vars(library).items()
                if not name.startswith("_") and not inspect.ismodule(value)}
    assert exported == set(library.__all__), exported ^ set(library.__all__)  # nothing beside the documented face
    undocumented = [name for name in library.__all__ if not (getattr(library, name).__doc__ or "").strip()]
    assert not undocumented, undocumented
