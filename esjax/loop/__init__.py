"""The bounded-staleness loop: coordinator (versions, jobs, cohorts), staleness schedules and the latency simulator.

Rollout drivers talk to :class:`Coordinator` only through :class:`Job` (out) and :class:`Result` (in);
``esjax.loop.es_update`` (imported on demand: it pulls in JAX) applies cohorts with the ES update (:mod:`esjax.es`).
"""

from esjax.loop.coordinator import Coordinator, CoordinatorConfig, CoordinatorState, RejectedUpdate, apply_cohorts
from esjax.loop.staleness import AllStale, Async, Controlled, ExtremeLag, Schedule, Sync, make_schedule, stale_count
from esjax.loop.tasks import TaskSampler
from esjax.loop.types import Cohort, Job, Member, Result, TaskBatch, UpdateFn, UpdateRecord, Verdict

__all__ = [
    "AllStale", "Async", "Cohort", "Controlled", "Coordinator", "CoordinatorConfig", "CoordinatorState",
    "ExtremeLag", "Job", "Member", "RejectedUpdate", "Result", "Schedule", "Sync", "TaskBatch", "TaskSampler",
    "UpdateFn", "UpdateRecord", "Verdict", "apply_cohorts", "make_schedule", "stale_count",
]
