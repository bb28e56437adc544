"""Staleness schedules: where to dispatch and which finished results to release — small classes, not loop edits.

A schedule answers two questions for the :class:`~esjax.loop.coordinator.Coordinator`, which it sees only
through a small read-only :class:`CoordinatorView` (t, N, K, the seed and counts of held, in-flight and
accepted members):

* ``dispatch_versions(coord, free_slots)``: the versions to start new members at now (at most
  ``free_slots``; the coordinator assigns indices and task batches). Only live versions t−K … t are allowed.
* ``triage(coord, result)``: for a finished result, ACCEPT it into the open cohort, HOLD it back, or
  DISCARD it. Verdicts may depend on t and on the open cohort; the coordinator asks again for every held
  result after every update, and enforces lag ≤ K and finite fitness itself.

Schedules are stateless (frozen dataclasses): everything they decide is a function of the coordinator's
state and counter-based hashes, so a checkpoint of the coordinator alone resumes a schedule exactly.

How controlled staleness is made independent of timing (:class:`Controlled`)
---------------------------------------------------------------------------
Real completion order is arbitrary, so staleness cannot be obtained by hoping a member is slow. Instead
the schedule holds results back and fills per-cohort quotas. With m = round(p·N) (half up):

* Cohort t (after warm-up, t ≥ k) takes exactly N − m results measured at version t (lag 0) and exactly m
  measured at version t − k (lag k). Which ones: the first to finish, in completion order.
* A version-v result that finishes while v is current goes into cohort v if the fresh quota still has
  room; otherwise it is held back until t = v + k and then offered to cohort v + k's stale quota.
  Results that can no longer fit anywhere (lag ≥ k with the stale quota full, or lag > k) are discarded
  and counted as wasted work.
* Cohort t cannot complete before both quotas are full, so t never passes v + k while a version-v member
  it needs is still running: every stale member has lag *exactly* k, whatever the timing.
* Supply: every version must produce N − m fresh plus m stale-to-be results. The schedule dispatches at
  the current version until that supply (accepted + held + in flight) is covered and, with
  ``keep_busy``, keeps dispatching at t to fill idle slots. If t moved on before a version got its m
  stale-to-be members (few slots, fast cohorts), the missing members are dispatched *at that older
  version* (still live: t − k ≥ t − K), so the quota is met instead of deadlocking.
* Warm-up: cohorts t < k have no version t − k to draw from and are all fresh (N of lag 0).

The published code's "3 of 30 delayed by exactly 4 (or 8) updates" is ``Controlled(lag=4, fraction=0.1)``
with N = 30 and K ≥ 4; ``AllStale(k)`` is p = 1 (after warm-up every fitness is k updates old).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Protocol

from esjax.loop.tasks import hash_uniform
from esjax.loop.types import Finished, Verdict

_TAG_EXTREME = 0xE7A6


class CoordinatorView(Protocol):
    """What a schedule may read of the coordinator (:class:`~esjax.loop.coordinator.Coordinator` is one)."""

    @property
    def version(self) -> int:
        """t, the current version."""

    @property
    def population(self) -> int:
        """N, accepted members per update."""

    @property
    def max_lag(self) -> int:
        """K, the largest accepted lag."""

    @property
    def seed(self) -> int:
        """The run's task/schedule seed."""

    def inflight_at(self, version: int) -> int:
        """Members dispatched at ``version`` still running."""

    def held_at(self, version: int) -> int:
        """Finished members of ``version`` held back, not yet triaged."""

    def cohort_size(self) -> int:
        """Members accepted into the open cohort."""

    def cohort_count(self, lag: int) -> int:
        """Members of the open cohort with this lag."""


class Schedule(Protocol):
    """What the coordinator asks a schedule (see the module docstring).

    ``dispatch_window``: how many versions back it may dispatch (the rollout driver keeps θ of t − window … t).
    """

    name: str
    dispatch_window: int

    def validate(self, max_lag: int) -> None:
        """Raise ValueError if this schedule cannot run with K = ``max_lag`` (e.g. its lag exceeds K)."""

    def dispatch_versions(self, coord: CoordinatorView, free_slots: int) -> list[int]:
        """Versions at which to dispatch new members now; at most ``free_slots`` of them."""

    def triage(self, coord: CoordinatorView, result: Finished) -> Verdict:
        """ACCEPT / HOLD / DISCARD one finished result at the current version."""


def stale_count(fraction: float, population: int) -> int:
    """m = round(p·N), half up (so 0.1·30 = 3, 0.5·5 = 3)."""
    return int(math.floor(fraction * population + 0.5))


@dataclasses.dataclass(frozen=True)
class Sync:
    """Synchronous ES: exactly N members at t, a barrier, then the update. Every lag is 0.

    Dispatches only what the open cohort still lacks (re-dispatching members whose fitness was
    non-finite), so with fewer slots than N it runs in waves, all at version t.
    """

    name: ClassVar[str] = "sync"
    dispatch_window: ClassVar[int] = 0

    def validate(self, max_lag: int) -> None:
        pass

    def dispatch_versions(self, coord: CoordinatorView, free_slots: int) -> list[int]:
        t = coord.version
        need = coord.population - coord.cohort_size() - coord.inflight_at(t) - coord.held_at(t)
        return [t] * max(0, min(free_slots, need))

    def triage(self, coord: CoordinatorView, result: Finished) -> Verdict:
        return Verdict.ACCEPT


@dataclasses.dataclass(frozen=True)
class Async:
    """Natural asynchrony: every free slot gets a member at the current version; results are accepted
    as they finish while their lag is ≤ K (the coordinator discards the rest). Over-dispatches freely."""

    name: ClassVar[str] = "async"
    dispatch_window: ClassVar[int] = 0

    def validate(self, max_lag: int) -> None:
        pass

    def dispatch_versions(self, coord: CoordinatorView, free_slots: int) -> list[int]:
        return [coord.version] * free_slots

    def triage(self, coord: CoordinatorView, result: Finished) -> Verdict:
        return Verdict.ACCEPT


@dataclasses.dataclass(frozen=True)
class Controlled:
    """Controlled staleness: after k warm-up cohorts, every cohort has exactly round(p·N) members of lag
    exactly k and the rest of lag 0, independent of timing (see the module docstring for how).

    Attributes:
      lag: k (must be ≤ K).
      fraction: p in [0, 1].
      keep_busy: also dispatch at t into slots the quotas do not need (realistic utilization; the
        surplus is discarded when it can no longer fit).
    """

    lag: int
    fraction: float
    keep_busy: bool = True

    @property
    def name(self) -> str:
        return "controlled"

    @property
    def dispatch_window(self) -> int:
        return self.lag  # members owed to a stale quota may be dispatched at t - k ... t - 1

    def __post_init__(self) -> None:
        if self.lag < 0:
            raise ValueError(f"{self.name}: lag must be >= 0, got {self.lag}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"{self.name}: fraction must be in [0, 1], got {self.fraction}")

    def validate(self, max_lag: int) -> None:
        if self.lag > max_lag:
            raise ValueError(f"{self.name}: lag {self.lag} exceeds max_lag K={max_lag}")

    def quotas(self, population: int, version: int) -> tuple[int, int]:
        """(fresh, stale) members cohort ``version`` takes; warm-up cohorts are all fresh."""
        m = stale_count(self.fraction, population)
        if self.lag == 0 or version < self.lag:
            return population, 0
        return population - m, m

    def triage(self, coord: CoordinatorView, result: Finished) -> Verdict:
        t, n, k = coord.version, coord.population, self.lag
        lag = t - result.version
        fresh, stale = self.quotas(n, t)
        if lag == 0 and coord.cohort_count(0) < fresh:
            return Verdict.ACCEPT
        if k > 0 and lag == k and coord.cohort_count(k) < stale:
            return Verdict.ACCEPT
        if k > 0 and lag < k and stale_count(self.fraction, n) > 0:
            return Verdict.HOLD  # fits cohort result.version + k as a stale member
        return Verdict.DISCARD

    def dispatch_versions(self, coord: CoordinatorView, free_slots: int) -> list[int]:
        t, n, k = coord.version, coord.population, self.lag
        m = stale_count(self.fraction, n) if k > 0 else 0
        out: list[int] = []
        # Older versions that still owe stale members to cohorts t..t+k-1 (oldest first: needed soonest).
        for u in range(max(0, t - k), t):
            if m == 0:
                break
            supply = coord.held_at(u) + coord.inflight_at(u) + (coord.cohort_count(k) if u == t - k else 0)
            out.extend([u] * max(0, m - supply))
        fresh, _ = self.quotas(n, t)
        supply_t = coord.cohort_count(0) + coord.held_at(t) + coord.inflight_at(t)
        out.extend([t] * max(0, fresh + m - supply_t))
        if self.keep_busy and len(out) < free_slots:
            out.extend([t] * (free_slots - len(out)))
        return out[:free_slots]


@dataclasses.dataclass(frozen=True)
class AllStale(Controlled):
    """Stress test: p = 1, so after k warm-up cohorts every fitness in every cohort is exactly k updates old."""

    fraction: float = 1.0

    @property
    def name(self) -> str:
        return "all_stale"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fraction != 1.0:
            raise ValueError(f"all_stale: fraction is 1 by definition, got {self.fraction}")


@dataclasses.dataclass(frozen=True)
class ExtremeLag:
    """Stress test: a ``fraction`` of members each get a lag drawn uniformly from 1 … ``max_lag``.

    Member (v, i)'s draw is a hash of (seed, v, i) — stateless and reproducible. Its result is held back
    until t ≥ v + drawn lag, then accepted; so its lag is at least the drawn one and at most K (a cohort
    that fills while several held results come due pushes the rest one update later). The others behave
    as in :class:`Async`. ``fraction`` must be < 1 (with every member held, no cohort could ever start).
    """

    fraction: float = 0.25
    max_lag: int = 32

    name: ClassVar[str] = "extreme_lag"
    dispatch_window: ClassVar[int] = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction < 1.0:
            raise ValueError(f"extreme_lag: fraction must be in [0, 1), got {self.fraction}")
        if self.max_lag < 1:
            raise ValueError(f"extreme_lag: max_lag must be >= 1, got {self.max_lag}")

    def validate(self, max_lag: int) -> None:
        if self.max_lag > max_lag:
            raise ValueError(f"extreme_lag: max_lag {self.max_lag} exceeds the coordinator's K={max_lag}")

    def target_lag(self, seed: int, version: int, index: int) -> int:
        """The lag drawn for member (version, index): 0 for the undelayed majority."""
        if hash_uniform(seed, _TAG_EXTREME, version, index) >= self.fraction:
            return 0
        return 1 + int(hash_uniform(seed, _TAG_EXTREME + 1, version, index) * self.max_lag)

    def dispatch_versions(self, coord: CoordinatorView, free_slots: int) -> list[int]:
        return [coord.version] * free_slots

    def triage(self, coord: CoordinatorView, result: Finished) -> Verdict:
        target = self.target_lag(coord.seed, result.version, result.index)
        return Verdict.HOLD if coord.version - result.version < target else Verdict.ACCEPT


def make_schedule(kind: str, *, lag: int = 0, fraction: float = 0.0, max_lag: int = 1) -> Schedule:
    """A schedule by name, as in the run config's ``schedule`` section (kind, lag, stale_fraction, max_lag)."""
    if kind == "sync":
        return Sync()
    if kind == "async":
        return Async()
    if kind == "controlled":
        return Controlled(lag, fraction)
    if kind == "all_stale":
        return AllStale(lag)
    if kind == "extreme_lag":
        return ExtremeLag(fraction, max_lag)
    raise ValueError(f"schedule.kind: unknown schedule {kind!r} (expected sync, async, controlled, all_stale, "
                     f"extreme_lag)")
