"""Coordinator mechanics: task batches (common random numbers), indices, input errors, failed updates,
and a JSON state round trip that resumes to exactly the same decisions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from esjax.loop.coordinator import Coordinator, CoordinatorConfig
from esjax.loop.schedules import Async, Controlled, ExtremeLag, Sync
from esjax.loop.simulate import LogNormal, simulate
from esjax.loop.tasks import TaskSampler
from esjax.loop.types import Member, Result


def test_task_batches_are_a_function_of_seed_and_version():
    sampler = TaskSampler(seed=3, train_size=50, batch_size=8)
    a, b = sampler(7), TaskSampler(seed=3, train_size=50, batch_size=8)(7)
    assert a == b
    assert len(set(a.goals)) == 8 and all(0 <= g < 50 for g in a.goals)
    assert sampler(8).goals != a.goals or sampler(8).sampling_seed != a.sampling_seed
    assert TaskSampler(seed=4, train_size=50, batch_size=8)(7) != a
    assert len(TaskSampler(0, train_size=3, batch_size=5)(0).goals) == 5  # with replacement when needed


def test_members_of_one_version_share_tasks_and_count_indices():
    coord = Coordinator(CoordinatorConfig(4, 1, seed=5, train_size=20, tasks_per_member=3), Async())
    jobs = coord.next_jobs(6)
    assert [j.member for j in jobs] == [Member(0, i) for i in range(6)]
    assert len({j.tasks for j in jobs}) == 1 and jobs[0].tasks == TaskSampler(5, 20, 3)(0)
    assert [j.job_id for j in jobs] == list(range(6))
    for job in jobs[:4]:
        coord.report(job.result(1.0, 1.0))
    assert coord.version == 1
    new = coord.next_jobs(2)
    assert [j.member for j in new] == [Member(1, 0), Member(1, 1)]
    assert new[0].tasks == TaskSampler(5, 20, 3)(1)
    assert coord.live_versions() == [0, 1]  # jobs 4, 5 still run at version 0
    records = [r for job, f in [(jobs[4], 2.0), (jobs[5], 0.0), (new[0], 1.0), (new[1], 1.0)]
               for r in coord.report(job.result(f, 1.0))]
    (summary,) = [r.summary() for r in records]
    assert summary["version"] == 1 and summary["cohort_lag_hist"] == [2, 2] and summary["fitness_max"] == 2.0
    assert summary["accepted"] == 8 and summary["stale_fraction"] == 0.25
    assert coord.live_versions() == [2]


def test_bad_reports_and_dispatches_are_clear_errors():
    coord = Coordinator(CoordinatorConfig(2, 1), Async())
    job = coord.next_jobs(1)[0]
    with pytest.raises(ValueError, match="names member"):
        coord.report(Result(job.job_id, Member(0, 5), 1.0))
    coord.report(job.result(0.5))
    with pytest.raises(ValueError, match="not in flight"):
        coord.report(job.result(0.5))
    with pytest.raises(ValueError, match="cannot dispatch at version 1"):
        coord.dispatch(1)
    with pytest.raises(ValueError, match="population"):
        CoordinatorConfig(0)


def test_a_failed_update_keeps_its_cohort():
    calls = []

    def flaky(cohort):
        calls.append(cohort.version)
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return {"ok": 1.0}

    coord = Coordinator(CoordinatorConfig(2, 0), Sync(), flaky)
    jobs = coord.next_jobs(2)
    coord.report(jobs[0].result(1.0))
    with pytest.raises(RuntimeError, match="device lost"):
        coord.report(jobs[1].result(2.0))
    assert coord.version == 0 and coord.cohort_size() == 2
    with pytest.raises(RuntimeError, match="retry_update"):
        coord.report(Result(99, Member(0, 9), 0.0))
    (record,) = coord.retry_update()
    assert coord.version == 1 and record.metrics == {"ok": 1.0}
    assert record.cohort.fitness.tolist() == [1.0, 2.0]


def _drive(coord: Coordinator, steps: int, seed: int, pending: list | None = None):
    """A deterministic driver: 5 slots, finishing jobs in a pseudo-random order."""
    rng = np.random.default_rng(seed)
    pending = [] if pending is None else pending
    log = []
    for _ in range(steps):
        pending.extend(coord.next_jobs(5 - len(pending)))
        job = pending.pop(int(rng.integers(len(pending))))
        for record in coord.report(job.result(float(rng.normal()), float(rng.exponential()))):
            log.append((record.version, record.cohort.versions.tolist(), record.cohort.indices.tolist(),
                        record.cohort.fitness.tolist(), dict(record.totals)))
    return log, pending


@pytest.mark.parametrize("schedule", [Async(), Controlled(2, 0.5), ExtremeLag(0.3, 3)], ids=lambda s: s.name)
def test_state_round_trips_through_json_and_resumes_identically(schedule):
    config = CoordinatorConfig(4, 3, seed=1)
    straight = Coordinator(config, schedule)
    _, pending = _drive(straight, 37, seed=0)
    snapshot = json.loads(json.dumps(straight.state_dict()))
    assert snapshot["in_flight"] and (schedule.name == "async" or snapshot["held"])  # mid-run, not trivial
    assert snapshot == straight.state_dict()  # JSON-exact: plain ints, floats, strings, lists
    resumed = Coordinator.from_state_dict(config, schedule, snapshot)
    assert resumed.totals() == straight.totals()
    assert resumed.state == straight.state
    log_a, _ = _drive(straight, 60, seed=1, pending=list(pending))
    log_b, _ = _drive(resumed, 60, seed=1, pending=list(pending))
    assert log_a == log_b and log_a
    assert resumed.state_dict() == straight.state_dict()


def test_simulated_runs_are_deterministic():
    def run():
        coord = Coordinator(CoordinatorConfig(8, 2, seed=2), Controlled(2, 0.25))
        report = simulate(coord, workers=6, durations=LogNormal(1.0), updates=15, seed=4)
        return report.update_times.tolist(), [r.cohort.fitness.tolist() for r in report.records], coord.state_dict()

    assert run() == run()


def test_lost_jobs_are_rerun_or_abandoned_without_deadlock():
    """After a resume the in-flight jobs can be re-run (same member, same tasks) or abandoned; either way a
    controlled schedule gets its quota back instead of waiting forever."""
    config = CoordinatorConfig(4, 2, seed=1)
    coord = Coordinator(config, Controlled(2, 0.5))
    first = simulate(coord, workers=3, durations=LogNormal(1.0), updates=3)
    lost = coord.in_flight_jobs()
    assert lost and all(job.tasks == coord.task_batch(job.member.version) for job in lost)
    again = simulate(coord, workers=3, durations=LogNormal(1.0), updates=3, seed=1)  # re-runs `lost`
    assert again.records[0].version == first.records[-1].version + 1
    for job in coord.in_flight_jobs():
        coord.abandon(job.job_id, duration=0.5)
    assert coord.totals()["discarded_by"]["abandoned"] == 3 and coord.in_flight == 0
    simulate(coord, workers=3, durations=LogNormal(1.0), updates=3, seed=2)
    assert coord.version == 9
    with pytest.raises(ValueError, match="not in flight"):
        coord.abandon(10_000)
