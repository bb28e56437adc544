"""Schedule invariants under arbitrary completion orders: lag ≤ K, cohorts of exactly N, exact controlled
staleness, and every discarded result counted. Hypothesis drives durations (hence completion order,
including ties), slots, N, K and non-finite fitness."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esjax.loop.coordinator import Coordinator, CoordinatorConfig
from esjax.loop.simulate import HashFitness, LogNormal, Scripted, SimReport, simulate
from esjax.loop.staleness import AllStale, Async, Controlled, ExtremeLag, Sync, make_schedule, stale_count
from esjax.loop.tasks import hash_uniform
from esjax.loop.types import Job


class _Fitness:
    """HashFitness with a share ``nan_rate`` of NaN / inf members, tracking every value handed out."""

    def __init__(self, seed: int, nan_rate: float) -> None:
        self.base = HashFitness(seed)
        self.seed = seed
        self.nan_rate = nan_rate

    def __call__(self, jobs: Sequence[Job]) -> np.ndarray:
        values = self.base(jobs)
        for n, job in enumerate(jobs):
            u = hash_uniform(self.seed, 99, job.job_id)
            if u < self.nan_rate:
                values[n] = math.nan if u < self.nan_rate / 2 else math.inf
        return values


def check_common(report: SimReport, coord: Coordinator) -> None:
    """Invariants every schedule keeps."""
    n, k_max = coord.population, coord.max_lag
    seen: set[tuple[int, int]] = set()
    lag_hist = np.zeros(k_max + 1, np.int64)
    for t, record in enumerate(report.records):
        cohort = record.cohort
        assert cohort.version == t
        assert len(cohort.versions) == len(cohort.indices) == len(cohort.fitness) == n
        lags = cohort.lags
        assert lags.min() >= 0 and lags.max() <= k_max
        assert np.all(np.isfinite(cohort.fitness))
        members = set(zip(cohort.versions.tolist(), cohort.indices.tolist()))
        assert len(members) == n and not (members & seen)  # no member accepted twice
        seen |= members
        lag_hist += np.bincount(lags, minlength=k_max + 1)
    totals = coord.totals()
    for r in coord.state.cohort:  # accepted, not yet applied
        lag_hist[coord.version - r.version] += 1
    assert totals["lag_hist"] == lag_hist.tolist()
    assert totals["accepted"] == n * report.updates + coord.cohort_size()
    # Every dispatched job is in flight, held, in the open cohort, applied, or discarded (and counted).
    assert totals["dispatched"] == totals["completed"] + totals["in_flight"]
    assert totals["completed"] == totals["accepted"] + totals["discarded"] + totals["held"]
    assert totals["discarded"] == sum(totals["discarded_by"].values())
    assert report.utilization <= 1.0 + 1e-9


def check_wasted_time(report: SimReport, coord: Coordinator) -> None:
    """Wasted time = total finished rollout time − accepted − held."""
    held = sum(r.duration for r in coord.state.held)
    open_cohort = sum(r.duration for r in coord.state.cohort)
    applied = sum(float(r.cohort.durations.sum()) for r in report.records)
    assert coord.state.accepted_time == pytest.approx(applied + open_cohort)
    running = sum(1 for _ in coord.state.in_flight)
    assert running == coord.totals()["in_flight"]
    assert coord.state.wasted_time >= 0
    assert report.busy_time + 1e-6 >= coord.state.wasted_time + coord.state.accepted_time + held - 1e-6


def _run(schedule, n, k, workers, durations, nan_rate=0.0, updates=10, seed=0):
    coord = Coordinator(CoordinatorConfig(n, k, seed=seed), schedule)
    report = simulate(coord, workers=workers, durations=durations, updates=updates,
                      fitness=_Fitness(seed, nan_rate), seed=seed)
    check_common(report, coord)
    check_wasted_time(report, coord)
    return report, coord


# ---------------------------------------------------------------------------------------------------------
# Hypothesis: completion orders and durations
# ---------------------------------------------------------------------------------------------------------

_durations = st.lists(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0, 7.0, 20.0]), min_size=1, max_size=24)
_EXAMPLES = int(os.environ.get("ESJAX_FUZZ_EXAMPLES", "40"))  # raise for a long local fuzz
_fuzz = settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_fuzz
@given(n=st.integers(1, 6), workers=st.integers(1, 12), durs=_durations, nan=st.sampled_from([0.0, 0.2]))
def test_sync_is_a_barrier(n, workers, durs, nan):
    report, coord = _run(Sync(), n, 0, workers, Scripted(tuple(durs)), nan)
    assert all(np.all(r.cohort.lags == 0) for r in report.records)
    assert coord.totals()["discarded_by"]["too_stale"] == coord.totals()["discarded_by"]["schedule"] == 0
    # exactly N finite results per update: nothing dispatched beyond what the cohort needs
    assert coord.totals()["dispatched"] - coord.totals()["discarded_by"]["nonfinite"] <= n * (report.updates + 1)


@_fuzz
@given(n=st.integers(1, 6), k=st.integers(0, 3), workers=st.integers(1, 12), durs=_durations,
       nan=st.sampled_from([0.0, 0.2]))
def test_async_never_accepts_beyond_k(n, k, workers, durs, nan):
    report, coord = _run(Async(), n, k, workers, Scripted(tuple(durs)), nan)
    assert report.utilization > 0.0
    # busy slots: async dispatches into every free slot
    assert coord.totals()["in_flight"] == workers


@_fuzz
@given(n=st.integers(1, 8), k_max=st.integers(0, 4), data=st.data(), workers=st.integers(1, 12), durs=_durations,
       p=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]), keep_busy=st.booleans(), nan=st.sampled_from([0.0, 0.2]))
def test_controlled_cohorts_are_exact(n, k_max, data, workers, durs, p, keep_busy, nan):
    k = data.draw(st.integers(0, k_max), label="k")
    schedule = Controlled(k, p, keep_busy=keep_busy)
    report, _ = _run(schedule, n, k_max, workers, Scripted(tuple(durs)), nan, updates=k + 6)
    m = stale_count(p, n) if k > 0 else 0
    for record in report.records:
        lags = record.cohort.lags
        if record.version < k or k == 0:  # warm-up (or k = 0): all fresh
            assert np.all(lags == 0)
        else:
            assert int(np.sum(lags == k)) == m
            assert int(np.sum(lags == 0)) == n - m


@_fuzz
@given(n=st.integers(1, 6), k=st.integers(1, 3), workers=st.integers(1, 10), durs=_durations)
def test_all_stale_every_lag_is_k(n, k, workers, durs):
    report, _ = _run(AllStale(k), n, k, workers, Scripted(tuple(durs)), updates=k + 5)
    for record in report.records[k:]:
        assert np.all(record.cohort.lags == k)


@_fuzz
@given(n=st.integers(1, 6), max_lag=st.integers(1, 8), fraction=st.sampled_from([0.1, 0.5, 0.8]),
       workers=st.integers(1, 10), durs=_durations)
def test_extreme_lag_holds_members_at_least_their_draw(n, max_lag, fraction, workers, durs):
    schedule = ExtremeLag(fraction, max_lag)
    report, coord = _run(schedule, n, max_lag, workers, Scripted(tuple(durs)), updates=12)
    for record in report.records:
        c = record.cohort
        for v, i, lag in zip(c.versions, c.indices, c.lags):
            assert schedule.target_lag(coord.config.seed, int(v), int(i)) <= lag <= max_lag


# ---------------------------------------------------------------------------------------------------------
# Plain cases
# ---------------------------------------------------------------------------------------------------------


def test_published_delay_3_of_30_by_4():
    """The study's stress test: every cohort after warm-up = 27 fresh + 3 measured exactly 4 updates earlier."""
    report, _ = _run(Controlled(4, 0.1), 30, 4, 4, LogNormal(1.0), updates=40)
    for record in report.records[4:]:
        assert sorted(record.cohort.lags.tolist()) == [0] * 27 + [4] * 3


def test_controlled_with_few_slots_dispatches_at_older_versions():
    """One slot: t moves on before a version got its stale members, so they are dispatched at that version,
    which the coordinator lists as live (the rollout driver still holds its θ)."""
    coord = Coordinator(CoordinatorConfig(4, 2), Controlled(2, 0.5, keep_busy=False))
    dispatched, plain = [], coord.dispatch

    def checked(version):
        assert version in coord.live_versions()
        dispatched.append((coord.version, version))
        return plain(version)

    coord.dispatch = checked
    report = simulate(coord, workers=1, durations=LogNormal(0.5), updates=12, fitness=_Fitness(0, 0.0))
    check_common(report, coord)
    assert any(v < t for t, v in dispatched)  # some members were dispatched at an older version
    assert coord.totals()["discarded"] == 0  # quota-only dispatch wastes nothing
    assert coord.live_versions() == [coord.version - 2, coord.version - 1, coord.version]


def test_async_discards_are_counted_with_their_time():
    """K = 0 with many slots: late results are discarded and their rollout time is wasted time."""
    report, coord = _run(Async(), 4, 0, 16, LogNormal(1.0), updates=20)
    totals = coord.totals()
    assert totals["discarded_by"]["too_stale"] > 0 and totals["wasted_time"] > 0
    assert all(np.all(r.cohort.lags == 0) for r in report.records)


def test_nonfinite_fitness_never_reaches_a_cohort():
    report, coord = _run(Async(), 6, 1, 6, LogNormal(1.0), nan_rate=0.3, updates=10)
    assert coord.totals()["discarded_by"]["nonfinite"] > 0


def test_schedules_reject_lags_beyond_k():
    with pytest.raises(ValueError, match="exceeds max_lag"):
        Coordinator(CoordinatorConfig(4, 1), Controlled(2, 0.5))
    with pytest.raises(ValueError, match="exceeds the coordinator"):
        Coordinator(CoordinatorConfig(4, 8), ExtremeLag(0.2, 32))
    with pytest.raises(ValueError, match="fraction"):
        ExtremeLag(1.0, 4)
    with pytest.raises(ValueError, match="fraction is 1"):
        AllStale(2, 0.5)
    with pytest.raises(ValueError, match="unknown schedule"):
        make_schedule("barrier")
    assert make_schedule("controlled", lag=4, fraction=0.1) == Controlled(4, 0.1)
    assert make_schedule("all_stale", lag=3).name == "all_stale"


def test_stale_count_rounds_half_up():
    assert stale_count(0.1, 30) == 3 and stale_count(0.5, 5) == 3 and stale_count(0.0, 8) == 0
    assert stale_count(1.0, 7) == 7
