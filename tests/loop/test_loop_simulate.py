"""Latency simulator: the barrier's cost shows up as idle slots; async keeps slots busy."""

from __future__ import annotations

import numpy as np
import pytest

from esjax.loop.coordinator import Coordinator, CoordinatorConfig
from esjax.loop.simulate import ConstantDuration, Empirical, LogNormal, Pareto, RewardTable, simulate
from esjax.loop.staleness import Async, Controlled, Sync

_LOGNORMAL = LogNormal(1.0)


def _sim(schedule, k, workers=32, n=32, durations=_LOGNORMAL, updates=150, **kw):
    coord = Coordinator(CoordinatorConfig(n, k), schedule)
    return simulate(coord, workers=workers, durations=durations, updates=updates, keep_records=False, **kw)


def test_lognormal_g_eq_n_32_async_keeps_slots_busy_sync_does_not():
    sync = _sim(Sync(), 0)
    async_ = _sim(Async(), 1)
    print(f"\nlognormal(1), G=N=32: utilization sync {sync.utilization:.3f}, async {async_.utilization:.3f}; "
          f"wall-clock for 150 updates sync {sync.wall_clock:.0f}, async {async_.wall_clock:.0f} "
          f"(speedup {sync.wall_clock / async_.wall_clock:.2f}x)")
    assert async_.utilization >= 0.9
    assert sync.utilization < 0.5 < async_.utilization
    assert async_.wall_clock < sync.wall_clock
    assert sync.idle_time == pytest.approx(sync.slot_time - sync.busy_time)
    assert sync.idle_time > async_.idle_time


def test_constant_durations_have_no_barrier_cost():
    report = _sim(Sync(), 0, workers=8, n=8, durations=ConstantDuration(2.0), updates=10, update_time=0.5)
    assert report.wall_clock == pytest.approx(10 * 2.5)
    assert report.utilization == pytest.approx(2.0 / 2.5)
    assert report.time_to(4) == pytest.approx(4 * 2.5)
    assert np.all(np.diff(report.update_times) > 0)


@pytest.mark.parametrize("durations", [Pareto(1.5), Empirical((0.2, 1.0, 5.0, 30.0))], ids=["pareto", "empirical"])
def test_other_distributions_and_controlled(durations):
    sync = _sim(Sync(), 0, workers=16, n=16, durations=durations, updates=40)
    controlled = _sim(Controlled(2, 0.25), 2, workers=16, n=16, durations=durations, updates=40)
    assert controlled.utilization > sync.utilization
    lags = controlled.totals["lag_hist"]  # includes the open cohort
    assert lags[1] == 0 and 4 * 38 <= lags[2] <= 4 * 39


def test_reward_table_surrogate_uses_each_versions_task_batch():
    rewards = np.random.default_rng(0).uniform(size=(10, 50))
    coord = Coordinator(CoordinatorConfig(4, 1, train_size=50, tasks_per_member=5), Async())
    report = simulate(coord, workers=4, durations=LogNormal(1.0), updates=5, fitness=RewardTable(rewards))
    assert all(0.0 <= f <= 1.0 for r in report.records for f in r.cohort.fitness)
    assert len({f for r in report.records for f in r.cohort.fitness}) > 1
    # A table whose reward is the goal's number: each member's fitness is the mean over its own job's goals, the
    # same for every member of a version (one task batch per version) and different between versions.
    by_goal = np.tile(np.arange(50.0), (10, 1))
    goals = {}

    def table(jobs):
        goals.update({(j.member.version, j.member.index): np.asarray(j.tasks.goals) % 50 for j in jobs})
        return RewardTable(by_goal)(jobs)

    coord = Coordinator(CoordinatorConfig(4, 1, train_size=50, tasks_per_member=5), Async())
    report = simulate(coord, workers=4, durations=LogNormal(1.0), updates=5, fitness=table)
    per_version = {}
    for r in report.records:
        for v, i, f in zip(r.cohort.versions, r.cohort.indices, r.cohort.fitness):
            assert f == pytest.approx(np.mean(goals[int(v), int(i)]))
            per_version.setdefault(int(v), set()).add(float(f))
    assert all(len(fs) == 1 for fs in per_version.values()) and len(per_version) > 1
    assert len({fs.pop() for fs in per_version.values()}) > 1
    # a table whose reward is the row's number: members of one version differ through their rows
    by_row = np.tile(np.arange(10.0)[:, None], (1, 50))
    coord = Coordinator(CoordinatorConfig(4, 1, train_size=50, tasks_per_member=5), Async())
    report = simulate(coord, workers=4, durations=LogNormal(1.0), updates=5, fitness=RewardTable(by_row))
    assert len(set(report.records[0].cohort.fitness.tolist())) > 1


def test_a_stalling_schedule_is_reported():
    class Never(Sync):
        def dispatch_versions(self, coord, free_slots):
            return []

    with pytest.raises(RuntimeError, match="stalled"):
        _sim(Never(), 0, updates=1)
