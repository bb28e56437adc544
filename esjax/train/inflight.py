"""Work in flight in the training loop: a member's job (its episodes' rewards so far) and an evaluation of the
unperturbed θ at one version. Both are plain data with symmetric ``to_dict`` / ``from_dict``, so a checkpoint's
loop state holds them exactly and a resume continues them where they were.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from esjax.loop.types import Job
from esjax.rundir.stats import eval_intervals, full_marks
from esjax.rundir.traces import TraceRecorder


@dataclasses.dataclass
class EvalProgress:
    """The progress of one greedy evaluation of the unperturbed θ at ``version`` on fixed held-out goals (a member
    job's is :class:`JobProgress`)."""

    eval_id: int
    version: int
    goals: list[int]
    started_tick: int
    started_wall: float
    next_position: int = 0
    rewards: dict[int, float] = dataclasses.field(default_factory=dict)
    retry: list[int] = dataclasses.field(default_factory=list)  # positions whose env failed: run again
    failures: int = 0
    # run.traces: eval: observation snippets of live episodes (by position) and finished episodes' trace lines
    recorder: TraceRecorder = dataclasses.field(default_factory=TraceRecorder)
    traces: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    invalid_actions: int | None = None  # generate mode: invalid actions of the finished episodes

    @property
    def complete(self) -> bool:
        return len(self.rewards) == len(self.goals)

    def record(self, wall_time: float, is_success: Callable[[float], bool] = full_marks) -> dict[str, Any]:
        """The ``eval`` record; ``is_success``: the task's rule for a won episode (``Task.is_success``)."""
        rewards = np.array([self.rewards[p] for p in range(len(self.goals))], np.float64)
        return {"kind": "eval", "version": self.version, "score": float(100 * rewards.mean()),
                "success_rate": float(np.mean([is_success(r) for r in rewards.tolist()])),
                "mean_reward": float(rewards.mean()),
                **eval_intervals(rewards.tolist(), is_success),  # 95%: t interval (score), Wilson (success rate)
                "goals": len(self.goals), "wall_time": wall_time, "eval_seconds": wall_time - self.started_wall,
                **({} if self.invalid_actions is None else {"invalid_actions": self.invalid_actions})}

    def to_dict(self) -> dict[str, Any]:
        out = {"eval_id": self.eval_id, "version": self.version, "started_tick": self.started_tick,
               "next_position": self.next_position, "rewards": {str(k): v for k, v in self.rewards.items()},
               "retry": list(self.retry), "failures": self.failures}
        if self.invalid_actions is not None:
            out["invalid_actions"] = self.invalid_actions
        if self.traces or self.recorder.observations:
            out["traces"] = {str(k): v for k, v in self.traces.items()}
            out["observations"] = {str(k): list(v) for k, v in self.recorder.observations.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], goals: list[int], started_wall: float) -> EvalProgress:
        """An evaluation in progress, from a checkpoint's loop state (:meth:`to_dict`)."""
        ev = cls(int(data["eval_id"]), int(data["version"]), goals, int(data["started_tick"]), started_wall,
                 int(data["next_position"]), {int(k): float(v) for k, v in data["rewards"].items()},
                 [int(p) for p in data.get("retry", [])], int(data.get("failures", 0)))
        ev.traces = {int(k): v for k, v in (data.get("traces") or {}).items()}
        if data.get("invalid_actions") is not None:
            ev.invalid_actions = int(data["invalid_actions"])
        ev.recorder.observations = {int(k): list(v) for k, v in (data.get("observations") or {}).items()}
        return ev


@dataclasses.dataclass
class JobProgress:
    """A member's rollout job: its episodes started, rewards in, and failed episodes to run again."""

    job: Job
    started_tick: int
    rewards: dict[int, float] = dataclasses.field(default_factory=dict)
    started: int = 0  # episodes started (positions 0..started-1)
    retry: list[int] = dataclasses.field(default_factory=list)  # positions whose env failed: run again
    failures: int = 0  # failed episodes so far (env exceptions / step timeouts)

    def to_dict(self) -> dict[str, Any]:
        return {"started_tick": self.started_tick, "started": self.started,
                "rewards": {str(k): v for k, v in self.rewards.items()}, "retry": list(self.retry),
                "failures": self.failures}

    @classmethod
    def from_dict(cls, data: dict[str, Any], job: Job) -> JobProgress:
        return cls(job, int(data["started_tick"]), {int(k): float(v) for k, v in data["rewards"].items()},
                   int(data["started"]), [int(p) for p in data.get("retry", [])], int(data.get("failures", 0)))


@dataclasses.dataclass
class SinceUpdate:
    """What the loop did since the last update (the next update record's throughput and utilization)."""

    ticks: int = 0
    rows: int = 0
    tokens: int = 0
    episodes: int = 0
    busy_ticks: float = 0.0  # Σ over ticks of the share of slots holding a job
    invalid_actions: int = 0  # generate mode: invalid actions of the training episodes finished


@dataclasses.dataclass
class LoopCounters:
    """The loop's counters and flags, as a checkpoint keeps them (a resumed run continues them)."""

    tick: int = 0
    since_update: SinceUpdate = dataclasses.field(default_factory=SinceUpdate)
    wall_time: float = 0.0  # seconds of run time before this process (the clock a resume continues)
    nonfinite_rejections: int = 0  # updates rejected because θ would turn non-finite
    constant_fitness_streak: int = 0  # the latest updates in a row whose cohort fitness was all equal
    stopped_at: int | None = None  # the version the run stopped at before run.updates, if it did
    finished: bool = False  # the run ended: everything left was cancelled and the end record written

    def to_dict(self) -> dict[str, Any]:
        since = dataclasses.asdict(self.since_update)
        return {**dataclasses.asdict(self), "busy_ticks": since.pop("busy_ticks"), "since_update": since}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoopCounters:
        since = data.get("since_update", {})
        return cls(int(data["tick"]),
                   SinceUpdate(int(since.get("ticks", 0)), int(since.get("rows", 0)), int(since.get("tokens", 0)),
                               int(since.get("episodes", 0)), float(data["busy_ticks"]),
                               int(since.get("invalid_actions", 0))),
                   float(data["wall_time"]), int(data.get("nonfinite_rejections", 0)),
                   int(data.get("constant_fitness_streak", 0)),
                   None if data.get("stopped_at") is None else int(data["stopped_at"]), bool(data.get("finished")))
