"""The records the loop exchanges: jobs out, results in, cohorts to the ES update.

These are the whole interface between the coordinator and whatever runs rollouts (the latency simulator,
the continuous-batching rollout loop): the rollout side receives :class:`Job` s, evaluates
member ``(version, index)`` on the job's task batch with the job's sampling seed, and hands back a
:class:`Result` with the fitness and how long it took. Everything is plain Python / numpy so it can be
logged, pickled and checkpointed.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np


@dataclasses.dataclass(frozen=True)
class Member:
    """A population member: ``version`` = updates applied when it was dispatched, ``index`` counts
    members dispatched at that version (antithetic pairs ``2j`` / ``2j+1``)."""

    version: int
    index: int


@dataclasses.dataclass(frozen=True)
class TaskBatch:
    """What every member dispatched at ``version`` is evaluated on (common random numbers).

    ``goals`` are indices into the train split (the environment maps them to goal ids);
    ``sampling_seed`` seeds action sampling in every episode of the batch.
    """

    version: int
    goals: tuple[int, ...]
    sampling_seed: int


@dataclasses.dataclass(frozen=True)
class Job:
    """One member rollout to run: evaluate ``member`` (θ_v + σ·ε_(v,i)) on ``tasks``."""

    job_id: int
    member: Member
    tasks: TaskBatch

    def result(self, fitness: float, duration: float = 0.0) -> Result:
        """The :class:`Result` of this job (a convenience for rollout drivers)."""
        return Result(self.job_id, self.member, float(fitness), float(duration))


@dataclasses.dataclass(frozen=True)
class Result:
    """A finished job: fitness (maximized; mean episode reward over the task batch) and rollout time."""

    job_id: int
    member: Member
    fitness: float
    duration: float = 0.0


@dataclasses.dataclass
class Finished:
    """A result the coordinator holds: in the held buffer (not yet triaged) or in the open cohort."""

    job_id: int
    version: int
    index: int
    fitness: float
    duration: float


@dataclasses.dataclass(frozen=True)
class Cohort:
    """Exactly N accepted members, to be applied to θ at ``version`` (= the current t).

    ``versions`` / ``indices`` identify each member's own noise; ``lags = version - versions``.
    Members are in acceptance order.
    """

    version: int
    versions: np.ndarray  # int64 [N]
    indices: np.ndarray  # int64 [N]
    fitness: np.ndarray  # float64 [N]
    durations: np.ndarray  # float64 [N]

    @property
    def lags(self) -> np.ndarray:
        return self.version - self.versions

    @property
    def stale_fraction(self) -> float:
        return float(np.mean(self.lags > 0))


class UpdateFn(Protocol):
    """Applies one ES update for a cohort to the current θ_t; returns metrics (or None).

    The driver calls it once per complete cohort (``Coordinator.complete_cohort``), then
    ``Coordinator.advance`` (t + 1). The coordinator never calls it. If it raises, nothing changed: the
    cohort stays complete in the coordinator, so a caller can retry or checkpoint; raising
    ``RejectedUpdate`` means "refused" (the driver calls ``Coordinator.reject``).
    """

    def __call__(self, cohort: Cohort) -> Mapping[str, Any] | None: ...


@dataclasses.dataclass(frozen=True)
class UpdateRecord:
    """What one update did: its cohort (``version`` = the θ it was applied to; it produced ``version + 1``),
    the ES update's metrics and the coordinator's running totals right after it (held results re-triaged)."""

    cohort: Cohort
    metrics: Mapping[str, Any]
    totals: Mapping[str, Any]

    @property
    def version(self) -> int:
        return self.cohort.version

    def summary(self) -> dict[str, Any]:
        """Flat per-update metrics for logs: version, cohort lags and fitness, running totals, engine metrics."""
        lags = self.cohort.lags
        fitness = self.cohort.fitness
        return {
            "version": self.version,
            "cohort_lag_hist": np.bincount(lags).tolist() if len(lags) else [],
            "cohort_stale_fraction": self.cohort.stale_fraction,
            "fitness_mean": float(fitness.mean()), "fitness_max": float(fitness.max()),
            "fitness_std": float(fitness.std()),
            **{k: v for k, v in self.totals.items() if k != "version"},
            **dict(self.metrics),
        }


class Verdict(enum.Enum):
    """A schedule's decision about one finished result."""

    ACCEPT = "accept"  # into the open cohort now (the coordinator still enforces lag <= K)
    HOLD = "hold"  # keep it back; triaged again after the next update or result
    DISCARD = "discard"  # it will never fit this schedule: count it as wasted
