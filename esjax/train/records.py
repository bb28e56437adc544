"""What the training loop reports: metrics records (update, eval, event, end), health checks that turn into
``event`` records (flat cohorts, rejected non-finite updates, env faults) and the live progress display.

The loop calls it at named points — an update applied (:meth:`RunLog.update_applied`), an update rejected
(:meth:`RunLog.rejected`), an evaluation finished (:meth:`RunLog.eval_finished`), the run ended
(:meth:`RunLog.end`) — and it writes the records; it never changes the loop's course except by setting
``counters.stopped_at`` (too many flat cohorts) or raising :class:`RunAborted` (too many rejected updates).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from esjax.errors import UserError
from esjax.loop.types import UpdateRecord
from esjax.rundir.metrics import MetricsWriter, RecordCounter
from esjax.rundir.metrics_schema import SCHEMA_VERSION
from esjax.train.inflight import LoopCounters
from esjax.train.progress import Progress
from esjax.train.settings import LoopSettings


class RunAborted(UserError):
    """The run cannot go on (e.g. too many rejected non-finite updates); the last checkpoint is intact."""


class RunLog:
    """The run's records and health events. ``where()`` gives the loop's position: (t, tick, wall time)."""

    def __init__(self, settings: LoopSettings, where: Callable[[], tuple[int, int, float]]):
        self.settings = settings
        self.where = where
        self.writer: MetricsWriter | RecordCounter | None = None
        self.progress: Progress | None = None
        self.constant_fitness_updates = 0  # updates whose cohort fitness was all equal, in this process

    def attach(self, writer: MetricsWriter | RecordCounter, progress: Progress) -> None:
        """Where records go (the metrics file, or a counter on non-primary processes) and the live display."""
        self.writer, self.progress = writer, progress

    @property
    def count(self) -> int | None:
        """Records written so far (a checkpoint keeps it; a resume drops the records written after)."""
        return self.writer.count if self.writer is not None else None

    def write(self, record: dict[str, Any]) -> None:
        self.writer.write({**record, "schema_version": SCHEMA_VERSION})

    def event(self, event: str, version: int | None = None, **fields: Any) -> None:
        """An ``event`` record (env faults, rejected updates, flat cohorts); ``version`` defaults to t + 1: it
        belongs to the history leading to the next update."""
        t, tick, wall = self.where()
        self.write({"kind": "event", "event": event, "version": t + 1 if version is None else version,
                    "at_version": t, "tick": tick, "wall_time": wall, **fields})

    def update_applied(self, record: UpdateRecord, version: int, counters: LoopCounters, applied: dict[str, Any],
                       totals: dict[str, Any], since_wall: float) -> dict[str, Any]:
        """Version ``version`` exists: its update record (throughput since the update before, at ``since_wall``),
        the flat-cohort check and the progress line. ``applied``: the running totals of applied updates."""
        since = counters.since_update
        _, tick, now = self.where()
        ticks = max(since.ticks, 1)
        seconds = max(now - since_wall, 1e-9)
        # running totals of the applied updates (the open cohort left out), as the end record counts them;
        # the cohort's own lags are cohort_lag_hist (see esjax/rundir/metrics_schema.py)
        out = {"kind": "update", **record.summary(), **applied, "version": version,
               "wall_time": now, "tick": tick,
               "slot_utilization": since.busy_ticks / ticks, "rows_per_tick": since.rows / ticks,
               "episodes_per_s": since.episodes / seconds, "tokens_per_s": since.tokens / seconds,
               "seconds": now - since_wall,
               # rollout time (ticks) of each accepted member, in acceptance order: the measured
               # episode-duration distribution that experiments/wallclock.py feeds to the simulator
               "durations": [float(d) for d in record.cohort.durations],
               **({"invalid_actions": since.invalid_actions} if self.settings.generate else {})}
        self.write(out)
        self._check_constant_fitness(record.cohort.fitness, version, counters)
        self.progress.update(version, out, totals)
        return out

    def _check_constant_fitness(self, fitness: Sequence[float], version: int, counters: LoopCounters) -> None:
        """A cohort whose (finite) fitnesses are all equal gives a zero ES gradient (no learning signal). Each such
        update gets a ``constant_fitness`` event record (counted in summary.md); the first one in this process
        also prints a warning; ``run.max_constant_fitness_updates`` of them in a row end the run here."""
        values = np.asarray(fitness, np.float64)
        values = values[np.isfinite(values)]
        if len(values) >= 2 and values.max() > values.min():
            counters.constant_fitness_streak = 0
            return
        self.constant_fitness_updates += 1
        counters.constant_fitness_streak += 1
        value = float(values[0]) if len(values) else float("nan")
        self.event("constant_fitness", version, at_version=version - 1, fitness=value, members=len(values))
        if self.constant_fitness_updates == 1:
            print(f"warning: update {version}: every member of the cohort has fitness {value:.4g}, so the ES "
                  "gradient is zero: no learning signal from it (every episode scoring the same: too few or too easy / "
                  "hard tasks per member, σ too small to change any action, or env.max_steps too short); "
                  "further such updates are counted in summary.md", file=sys.stderr, flush=True)
        limit = self.settings.max_constant_fitness_updates
        if limit is not None and counters.constant_fitness_streak >= limit:
            counters.stopped_at = version
            reason = (f"{counters.constant_fitness_streak} updates in a row had a constant cohort fitness "
                      f"(run.max_constant_fitness_updates={limit})")
            self.event("stopped", version, reason=reason)
            print(f"stopping at version {version}: {reason}; the run ends with an evaluation and a checkpoint here",
                  file=sys.stderr, flush=True)

    def rejected(self, rejections: list[dict[str, Any]], counters: LoopCounters) -> None:
        """Updates the ES engine refused (θ would turn non-finite): θ and t were kept, the cohort dropped."""
        for rejection in rejections:
            counters.nonfinite_rejections += 1
            self.event("nonfinite_update", rejected=counters.nonfinite_rejections,
                       members=len(rejection["members"]), reason=rejection["reason"])
            limit = max(1, self.settings.max_nonfinite_updates)
            if counters.nonfinite_rejections >= limit:
                raise RunAborted(f"stopping: {counters.nonfinite_rejections} updates rejected because they would "
                                 f"make the parameters non-finite (run.max_nonfinite_updates={limit}); θ stays at "
                                 f"version {self.where()[0]}, the last checkpoint is intact")

    def eval_finished(self, record: dict[str, Any]) -> None:
        self.write(record)
        self.progress.eval(record)

    def end(self, totals: dict[str, Any], counters: LoopCounters) -> None:
        """The ``end`` record: the coordinator's final totals."""
        t, tick, wall = self.where()
        self.write({"kind": "end", **totals, "version": t, "tick": tick, "wall_time": wall,
                    "nonfinite_rejections": counters.nonfinite_rejections})
