"""Checkpoints of the training loop: what a consistent point holds and how a resume reads it back.

A checkpoint is taken only at a consistent point (every finished job of the tick reported, θ and the coordinator
at the same version) and holds two things: the array tree — the ES state and θ of every older version still needed
(by an in-flight episode or an evaluation) — and the loop state (JSON): the counters, the coordinator's state,
each in-flight episode's trace (replayed on resume without calling the model), the free rows, jobs, evaluations in
progress, and how many metrics records were written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from esjax.loop.coordinator import Coordinator
from esjax.loop.es_update import ESUpdate
from esjax.loop.rollout import RolloutEngine
from esjax.rundir.checkpoint import Checkpointer
from esjax.train.inflight import LoopCounters
from esjax.train.interleaved_eval import Evaluations
from esjax.train.jobs import MemberJobs


@dataclasses.dataclass
class Restored:
    """The loop as a checkpoint left it (jobs, evaluations and episodes are restored in place)."""

    step: int
    es_update: ESUpdate
    coord: Coordinator
    counters: LoopCounters
    records: int | None  # metrics records written when it was taken (None: a checkpoint from before counting)


def needed_versions(version: int, max_lag: int, engine: RolloutEngine, coord: Coordinator,
                    evals: Evaluations) -> list[int]:
    """Older versions whose θ a checkpoint at ``version`` must hold."""
    versions = {e.version for e in engine.live.values()}
    versions |= {v for v in coord.live_versions() if v <= version}
    # θ older than t - K is no longer kept and nothing dispatched there can still be accepted (at the end of a
    # run the coordinator still lists such jobs as in flight); evaluations keep their own copy of θ.
    versions = {v for v in versions if v >= version - max_lag}
    versions |= evals.versions()
    return sorted(v for v in versions if v != version)


def loop_state(counters: LoopCounters, wall_time: float, coord: Coordinator, saved_versions: list[int],
               engine: RolloutEngine, jobs: MemberJobs, evals: Evaluations,
               records: int | None) -> dict[str, Any]:
    """Everything but arrays that a resume needs; :func:`restore` reads exactly this back."""
    return {**counters.to_dict(), "wall_time": wall_time,
            "coordinator": coord.state_dict(), "saved_versions": saved_versions,
            "episodes": engine.checkpoint_episodes(),
            "free_rows": list(engine.free_rows),
            "jobs": jobs.to_dict(),
            **evals.to_dict(),
            "metrics_records": records}


def save(checkpointer: Checkpointer, version: int, es_update: ESUpdate, params_at: Callable[[int], Any],
         loop: dict[str, Any]) -> None:
    """A checkpoint at ``version``: the ES state and θ of every older version still needed, and the loop state."""
    tree = {"state": es_update.state, "versions": {str(v): params_at(v) for v in loop["saved_versions"]}}
    checkpointer.save(version, tree, loop)


def restore(checkpointer: Checkpointer, fresh: ESUpdate, es_update: Callable[[Any], ESUpdate], max_lag: int,
            coordinator: Callable[[dict[str, Any]], Coordinator], engine: RolloutEngine, jobs: MemberJobs,
            evals: Evaluations) -> Restored:
    """The latest readable checkpoint: θ, ES state and loop state (see :func:`loop_state`). ``fresh``: the ES
    update of a new run (the shapes to read into); ``es_update``: an ES update from a restored state;
    ``coordinator``: a coordinator from its restored state."""

    def target(loop: dict[str, Any]) -> dict[str, Any]:
        params = fresh.state.params
        return {"state": fresh.state, "versions": {str(v): params for v in loop["saved_versions"]}}

    step, tree, loop = checkpointer.restore_latest(target)
    update = es_update(tree["state"])
    saved = {int(v): p for v, p in tree["versions"].items()}
    for v, p in saved.items():
        if v >= update.version - max_lag:
            update.keep_version(v, p)  # θ of a live older version
    coord = coordinator(loop["coordinator"])
    counters = LoopCounters.from_dict(loop)
    records = loop.get("metrics_records")
    jobs.restore(loop["jobs"], coord.in_flight_jobs())
    evals.restore(loop, lambda v: saved[v] if v in saved else update.params_at(v), counters.wall_time)
    for data in loop["episodes"]:
        engine.restore_episode(data)
    engine.free_rows = [int(r) for r in loop["free_rows"]]  # same row order as the original run
    return Restored(step, update, coord, counters, None if records is None else int(records))
