"""Fitness shaping (z-score, centered ranks, raw, evosax adapter) with validity masks, and σ schedules."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from evosax.core.fitness_shaping import centered_rank_fitness_shaping_fn, standardize_fitness_shaping_fn

from esjax.es import shaping, sigma_schedules

COHORT = np.array([0.3, np.nan, -1.0, 2.5, 0.3, np.inf, 7.0, -np.inf, 0.3, 1.0], np.float32)
VALID = np.isfinite(COHORT)


def test_z_score_over_valid_members_ddof0():
    w, valid = shaping.shape(COHORT, "z_score")
    f = COHORT[VALID].astype(np.float64)
    want = (f - f.mean()) / (f.std(ddof=0) + 1e-8)
    np.testing.assert_array_equal(np.asarray(valid), VALID)
    np.testing.assert_allclose(np.asarray(w)[VALID], want, rtol=1e-5)
    assert np.all(np.asarray(w)[~VALID] == 0)
    # A constant cohort gives zeros, not NaN.
    assert np.all(np.asarray(shaping.shape(np.ones(4), "z_score")[0]) == 0)


def test_centered_ranks_openai_es_with_ties_and_invalid_members():
    w, _ = shaping.shape(COHORT, "centered_ranks")
    f = COHORT[VALID]
    from scipy.stats import rankdata  # imported here: collection stays cheap

    want = (rankdata(f, method="average") - 1) / (f.size - 1) - 0.5
    np.testing.assert_allclose(np.asarray(w)[VALID], want, rtol=1e-6)
    assert np.all(np.asarray(w)[~VALID] == 0)
    assert np.asarray(w)[6] == 0.5 and np.asarray(w)[2] == -0.5  # best / worst valid member
    # Ties get one weight, whatever the member order; order-independent overall.
    tied = np.asarray(w)[[0, 4, 8]]
    assert np.all(tied == tied[0])
    perm = np.random.default_rng(0).permutation(COHORT.size)
    np.testing.assert_array_equal(np.asarray(shaping.shape(COHORT[perm])[0]), np.asarray(w)[perm])
    # Degenerate cohorts.
    assert np.all(np.asarray(shaping.shape(np.full(5, 2.0))[0]) == 0)
    assert np.all(np.asarray(shaping.shape(np.array([np.nan, 1.0, np.nan]))[0]) == 0)


def test_raw_and_caller_mask():
    w, valid = shaping.shape(COHORT, "raw", mask=np.arange(COHORT.size) != 0)
    assert not bool(valid[0]) and float(w[0]) == 0
    np.testing.assert_array_equal(np.asarray(w)[1:][VALID[1:]], COHORT[1:][VALID[1:]])


def test_evosax_adapter_negates_minimization():
    fitness = np.array([3.0, -1.0, 3.0, 0.5, 10.0, 2.0], np.float32)
    ours = shaping.shape(fitness, "centered_ranks")[0]
    # Passing the evosax function directly is detected by its parameter names and negated.
    adapted = shaping.shape(fitness, centered_rank_fitness_shaping_fn)[0]
    np.testing.assert_allclose(np.asarray(adapted), np.asarray(ours), rtol=1e-6)
    # Identity check of the sign convention: evosax would give the best (highest) member the lowest weight.
    evosax_weights = centered_rank_fitness_shaping_fn(None, jnp.asarray(-fitness), None, None)
    np.testing.assert_allclose(np.asarray(adapted), -np.asarray(evosax_weights), rtol=1e-6)
    # Invalid members get 0 and are excluded from evosax's standardization statistics too.
    w, _ = shaping.shape(COHORT, standardize_fitness_shaping_fn)
    np.testing.assert_allclose(np.asarray(w)[VALID], np.asarray(shaping.shape(COHORT, "z_score")[0])[VALID],
                               rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(w)[~VALID] == 0)
    with pytest.raises(ValueError, match="unknown fitness shaping"):
        shaping.get_shaping("ranks")


def test_sigma_schedules_values_and_jit():
    cos = sigma_schedules.cosine(0.1, 0.01, 100)
    lin = sigma_schedules.linear(0.1, 0.01, 100)
    const = sigma_schedules.constant(0.05)
    assert math.isclose(float(cos(0)), 0.1, rel_tol=1e-6)
    assert math.isclose(float(cos(50)), 0.055, rel_tol=1e-5)
    assert math.isclose(float(cos(100)), 0.01, rel_tol=1e-5) and math.isclose(float(cos(500)), 0.01, rel_tol=1e-5)
    t = 30
    want = 0.01 + (0.1 - 0.01) * (1 + math.cos(math.pi * t / 100)) / 2
    assert math.isclose(float(cos(t)), want, rel_tol=1e-5)
    assert math.isclose(float(lin(25)), 0.0775, rel_tol=1e-5) and math.isclose(float(lin(1000)), 0.01, rel_tol=1e-5)
    ts = jnp.arange(0, 120, 7)
    for sched in (cos, lin, const):
        np.testing.assert_allclose(jax.jit(sched)(ts), [float(sched(int(x))) for x in ts], rtol=1e-6)
    assert hash(cos) == hash(sigma_schedules.cosine(0.1, 0.01, 100))  # usable inside a static jit config
    with pytest.raises(ValueError, match="sigma must be > 0"):
        sigma_schedules.as_schedule(0.0)
