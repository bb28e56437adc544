"""Coordinator mechanics: task batches (common random numbers), indices, input errors, failed updates,
cascades handed out one update at a time, end-of-run accounting, and a JSON state round trip that resumes
to exactly the same decisions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from esjax.loop.coordinator import Coordinator, CoordinatorConfig, apply_cohorts
from esjax.loop.simulate import LogNormal, simulate
from esjax.loop.staleness import Async, Controlled, ExtremeLag, Sync
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
    assert coord.version == 0 and coord.complete_cohort() is not None  # the driver applies the update
    apply_cohorts(coord)
    assert coord.version == 1
    new = coord.next_jobs(2)
    assert [j.member for j in new] == [Member(1, 0), Member(1, 1)]
    assert new[0].tasks == TaskSampler(5, 20, 3)(1)
    assert coord.live_versions() == [0, 1]  # jobs 4, 5 still run at version 0
    records = []
    for job, f in [(jobs[4], 2.0), (jobs[5], 0.0), (new[0], 1.0), (new[1], 1.0)]:
        coord.report(job.result(f, 1.0))
        records += apply_cohorts(coord)
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

    coord = Coordinator(CoordinatorConfig(2, 0), Sync())
    jobs = coord.next_jobs(2)
    coord.report(jobs[0].result(1.0))
    coord.report(jobs[1].result(2.0))
    with pytest.raises(RuntimeError, match="device lost"):
        apply_cohorts(coord, flaky)
    assert coord.version == 0 and coord.cohort_size() == 2 and coord.complete_cohort() is not None
    with pytest.raises(RuntimeError, match="no complete cohort"):
        Coordinator(CoordinatorConfig(2, 0), Sync()).advance()
    (record,) = apply_cohorts(coord, flaky)  # the retry
    assert coord.version == 1 and record.metrics == {"ok": 1.0} and calls == [0, 0]
    assert record.cohort.fitness.tolist() == [1.0, 2.0]


def _drive(coord: Coordinator, steps: int, seed: int, pending: list | None = None):
    """A deterministic driver: 5 slots, finishing jobs in a pseudo-random order."""
    rng = np.random.default_rng(seed)
    pending = [] if pending is None else pending
    log = []
    for _ in range(steps):
        pending.extend(coord.next_jobs(5 - len(pending)))
        job = pending.pop(int(rng.integers(len(pending))))
        coord.report(job.result(float(rng.normal()), float(rng.exponential())))
        for record in apply_cohorts(coord):
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



def test_a_cascade_is_handed_out_one_update_at_a_time():
    """All-stale k=2: results held for 2 updates come due together, so a tick's reports complete several
    cohorts. A driver that reports the whole tick first and then applies the complete cohorts one at a time
    (the trainer) gets each on its own — t advances by one per advance(), records labelled in turn — and the
    same decisions as a driver that applies each update the moment its cohort completes."""
    from esjax.loop.staleness import AllStale

    config = CoordinatorConfig(2, 2, seed=3)
    eager, deferred = Coordinator(config, AllStale(2)), Coordinator(config, AllStale(2))
    eager_records, deferred_records, cascades = [], [], []
    rng = np.random.default_rng(0)
    pending: list = []
    for _ in range(80):
        new = eager.next_jobs(6 - len(pending))
        assert deferred.next_jobs(6 - len(pending)) == new
        pending.extend(new)
        rng.shuffle(pending)
        tick, pending = pending[:3], pending[3:]  # three jobs finish in the same tick
        results = [job.result(float(rng.normal()), float(rng.exponential())) for job in tick]
        for result in results:  # eager: apply as soon as a cohort completes
            eager.report(result)
            eager_records += apply_cohorts(eager)
        before = deferred.version
        for result in results:  # trainer-like: report the whole tick, then the cohorts one at a time
            deferred.report(result)
        while (cohort := deferred.complete_cohort()) is not None:
            assert cohort.version == deferred.version
            record = deferred.advance({"applied": float(cohort.version)})
            assert record.version == cohort.version and deferred.version == cohort.version + 1
            assert record.totals["version"] == cohort.version + 1 and record.metrics["applied"] == cohort.version
            deferred_records.append(record)
        cascades.append(deferred.version - before)
        assert deferred.state == eager.state
    assert max(cascades) >= 2  # the schedule really produced cascades
    assert [r.version for r in deferred_records] == list(range(len(deferred_records)))
    assert _cohort_log(deferred_records) == _cohort_log(eager_records)
    assert all(set(r.cohort.lags.tolist()) == {2} for r in deferred_records[2:])  # every lag exactly k


def _cohort_log(records):
    return [(r.version, r.cohort.versions.tolist(), r.cohort.indices.tolist(), r.cohort.fitness.tolist())
            for r in records]


def test_results_reported_while_a_cohort_waits_are_held_untriaged():
    coord = Coordinator(CoordinatorConfig(2, 1), Async())
    jobs = coord.next_jobs(4)
    for job in jobs[:3]:
        coord.report(job.result(float(job.job_id)))
    assert coord.complete_cohort().fitness.tolist() == [0.0, 1.0]
    assert coord.held_at(0) == 1 and coord.cohort_size() == 2  # job 2 waits: t may still change
    record = coord.advance()
    assert record.version == 0 and coord.version == 1
    assert coord.cohort_count(1) == 1 and coord.held_at(0) == 0  # triaged after the update, at lag 1
    assert record.totals["held"] == 0 and record.totals["accepted"] == 3  # totals after the re-triage


@pytest.mark.parametrize("schedule", [Async(), Controlled(2, 0.5), ExtremeLag(0.3, 3)], ids=lambda s: s.name)
def test_close_accounts_for_every_dispatched_job(schedule):
    coord = Coordinator(CoordinatorConfig(4, 3, seed=1), schedule)
    _, pending = _drive(coord, 45, seed=2)
    for job in pending[:2]:
        coord.abandon(job.job_id, 1.0)
    before = coord.totals()
    assert before["in_flight"] and coord.cohort_size()  # something left to cancel, an open cohort included
    totals = coord.close()
    assert totals == coord.totals()
    assert totals["in_flight"] == totals["held"] == coord.cohort_size() == 0
    assert totals["accepted"] == 4 * coord.version == sum(totals["lag_hist"])
    assert totals["dispatched"] == totals["accepted"] + totals["discarded"] + totals["cancelled"]
    assert totals["discarded_by"] == before["discarded_by"]  # cancelling is not a discard
    unapplied = before["accepted"] - totals["accepted"]  # the open cohort's members
    assert unapplied > 0 and totals["cancelled"] == before["in_flight"] + before["held"] + unapplied
