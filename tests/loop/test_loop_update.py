"""The update the coordinator applies to θ_t with stale members equals the ES update computed by hand from
the accepted (version, index, fitness) triples: each member's own regenerated noise, no correction."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from esjax.es import noise as es_noise
from esjax.es import step as es_step
from esjax.loop.coordinator import Coordinator, CoordinatorConfig
from esjax.loop.es_update import ESUpdate, QuadraticFitness
from esjax.loop.simulate import HashFitness, LogNormal, simulate
from esjax.loop.staleness import Async, Controlled


def _params():
    # One matrix (low-rank noise) and one vector (dense fallback): few leaves keep the compile short.
    return {"dense": {"kernel": jax.random.normal(jax.random.key(0), (5, 3)), "bias": jnp.zeros((3,))}}


class _Recorder:
    """Wraps ESUpdate to remember θ_t right before each update."""

    def __init__(self, inner: ESUpdate) -> None:
        self.inner = inner
        self.before: dict[int, object] = {}

    def __call__(self, cohort):
        self.before[cohort.version] = self.inner.state.params
        return self.inner(cohort)


_member_noise = jax.jit(es_noise.member_noise, static_argnums=(0, 1, 2))  # the reference noise, compiled once


def _hand_update(spec, params, cohort, sigma, lr, scale, shaping):
    f = np.asarray(cohort.fitness, np.float64)
    n = len(f)
    if shaping == "z_score":
        w = (f - f.mean()) / (f.std() + 1e-8)
    else:
        w = f
    c = 1.0 / n if scale == "llm" else 1.0 / (n * sigma)

    def leaf(path, value):
        if not spec.scope.contains(path, value):
            return np.asarray(value)
        g = sum(wi * np.asarray(_member_noise(spec, path, value.shape, int(v), int(i)))
                for wi, v, i in zip(w, cohort.versions, cohort.indices))
        return np.asarray(value) + lr * c * g

    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    return jax.tree_util.tree_unflatten(treedef, [leaf(es_noise.path_str(kp), x) for kp, x in flat])


def test_stale_cohorts_apply_each_members_own_noise_to_current_theta():
    """The published convention (z-scores, c = 1/N, SGD) with low-rank noise; half of each cohort 2 updates old."""
    mode, scale, shaping = "lowrank", "llm", "z_score"
    spec = es_noise.NoiseSpec(seed=3, mode=mode, rank=2, antithetic=True, scope=es_noise.Scope("all"))
    sigma, lr = 0.1, 0.05
    config = es_step.ESConfig(noise=spec, sigma=sigma, scale=scale, shaping=shaping, learning_rate=lr)
    engine = _Recorder(ESUpdate(config, _params(), keep=3))
    coord = Coordinator(CoordinatorConfig(4, 2, seed=1), Controlled(2, 0.5))
    report = simulate(coord, workers=3, durations=LogNormal(1.0), updates=5, fitness=HashFitness(7), update=engine)
    assert any(record.cohort.lags.max() == 2 for record in report.records)  # stale members were applied
    after = engine.inner.state.params
    for record in report.records:
        t = record.version
        expected = _hand_update(spec, engine.before[t], record.cohort, sigma, lr, scale, shaping)
        got = engine.before.get(t + 1, after)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), got, expected)


def test_async_es_descends_a_noisy_quadratic():
    """Smoke test of the whole stack (full noise, NES scale, centered ranks): natural async ES with K = 2 on
    the simulator improves the noisy-quadratic surrogate."""
    spec = es_noise.NoiseSpec(seed=0, mode="full", antithetic=True, scope=es_noise.Scope("all"))
    params = {"w": jnp.zeros((4, 4))}
    target = {"w": jnp.ones((4, 4))}
    config = es_step.ESConfig(noise=spec, sigma=0.1, scale="nes", shaping="centered_ranks", learning_rate=0.05)
    engine = ESUpdate(config, params, keep=3)
    fitness = QuadraticFitness(spec, 0.1, target, engine.params_at, shared_noise=0.1, member_noise=0.001)
    coord = Coordinator(CoordinatorConfig(8, 2), Async())
    simulate(coord, workers=8, durations=LogNormal(1.0), updates=40, fitness=fitness, keep_records=False,
             update=engine)
    loss = float(jnp.mean((engine.state.params["w"] - 1.0) ** 2))
    assert engine.version == 40 and loss < 0.5
