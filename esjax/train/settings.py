"""The training loop's settings, resolved once from the run config into a small frozen object.

The loop reads these and nothing else of the config: what it does at each tick and version is decided by the
run length, the schedule's K and slots, episodes per member, the seed, when to evaluate and checkpoint, and the
health limits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from esjax.config import Config
from esjax.rundir.stats import full_marks
from esjax.task import task_class


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """What :class:`~esjax.train.trainer.Trainer` needs of a run config (see :meth:`from_config`)."""

    updates: int  # run.updates: the version the run ends at
    max_lag: int  # K: jobs dispatched before t − K are dropped, θ of t − K … t is kept
    slots: int  # member jobs in flight at once
    tasks_per_member: int  # episodes (goals) of each member
    seed: int  # the run's seed (evaluation sampling streams)
    schedule: str  # the schedule's kind (named when the loop stalls)
    eval_every: int
    checkpoint_every: int
    checkpoint_minutes: float | None  # a checkpoint at the end of a tick this often (single process only)
    traces: bool  # run.traces == 'eval': write every evaluation's episode traces
    generate: bool  # agent.mode == 'generate': records count invalid actions
    max_retries: int  # env.max_retries: re-runs of a failed episode per job / evaluation
    max_steps: int  # env.max_steps (trace lines)
    max_constant_fitness_updates: int | None
    max_nonfinite_updates: int
    is_success: Callable[[float], bool] = full_marks  # the task's won-episode rule (Task.is_success): eval records

    @classmethod
    def from_config(cls, config: Config, process_count: int = 1) -> LoopSettings:
        """The loop's settings of ``config``; ``run.checkpoint_minutes`` applies to single-process runs only (the
        processes of a job would not agree on the tick)."""
        run, env = config.run, config.env
        return cls(updates=run.updates, max_lag=config.schedule.max_lag, slots=config.schedule.slots,
                   tasks_per_member=env.tasks_per_member, seed=run.seed, schedule=config.schedule.kind,
                   eval_every=run.eval_every, checkpoint_every=run.checkpoint_every,
                   checkpoint_minutes=run.checkpoint_minutes if process_count == 1 else None,
                   traces=run.traces == "eval", generate=config.agent.mode == "generate",
                   max_retries=env.max_retries, max_steps=env.max_steps,
                   max_constant_fitness_updates=run.max_constant_fitness_updates,
                   max_nonfinite_updates=run.max_nonfinite_updates,
                   is_success=task_class(env.task).is_success)
