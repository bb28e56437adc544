"""Discrete-event latency simulator: G rollout slots on a virtual clock, driving the real coordinator.

Why: the cost of a barrier depends on how spread out episode durations are, and on slots vs population;
measuring that with real LLM rollouts takes hours on slow hardware. Here the *same*
:class:`~esjax.loop.coordinator.Coordinator` and schedules run against a duration distribution and a
cheap surrogate fitness, so thousands of updates take seconds, and wall-clock, slot utilization, idle
time and lag histograms of ``sync`` vs ``async`` vs ``controlled`` come out directly.

Model: each of G slots runs one member rollout at a time; a job's duration is drawn when it starts; a
slot that frees is refilled at once by asking the coordinator (which may leave it idle, e.g. at the sync
barrier); an update takes ``update_time`` of virtual time during which nothing is dispatched (running
jobs continue). Ties in finish time are broken by job id, so a run is deterministic given its seed. Jobs a
coordinator has in flight when ``simulate`` starts (an earlier call, a resume) are re-run from the start.

It belongs to ``esjax.loop`` (not to experiments/ or benchmarks/, its callers besides the loop's tests): it is the
loop's own coordinator and schedules under a virtual clock, part of the library's public face, so that a user can
measure a schedule's wall-clock and idle time for their own duration distribution before running it.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from esjax.loop.coordinator import Coordinator, apply_cohorts
from esjax.loop.tasks import hash_uniform
from esjax.loop.types import Job, UpdateFn, UpdateRecord

# ---------------------------------------------------------------------------------------------------------
# Episode-duration distributions
# ---------------------------------------------------------------------------------------------------------


class Durations(Protocol):
    """Draws rollout durations (virtual seconds)."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class LogNormal:
    """exp(N(log median, sigma²)): the usual shape of episode lengths; ``sigma`` = σ_log."""

    sigma: float = 1.0
    median: float = 1.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.median * np.exp(self.sigma * rng.standard_normal(n))


@dataclasses.dataclass(frozen=True)
class Pareto:
    """Heavy tail: ``scale · (1 + Lomax(alpha))`` (minimum ``scale``; infinite variance for alpha ≤ 2)."""

    alpha: float = 1.5
    scale: float = 1.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.scale * (1.0 + rng.pareto(self.alpha, n))


@dataclasses.dataclass(frozen=True)
class Empirical:
    """Resample measured durations (e.g. from a real run's per-member rollout times)."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values or min(self.values) < 0:
            raise ValueError("Empirical durations need at least one value, all >= 0")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values, np.float64), size=n)


@dataclasses.dataclass(frozen=True)
class ConstantDuration:
    """Every rollout takes ``value`` (no barrier cost at all: a sanity baseline)."""

    value: float = 1.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, np.float64)


@dataclasses.dataclass(frozen=True)
class Scripted:
    """The i-th started job takes ``values[i % len(values)]``: exact control of completion order (tests)."""

    values: tuple[float, ...]

    def at(self, position: int) -> float:
        return float(self.values[position % len(self.values)])

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.resize(np.asarray(self.values, np.float64), n)


# ---------------------------------------------------------------------------------------------------------
# Surrogate fitness
# ---------------------------------------------------------------------------------------------------------

FitnessFn = Callable[[Sequence[Job]], np.ndarray]
"""Fitness of jobs, computed when they start (θ_v is known then); NaN / inf allowed (they are dropped)."""


@dataclasses.dataclass(frozen=True)
class HashFitness:
    """A uniform pseudo-random fitness per (task batch, member): free, deterministic, for timing studies."""

    seed: int = 0

    def __call__(self, jobs: Sequence[Job]) -> np.ndarray:
        return np.array([hash_uniform(self.seed, j.tasks.sampling_seed, j.member.version, j.member.index)
                         for j in jobs], np.float64)


@dataclasses.dataclass(frozen=True)
class RewardTable:
    """A recorded reward table ``rewards[row, goal]``: member fitness = mean reward over its task batch.

    The row of member (v, i) is a hash of (seed, v, i), so members differ while every member of one
    version shares the goals (common random numbers).
    """

    rewards: np.ndarray
    seed: int = 0

    def __call__(self, jobs: Sequence[Job]) -> np.ndarray:
        rows = self.rewards.shape[0]
        out = np.empty(len(jobs), np.float64)
        for n, job in enumerate(jobs):
            row = int(hash_uniform(self.seed, job.member.version, job.member.index) * rows)
            goals = np.asarray(job.tasks.goals) % self.rewards.shape[1]
            out[n] = float(np.mean(self.rewards[row, goals]))
        return out


# ---------------------------------------------------------------------------------------------------------
# The simulation
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SimReport:
    """Timing of one simulated run (virtual seconds)."""

    schedule: str
    workers: int
    population: int
    max_lag: int
    updates: int
    wall_clock: float
    busy_time: float  # slot-seconds spent running jobs (useful + wasted + unfinished)
    useful_time: float  # slot-seconds of accepted results
    wasted_time: float  # slot-seconds of discarded results
    update_times: np.ndarray  # virtual time at which each update was applied
    totals: dict
    records: list[UpdateRecord]

    @property
    def slot_time(self) -> float:
        return self.workers * self.wall_clock

    @property
    def utilization(self) -> float:
        """Busy slots / slots, averaged over the run."""
        return self.busy_time / self.slot_time if self.slot_time > 0 else 0.0

    @property
    def useful_utilization(self) -> float:
        """Share of slot time that produced accepted fitness."""
        return self.useful_time / self.slot_time if self.slot_time > 0 else 0.0

    @property
    def idle_time(self) -> float:
        return self.slot_time - self.busy_time

    def time_to(self, updates: int) -> float:
        """Virtual time at which update number ``updates`` (1-based) was applied."""
        return float(self.update_times[updates - 1])

    def summary(self) -> dict:
        return {
            "schedule": self.schedule, "workers": self.workers, "N": self.population, "K": self.max_lag,
            "updates": self.updates, "wall_clock": self.wall_clock, "utilization": self.utilization,
            "useful_utilization": self.useful_utilization, "idle_time": self.idle_time,
            "wasted_time": self.wasted_time, "lag_hist": self.totals["lag_hist"],
            "stale_fraction": self.totals["stale_fraction"], "discarded": self.totals["discarded"],
        }


def simulate(coordinator: Coordinator, *, workers: int, durations: Durations, updates: int,
             fitness: FitnessFn | None = None, seed: int = 0, update_time: float = 0.0,
             keep_records: bool = True, max_jobs: int | None = None, update: UpdateFn | None = None) -> SimReport:
    """Run ``coordinator`` until it has applied ``updates`` more updates, on ``workers`` virtual slots.

    ``update``: applies each complete cohort to θ (e.g. :class:`esjax.loop.es_update.ESUpdate`); None records
    cohorts without an update (timing studies).

    Raises RuntimeError if the schedule stalls (nothing in flight and nothing dispatched) or if more
    than ``max_jobs`` jobs were started (default 1000·N + 10·updates·N).
    """
    if workers < 1:
        raise ValueError(f"simulate: workers must be >= 1, got {workers}")
    fitness = fitness if fitness is not None else HashFitness(seed)
    coord = coordinator
    target = coord.version + updates
    n = coord.population
    max_jobs = max_jobs if max_jobs is not None else 1000 * n + 10 * updates * n
    rng = np.random.default_rng(seed)
    pool: list[float] = []
    started = 0

    def draw() -> float:
        nonlocal pool, started
        started += 1
        if isinstance(durations, Scripted):
            return durations.at(started - 1)
        if not pool:
            pool = durations.sample(rng, 4096).tolist()[::-1]
        return pool.pop()

    heap: list[tuple[float, int, Job, float, float, float]] = []  # (finish, job id, job, fitness, dur, start)
    clock = 0.0
    busy = 0.0
    update_times: list[float] = []
    records: list[UpdateRecord] = []
    start_version = coord.version
    accepted_before, wasted_before = coord.state.accepted_time, coord.state.wasted_time

    def start(jobs: list[Job], now: float) -> None:
        values = np.asarray(fitness(jobs), np.float64)
        for job, value in zip(jobs, values):
            duration = draw()
            if not math.isfinite(duration) or duration < 0:
                raise ValueError(f"simulate: drew an invalid duration {duration}")
            heapq.heappush(heap, (now + duration, job.job_id, job, float(value), duration, now))

    def fill(now: float) -> None:
        jobs = coord.next_jobs(workers - len(heap))
        if jobs:
            start(jobs, now)
        if started > max_jobs:
            raise RuntimeError(f"simulate: started {started} jobs for {coord.version - start_version} updates "
                               f"(schedule {coord.schedule.name} is not converging)")

    resumed = coord.in_flight_jobs()  # left running by an earlier driver: re-run them from the start
    if len(resumed) > workers:
        raise ValueError(f"simulate: the coordinator has {len(resumed)} jobs in flight, more than {workers} workers")
    if resumed:
        start(resumed, clock)
    fill(clock)
    ready = 0.0  # the coordinator is applying updates until then: no dispatch before it
    while coord.version < target:
        if not heap:
            raise RuntimeError(f"simulate: schedule {coord.schedule.name} stalled at version {coord.version}: "
                               f"nothing in flight and nothing dispatched")
        finish, _, job, value, duration, _ = heapq.heappop(heap)
        clock = finish
        busy += duration
        coord.report(job.result(value, duration))
        for record in apply_cohorts(coord, update, until=target):
            ready = max(ready, clock) + update_time
            update_times.append(ready)
            if keep_records:
                records.append(record)
        fill(max(clock, ready))
    wall = max(clock, ready)
    busy += sum(min(wall, f) - s for f, _, _, _, _, s in heap)  # partial work of jobs still running
    totals = coord.totals()
    return SimReport(
        schedule=coord.schedule.name, workers=workers, population=n, max_lag=coord.max_lag,
        updates=coord.version - start_version, wall_clock=wall, busy_time=busy,
        useful_time=totals["accepted_time"] - accepted_before, wasted_time=totals["wasted_time"] - wasted_before,
        update_times=np.asarray(update_times[: updates], np.float64), totals=totals, records=records,
    )
