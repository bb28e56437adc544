"""The bounded-staleness coordinator: versions, dispatch, acceptance, cohorts and their bookkeeping.

It owns the version t of θ (updates applied so far) and is the only place where the exact semantics live:

* **dispatch**: a job is member ``(v, i)`` with the task batch and sampling seed of version ``v``;
  ``i`` counts members dispatched at ``v``. The :class:`~esjax.loop.staleness.Schedule` says at which
  versions to dispatch (normally t; older live versions for controlled staleness).
* **acceptance**: a finished result first goes to a *held* buffer; the schedule triages held results
  (accept now / hold back / discard). An accepted result with lag = t − v > K is discarded anyway, as is a
  non-finite fitness; discards are counted by reason together with their wasted rollout time.
* **cohorts**: as soon as exactly N results are accepted the cohort is *complete*. The coordinator stops
  there and hands it out (:meth:`Coordinator.complete_cohort`); it never calls the update itself. The
  driver applies the ES update to θ_t with each member's own ``(v, i)`` noise and then calls
  :meth:`~Coordinator.advance` (t ← t + 1; held results are triaged again, their lag just grew, which may
  complete the next cohort: a *cascade*, one update at a time) or :meth:`~Coordinator.reject`. Results
  reported while a cohort waits for its update are held untriaged and triaged after it, in arrival order,
  so the decisions are the same as if the update had been applied the moment the cohort completed.
* **end of run**: :meth:`~Coordinator.close` cancels what is left (jobs in flight, held results, an open
  cohort), so every dispatched job ends accepted (into an applied update), discarded (with a reason) or
  cancelled: ``dispatched == accepted + discarded + cancelled``.

The driver loop (see :func:`apply_cohorts` for the minimal one)::

    coord.report(result)                         # for every finished job of a tick
    while (cohort := coord.complete_cohort()) is not None:
        metrics = es_update(cohort)              # θ_t -> θ_t+1 (or RejectedUpdate: coord.reject(...))
        record = coord.advance(metrics)          # t + 1: evaluate / checkpoint at record.version + 1

It never looks at a clock or a thread: given the same sequence of calls it makes the same decisions, and
its whole state is a plain dataclass (:meth:`state_dict`) so a checkpoint keeps accepted-but-not-applied
fitness (a complete cohort included), held results and every counter.

It is one module (~480 lines) because dispatch, triage, cohorts and their counters are one state machine over
one state; the schedules that steer it are :mod:`esjax.loop.staleness`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from esjax.loop.staleness import Schedule
from esjax.loop.tasks import TaskSampler
from esjax.loop.types import Cohort, Finished, Job, Member, Result, TaskBatch, UpdateFn, UpdateRecord, Verdict

DISCARD_REASONS = ("too_stale", "schedule", "nonfinite", "abandoned", "rejected_update")


class RejectedUpdate(ArithmeticError):
    """Raised by an update function that refuses a cohort (e.g. the step would make θ non-finite) without
    changing its state. The driver then calls :meth:`Coordinator.reject`: t stays, that cohort's members are
    discarded (``'rejected_update'``) and the rejection is recorded in :attr:`Coordinator.rejections`; the
    run goes on at the same version."""


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    """N, K and how task batches are drawn.

    Attributes:
      population: N, accepted members per update.
      max_lag: K, accept a fitness measured at version v iff t − v ≤ K.
      seed: seed of task batches (and of any schedule randomness).
      train_size: size of the train split goals are drawn from.
      tasks_per_member: goals in each version's task batch.
    """

    population: int
    max_lag: int = 1
    seed: int = 0
    train_size: int = 1000
    tasks_per_member: int = 4

    def __post_init__(self) -> None:
        if self.population < 1:
            raise ValueError(f"CoordinatorConfig.population must be >= 1, got {self.population}")
        if self.max_lag < 0:
            raise ValueError(f"CoordinatorConfig.max_lag must be >= 0, got {self.max_lag}")

    @property
    def tasks(self) -> TaskSampler:
        return TaskSampler(self.seed, self.train_size, self.tasks_per_member)


@dataclasses.dataclass
class CoordinatorState:
    """Everything a resume needs. Plain ints, floats, lists and dicts only (see :meth:`to_dict`)."""

    version: int = 0
    next_job_id: int = 0
    dispatched_at: dict[int, int] = dataclasses.field(default_factory=dict)  # version -> members dispatched
    in_flight: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # job id -> (v, i)
    held: list[Finished] = dataclasses.field(default_factory=list)  # finished, awaiting triage (FIFO)
    # accepted, not yet applied; when it holds N members it is complete and waits for its update (held
    # results are then untriaged until advance() / reject())
    cohort: list[Finished] = dataclasses.field(default_factory=list)
    dispatched: int = 0
    completed: int = 0
    accepted: int = 0
    discarded: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(DISCARD_REASONS, 0))
    wasted_time: float = 0.0  # rollout time of discarded results
    accepted_time: float = 0.0  # rollout time of accepted results
    lag_hist: list[int] = dataclasses.field(default_factory=list)  # accepted lags 0..K
    rejected_updates: int = 0  # cohorts whose update was refused (RejectedUpdate -> reject())
    cancelled: int = 0  # jobs / results the run ended without deciding on (close(), cancel())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: int dict keys become strings, records become lists."""
        out = dataclasses.asdict(self)
        out["dispatched_at"] = {str(k): v for k, v in self.dispatched_at.items()}
        out["in_flight"] = {str(k): list(v) for k, v in self.in_flight.items()}
        out["held"] = [list(dataclasses.astuple(r)) for r in self.held]
        out["cohort"] = [list(dataclasses.astuple(r)) for r in self.cohort]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CoordinatorState:
        return cls(
            version=int(data["version"]),
            next_job_id=int(data["next_job_id"]),
            dispatched_at={int(k): int(v) for k, v in data["dispatched_at"].items()},
            in_flight={int(k): (int(v[0]), int(v[1])) for k, v in data["in_flight"].items()},
            held=[_finished(r) for r in data["held"]],
            cohort=[_finished(r) for r in data["cohort"]],
            dispatched=int(data["dispatched"]),
            completed=int(data["completed"]),
            accepted=int(data["accepted"]),
            discarded={**dict.fromkeys(DISCARD_REASONS, 0), **{str(k): int(v) for k, v in data["discarded"].items()}},
            wasted_time=float(data["wasted_time"]),
            accepted_time=float(data["accepted_time"]),
            lag_hist=[int(x) for x in data["lag_hist"]],
            rejected_updates=int(data.get("rejected_updates", 0)),
            cancelled=int(data.get("cancelled", 0)),
        )


def _finished(row: Any) -> Finished:
    job_id, version, index, fitness, duration = row
    return Finished(int(job_id), int(version), int(index), float(fitness), float(duration))


class Coordinator:
    """Bounded-staleness ES bookkeeping, driven by ``next_jobs`` (dispatch) and ``report`` (results).

    Pure bookkeeping: complete cohorts come back from :meth:`complete_cohort`; the driver applies each
    update and calls :meth:`advance` (or :meth:`reject`). See the module docstring for the loop.

    Args:
      config: N, K, task-batch settings.
      schedule: a :class:`~esjax.loop.staleness.Schedule` (where to dispatch, which results to release).
      state: a restored :class:`CoordinatorState` (resume), else a fresh one.
    """

    def __init__(self, config: CoordinatorConfig, schedule: Schedule, *, state: CoordinatorState | None = None
                 ) -> None:
        schedule.validate(config.max_lag)
        self.config = config
        self.schedule = schedule
        self.state = state if state is not None else CoordinatorState(lag_hist=[0] * (config.max_lag + 1))
        if len(self.state.lag_hist) != config.max_lag + 1:
            raise ValueError(f"state has a lag histogram for K={len(self.state.lag_hist) - 1}, "
                             f"config has max_lag={config.max_lag}")
        self._tasks = config.tasks
        self._task_cache: dict[int, TaskBatch] = {}
        self._inflight_by_version = collections.Counter(v for v, _ in self.state.in_flight.values())
        self._held_by_version = collections.Counter(r.version for r in self.state.held)
        #: rejected cohorts since the driver last drained this list: ``{"version", "members", "reason"}``
        self.rejections: list[dict[str, Any]] = []

    # ---------------------------------------------------------------------------------------------------
    # Read-only views (what schedules and drivers look at; schedules see only a
    # :class:`~esjax.loop.staleness.CoordinatorView`: version, population, max_lag, seed and the counts)
    # ---------------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self.state.version

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def population(self) -> int:
        return self.config.population

    @property
    def max_lag(self) -> int:
        return self.config.max_lag

    def inflight_at(self, version: int) -> int:
        return self._inflight_by_version[version]

    def held_at(self, version: int) -> int:
        return self._held_by_version[version]

    def dispatched_at(self, version: int) -> int:
        return self.state.dispatched_at.get(version, 0)

    def cohort_size(self) -> int:
        return len(self.state.cohort)

    def cohort_count(self, lag: int) -> int:
        """Accepted members of the open cohort with this lag."""
        t = self.state.version
        return sum(1 for r in self.state.cohort if t - r.version == lag)

    @property
    def in_flight(self) -> int:
        return len(self.state.in_flight)

    def live_versions(self) -> list[int]:
        """Versions whose θ a rollout driver must keep: those of in-flight jobs and those the schedule may
        still dispatch at (t − ``schedule.dispatch_window`` … t; K when a schedule does not say)."""
        t = self.state.version
        window = min(int(getattr(self.schedule, "dispatch_window", self.config.max_lag)), self.config.max_lag)
        return sorted({*range(max(0, t - window), t + 1), *self._inflight_by_version.keys()})

    def task_batch(self, version: int) -> TaskBatch:
        batch = self._task_cache.get(version)
        if batch is None:
            if len(self._task_cache) > 4 * (self.config.max_lag + 2):
                self._task_cache.clear()
            batch = self._task_cache[version] = self._tasks(version)
        return batch

    # ---------------------------------------------------------------------------------------------------
    # Dispatch
    # ---------------------------------------------------------------------------------------------------
    def next_jobs(self, free_slots: int) -> list[Job]:
        """Jobs to start now in ``free_slots`` free rollout slots (possibly fewer, e.g. at a barrier)."""
        if free_slots <= 0:
            return []
        versions = self.schedule.dispatch_versions(self, free_slots)
        if len(versions) > free_slots:
            raise RuntimeError(f"schedule {self.schedule!r} asked for {len(versions)} jobs in {free_slots} slots")
        return [self.dispatch(v) for v in versions]

    def dispatch(self, version: int) -> Job:
        """Start member ``(version, next index)``. ``version`` must be live: t − K ≤ version ≤ t."""
        state = self.state
        if not state.version - self.config.max_lag <= version <= state.version:
            raise ValueError(f"cannot dispatch at version {version}: t={state.version}, K={self.config.max_lag} "
                             f"(only t-K..t can still be accepted)")
        index = state.dispatched_at.get(version, 0)
        state.dispatched_at[version] = index + 1
        job = Job(state.next_job_id, Member(version, index), self.task_batch(version))
        state.next_job_id += 1
        state.in_flight[job.job_id] = (version, index)
        state.dispatched += 1
        self._inflight_by_version[version] += 1
        return job

    def in_flight_jobs(self) -> list[Job]:
        """The jobs in flight, rebuilt from the state (e.g. to re-run them after a resume: a member's
        rollout depends only on (v, i) and version v's task batch, so re-running reproduces it)."""
        items = sorted(self.state.in_flight.items())
        return [Job(job_id, Member(v, i), self.task_batch(v)) for job_id, (v, i) in items]

    def abandon(self, job_id: int, duration: float = 0.0) -> None:
        """Give up on an in-flight job (a worker died, the rollout was cancelled); counted as discarded
        ('abandoned') with ``duration`` wasted. Schedules then see the missing supply and re-dispatch."""
        member = self._pop_in_flight(job_id, "abandon")
        self.state.completed += 1
        self._discard(Finished(job_id, member[0], member[1], math.nan, float(duration)), "abandoned")

    def cancel(self, job_id: int, duration: float = 0.0) -> None:
        """Stop an in-flight job because the run ends (not a discard: nothing went wrong with it); counted
        as ``cancelled``. ``duration`` is rollout time spent on it, counted as wasted."""
        self._pop_in_flight(job_id, "cancel")
        self.state.cancelled += 1
        self.state.wasted_time += float(duration)

    def close(self) -> dict[str, Any]:
        """End of run: cancel every job still in flight, every held result and the open (unapplied) cohort,
        whose members stop counting as accepted. Afterwards ``dispatched == accepted + discarded + cancelled``
        and ``accepted`` is N per applied update. Returns :meth:`totals`."""
        state = self.state
        for job_id in sorted(state.in_flight):
            self.cancel(job_id)
        for r in state.held:
            state.cancelled += 1
            state.wasted_time += r.duration
        state.held = []
        self._held_by_version.clear()
        for r in self._unaccept_cohort():
            state.cancelled += 1
            state.wasted_time += r.duration
        return self.totals()

    def _pop_in_flight(self, job_id: int, what: str) -> tuple[int, int]:
        member = self.state.in_flight.pop(job_id, None)
        if member is None:
            raise ValueError(f"cannot {what} job {job_id}: it is not in flight")
        self._decrement(self._inflight_by_version, member[0])
        return member

    # ---------------------------------------------------------------------------------------------------
    # Results and cohorts
    # ---------------------------------------------------------------------------------------------------
    def report(self, result: Result) -> None:
        """Take a finished job's fitness. Bookkeeping only: if this completes a cohort, it waits in
        :meth:`complete_cohort` for the driver's update; results reported meanwhile are held untriaged."""
        state = self.state
        member = state.in_flight.get(result.job_id)
        if member is None:
            raise ValueError(f"result for job {result.job_id}, which is not in flight (unknown or reported twice)")
        if member != (result.member.version, result.member.index):
            raise ValueError(f"result for job {result.job_id} names member {result.member}, "
                             f"but that job runs member {member}")
        del state.in_flight[result.job_id]
        self._decrement(self._inflight_by_version, member[0])
        state.completed += 1
        finished = Finished(result.job_id, member[0], member[1], float(result.fitness), float(result.duration))
        if not math.isfinite(finished.fitness):
            self._discard(finished, "nonfinite")
            return
        state.held.append(finished)
        self._held_by_version[finished.version] += 1
        if not self._complete():
            self._triage(len(state.held) - 1)

    def complete_cohort(self) -> Cohort | None:
        """The complete cohort waiting for its update (exactly N accepted members, to be applied to θ_t), or
        None. The driver applies it and then calls :meth:`advance` (or :meth:`reject`)."""
        if not self._complete():
            return None
        rows = self.state.cohort
        return Cohort(
            version=self.state.version,
            versions=np.array([r.version for r in rows], np.int64),
            indices=np.array([r.index for r in rows], np.int64),
            fitness=np.array([r.fitness for r in rows], np.float64),
            durations=np.array([r.duration for r in rows], np.float64),
        )

    def advance(self, metrics: Mapping[str, Any] | None = None) -> UpdateRecord:
        """The complete cohort's update was applied to θ_t: t ← t + 1, held results are triaged again (this
        may complete the next cohort: check :meth:`complete_cohort` again). ``metrics``: the update's
        metrics, kept in the returned record, whose totals are taken after that re-triage."""
        cohort = self.complete_cohort()
        if cohort is None:
            raise RuntimeError(f"advance() at version {self.state.version}: no complete cohort "
                               f"({len(self.state.cohort)} of {self.config.population} accepted)")
        state = self.state
        state.cohort = []
        state.version += 1
        floor = state.version - self.config.max_lag
        for v in [v for v in state.dispatched_at if v < floor]:
            del state.dispatched_at[v]
        self._triage(0)
        return UpdateRecord(cohort, dict(metrics or {}), self.totals())

    def reject(self, reason: str) -> None:
        """The complete cohort's update was refused (θ_t and the optimizer state unchanged): t stays, its
        members are discarded ('rejected_update', un-counting their acceptance), the rejection is recorded
        in :attr:`rejections`, and held results are triaged again."""
        if not self._complete():
            raise RuntimeError(f"reject() at version {self.state.version}: no complete cohort")
        rows = self._unaccept_cohort()
        for r in rows:
            self._discard(r, "rejected_update")
        self.state.rejected_updates += 1
        self.rejections.append({"version": self.state.version, "members": [[r.version, r.index] for r in rows],
                                "reason": reason})
        self._triage(0)

    def _complete(self) -> bool:
        return len(self.state.cohort) >= self.config.population

    def _triage(self, start: int) -> None:
        """Triage held results from position ``start`` in arrival order, stopping when a cohort completes
        (the rest waits for :meth:`advance` / :meth:`reject`, which triage again from the start).

        Contract with schedules: a verdict may change only when t changes, so a new result is triaged
        on arrival and every held result again after every update (each lag just grew by one).
        """
        state = self.state
        pos = start
        while pos < len(state.held) and not self._complete():
            finished = state.held[pos]
            lag = state.version - finished.version
            verdict = Verdict.DISCARD if lag > self.config.max_lag else self.schedule.triage(self, finished)
            if verdict is Verdict.HOLD:
                pos += 1
                continue
            if verdict is not Verdict.ACCEPT and verdict is not Verdict.DISCARD:
                raise TypeError(f"schedule {self.schedule!r} returned {verdict!r}, not a Verdict")
            del state.held[pos]
            self._decrement(self._held_by_version, finished.version)
            if verdict is Verdict.DISCARD:
                self._discard(finished, "too_stale" if lag > self.config.max_lag else "schedule")
            else:
                self._accept(finished, lag)

    def _unaccept_cohort(self) -> list[Finished]:
        """Empty the open cohort, un-counting its members' acceptance (rejected or cancelled cohorts)."""
        state = self.state
        rows, state.cohort = state.cohort, []
        for r in rows:
            state.accepted -= 1
            state.accepted_time -= r.duration
            state.lag_hist[state.version - r.version] -= 1
        return rows

    def _accept(self, finished: Finished, lag: int) -> None:
        state = self.state
        state.cohort.append(finished)
        state.accepted += 1
        state.accepted_time += finished.duration
        state.lag_hist[lag] += 1

    def _discard(self, finished: Finished, reason: str) -> None:
        self.state.discarded[reason] += 1
        self.state.wasted_time += finished.duration

    @staticmethod
    def _decrement(counter: collections.Counter, key: int) -> None:
        counter[key] -= 1
        if counter[key] <= 0:
            del counter[key]

    # ---------------------------------------------------------------------------------------------------
    # Bookkeeping and persistence
    # ---------------------------------------------------------------------------------------------------
    def totals(self) -> dict[str, Any]:
        """Running totals: dispatched / accepted / discarded (by reason), lag histogram, stale fraction."""
        s = self.state
        discarded = sum(s.discarded.values())
        return {
            "version": s.version,
            "dispatched": s.dispatched,
            "completed": s.completed,
            "accepted": s.accepted,
            "discarded": discarded,
            "discarded_by": dict(s.discarded),
            "in_flight": len(s.in_flight),
            "held": len(s.held),
            "wasted_time": s.wasted_time,
            "accepted_time": s.accepted_time,
            "lag_hist": list(s.lag_hist),
            "stale_fraction": 1.0 - s.lag_hist[0] / s.accepted if s.accepted else 0.0,
            "rejected_updates": s.rejected_updates,
            "cancelled": s.cancelled,
        }

    def applied_totals(self) -> dict[str, Any]:
        """:meth:`totals` with ``accepted``, ``accepted_time``, ``lag_hist`` and ``stale_fraction`` counting the
        members of applied updates only (what :meth:`close` leaves them at), plus ``open_cohort``: members already
        accepted into the next, unapplied cohort. So an update record and the end record mean the same by them."""
        totals, rows = self.totals(), self.state.cohort
        lag_hist = list(totals["lag_hist"])
        for r in rows:
            lag_hist[self.state.version - r.version] -= 1
        accepted = totals["accepted"] - len(rows)
        return {**totals, "accepted": accepted, "lag_hist": lag_hist, "open_cohort": len(rows),
                "accepted_time": totals["accepted_time"] - sum(r.duration for r in rows),
                "stale_fraction": 1.0 - lag_hist[0] / accepted if accepted else 0.0}

    def state_dict(self) -> dict[str, Any]:
        """The JSON-ready state (the trainer checkpoints it next to θ and the optimizer state)."""
        return self.state.to_dict()

    @classmethod
    def from_state_dict(cls, config: CoordinatorConfig, schedule: Schedule, data: Mapping[str, Any]) -> Coordinator:
        return cls(config, schedule, state=CoordinatorState.from_dict(data))


def apply_cohorts(coord: Coordinator, update: UpdateFn | None = None, *,
                  until: int | Callable[[], int] | None = None,
                  on_version: Callable[[UpdateRecord], None] | None = None,
                  on_reject: Callable[[RejectedUpdate], None] | None = None) -> list[UpdateRecord]:
    """The driver step: apply every complete cohort in turn (a cascade one update at a time).

    ``update(cohort)`` applies the ES update to θ_t and returns its metrics (``None``: bookkeeping only, for
    timing studies); a :class:`RejectedUpdate` becomes :meth:`Coordinator.reject` (then ``on_reject(err)``), any
    other exception propagates with the cohort kept (call again to retry). After each update, ``on_version(record)``
    runs with version t + 1 in place (the trainer evaluates and checkpoints there, before the next cohort of a
    cascade). Stops once t reaches ``until`` (a callable is asked again after every update: a hook may end the run
    early). Returns the records of the updates applied, in order.
    """
    records: list[UpdateRecord] = []
    limit = until if callable(until) else (lambda: until)
    while (stop := limit()) is None or coord.version < stop:
        cohort = coord.complete_cohort()
        if cohort is None:
            break
        try:
            metrics = update(cohort) if update is not None else None
        except RejectedUpdate as err:
            coord.reject(str(err))
            if on_reject is not None:
                on_reject(err)
            continue
        records.append(record := coord.advance(metrics))
        if on_version is not None:
            on_version(record)
    return records
