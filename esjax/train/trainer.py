"""The training loop behind ``python -m esjax.run``: :meth:`Trainer.run` is the algorithm, step by step.

One tick of the loop: refill free rollout slots with jobs from the coordinator (the schedule decides at
which versions), let every live episode act (one batched policy call per live version), roll finished
episodes up into member fitness, and report every finished member to the coordinator, which accepts
(lag ≤ K), holds or discards them. Then, one at a time, each complete cohort comes back from the
coordinator, the jitted ES update is applied to θ_t, the version advances, and that version gets its own
update record, evaluation and checkpoint when the config asks for them (a cascade of updates in one tick
is several such steps). Evaluations of the unperturbed θ run as extra greedy rows in the same ticks, so
they never stop training rollouts.

The tick loop is deterministic: a run is bit-identical when repeated, and a resumed run is bit-identical
to an uninterrupted one. A checkpoint is taken only at a consistent point — every finished job of the
tick reported, θ and the coordinator at the same version (a cascade's next complete cohort is part of the
coordinator's state) — and holds θ of every version an in-flight episode needs, the coordinator's state
(accepted-but-not-applied fitness, held results, counters), each in-flight episode's trace (replayed on
resume without calling the model), evaluations in progress, and how many metrics records were written:
a resume drops the records written after it and writes them again, so ``metrics.jsonl`` has exactly one
record per (kind, version). When the run ends, every job still in flight, every held result and an
unapplied cohort is cancelled (``dispatched == accepted + discarded + cancelled``), an ``end`` record
carries the coordinator's final totals, and the last checkpoint is re-saved as finished: resuming a
finished run changes nothing.

This module is the algorithm and its training jobs (their episodes and retries). What it calls at named points
lives beside it, one job each: the parts it is built from (:mod:`esjax.train.parts`, once) and the settings it
reads (:mod:`esjax.train.settings`, resolved once from the config), evaluations (:mod:`esjax.train.interleaved_eval`),
records and health events (:mod:`esjax.train.records`), checkpoints (:mod:`esjax.train.persistence`) and the
in-flight records (:mod:`esjax.train.inflight`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax

from esjax.config import Config
from esjax.loop.coordinator import RejectedUpdate, apply_cohorts
from esjax.loop.es_update import ESUpdate
from esjax.loop.rollout import Episode
from esjax.loop.types import Result, UpdateRecord
from esjax.rundir.checkpoint import Checkpointer
from esjax.rundir.metrics import MetricsWriter, RecordCounter
from esjax.train import persistence
from esjax.train.hooks import Hooks, Tick
from esjax.train.inflight import LoopCounters, SinceUpdate
from esjax.train.interleaved_eval import Evaluations
from esjax.train.jobs import MemberJobs
from esjax.train.parts import build_run_parts
from esjax.train.progress import Progress
from esjax.train.records import RunAborted, RunLog
from esjax.train.settings import LoopSettings

__all__ = ["RunAborted", "Trainer"]


class Trainer:
    """Owns one run: its parts, its loop state and its run directory. :meth:`run` is the algorithm.

    ``hooks`` (:class:`~esjax.train.hooks.Hooks`) run at the loop's named points after the trainer's own:
    evaluations, checkpoints and the progress line (:meth:`_own_hooks`).
    """

    def __init__(self, config: Config, run_dir: Path, hooks: Hooks | None = None):
        self.settings = LoopSettings.from_config(config, jax.process_count())  # the config is not read again
        self.parts = build_run_parts(config)
        self.run_dir = run_dir
        self.engine = self.parts.engine
        self.K = self.settings.max_lag
        self.es_update: ESUpdate | None = None
        self.coord = None
        self.counters = LoopCounters()
        self.log = RunLog(self.settings, lambda: (self.version, self.counters.tick, self.wall_time()))
        self.jobs = MemberJobs(self.parts.train_goals, self.settings.tasks_per_member, self.settings.max_retries,
                               self.log)
        primary = jax.process_index() == 0  # writes the run directory's files in a multi-process job
        self.evals = Evaluations(self.parts.eval_goals, self.settings, self.log,
                                 run_dir / "traces" if primary else None, self.wall_time)
        self.last_update_wall = 0.0
        self.checkpointer: Checkpointer | None = None
        self._stop_requested = False  # Ctrl-C / SIGTERM (esjax.train.session): checkpoint at the end of the tick
        self._saved_at = 0.0  # wall time of the last checkpoint (run.checkpoint_minutes)
        self._wall_start = time.perf_counter()
        self.hooks = self._own_hooks().extend(hooks)

    def _own_hooks(self) -> Hooks:
        """What the trainer itself hangs on the loop: evaluations see every tick's pages and their own episodes and
        start at due versions; a checkpoint follows at due versions; the progress line shows the phase."""
        hooks = Hooks()
        hooks.on_tick(lambda trainer, tick: self.evals.observe(self.engine, tick.finished))
        hooks.on_tick(lambda trainer, tick: self.log.progress.phase(self.phase()))
        hooks.on_episode_end(self._evaluation_episode_done)
        hooks.on_version(self._evaluate_when_due)
        hooks.on_version(self._checkpoint_when_due)
        return hooks

    # ----------------------------------------------------------------------------------------- the algorithm
    def run(self, writer: MetricsWriter | RecordCounter, checkpointer: Checkpointer, progress: Progress) -> None:
        """Bounded-staleness asynchronous ES, one tick at a time, until version ``run.updates``:

        1. **dispatch**: fill free rollout rows — evaluation episodes first, then member jobs at the versions
           the schedule picks (jobs dispatched before t − K can no longer count and are dropped);
        2. **step**: every live episode acts (one batched policy call per live version) and its env steps;
        3. **report**: a member whose episodes all finished reports its fitness; the coordinator **accepts**
           it (lag t − v ≤ K), holds it or discards it;
        4. **update**: each complete **cohort** the coordinator hands back is applied to θ_t — every member's
           own noise, stale or not, with no correction — and the **version** advances to t + 1, which may be
           evaluated and checkpointed.
        """
        self._begin(writer, checkpointer, progress)
        if self.counters.finished:
            return
        self._apply_complete_cohorts()  # a checkpoint taken inside a cascade holds the next complete cohort
        while self.version < self.last_version or self.evals or self.jobs:
            self._dispatch()
            finished = self._step()
            if finished is None:  # nothing live and nothing left to run
                break
            for result in self._member_results(finished):
                self.coord.report(result)
            self._apply_complete_cohorts()
            self._end_of_tick()
        self._finish_run()

    def _end_of_tick(self) -> None:
        """The end of a tick is a consistent point (every finished job reported, every complete cohort applied):
        checkpoint here when a stop was asked for (then stop) or ``run.checkpoint_minutes`` have passed."""
        minutes = self.settings.checkpoint_minutes
        due = minutes is not None and self.wall_time() - self._saved_at >= 60 * minutes
        if self._stop_requested or due:
            self._save()
        if self._stop_requested:
            raise KeyboardInterrupt("stop requested")

    def _apply_complete_cohorts(self) -> None:
        """θ_{t+1} = ES step of θ_t over each complete cohort, one at a time (a cascade is several steps), each new
        version announced to the hooks before the next cohort is applied."""
        apply_cohorts(self.coord, self.es_update, until=lambda: self.last_version, on_version=self._new_version,
                      on_reject=self._rejected)

    def _rejected(self, err: RejectedUpdate) -> None:
        """θ_t and the optimizer state are unchanged; t stays."""
        rejections, self.coord.rejections = self.coord.rejections, []
        self.log.rejected(rejections, self.counters)

    def _begin(self, writer: MetricsWriter | RecordCounter, checkpointer: Checkpointer, progress: Progress) -> None:
        self.log.attach(writer, progress)
        self.checkpointer = checkpointer
        self._wall_start = time.perf_counter()
        self.last_update_wall = self._saved_at = self.wall_time()
        counters = self.counters
        if counters.finished and self.version < self.settings.updates:  # resumed with a larger run.updates,
            counters.finished, counters.stopped_at, counters.constant_fitness_streak = False, None, 0  # or stopped
        if not counters.finished and self.version == 0 and not self.evals.evaluated:
            self.evals.start(0, self.params_at, self.counters.tick)

    def _dispatch(self) -> None:
        """Drop jobs that can no longer be accepted, then start episodes: evaluation rows first (they are few and
        fixed), then training jobs at the versions the schedule picks."""
        self._abandon_hopeless()
        self.evals.dispatch(self.engine)
        if self.version < self.last_version:
            self.jobs.add(self.coord.next_jobs(self.settings.slots - len(self.jobs)), self.counters.tick)
        self.jobs.dispatch(self.engine)

    def _step(self) -> list[Episode] | None:
        """One tick: every live episode acts; returns the episodes that ended (None when nothing is live and the
        run has nothing left to do)."""
        if not self.engine.live:
            if self.version >= self.last_version and not self.evals:
                return None
            raise RuntimeError(f"the loop stalled at version {self.version}: no episode is live "
                               f"(schedule {self.settings.schedule!r}, {len(self.jobs)} jobs)")
        since = self.counters.since_update
        since.busy_ticks += len(self.jobs) / self.settings.slots
        finished, stats = self.engine.tick(self.params_at)
        self.counters.tick += 1
        since.ticks += 1
        since.rows += stats.rows
        since.tokens += stats.tokens
        self.hooks.ticked(self, Tick(self.counters.tick, self.version, finished, stats))
        return finished

    def _member_results(self, finished: list[Episode]) -> list[Result]:
        """Roll the tick's finished episodes up: evaluation rewards, retries of failed episodes, and the fitness
        of every member whose episodes are all in (in job order, all before any update is applied)."""
        done_jobs: list[int] = []
        for episode in finished:
            self._episode_done(episode, done_jobs)
        return self.jobs.results(done_jobs, self.counters.tick)

    def _new_version(self, record: UpdateRecord) -> None:
        """Version t + 1 exists: write its update record, stop the jobs it leaves hopeless, then the hooks (the
        trainer's own evaluate and checkpoint it when due)."""
        version = record.version + 1
        if version != self.version or version != self.es_update.version:
            raise RuntimeError(f"update record for version {version}, but the coordinator is at {self.version} "
                               f"and θ at {self.es_update.version}")
        out = self.log.update_applied(record, version, self.counters, self.coord.applied_totals(),
                                      self.coord.totals(), self.last_update_wall)
        self.counters.since_update = SinceUpdate()
        self.last_update_wall = out["wall_time"]
        # Jobs dispatched before t - K can no longer be accepted (and θ of their version is no longer kept):
        # stop them at every version, checkpointed or not, so checkpoints never change the run.
        self._abandon_hopeless()
        self.hooks.versioned(self, record)

    def _evaluation_episode_done(self, trainer: Trainer, episode: Episode) -> None:
        if episode.kind == "eval":
            self.evals.episode_done(episode)

    def _evaluate_when_due(self, trainer: Trainer, record: UpdateRecord) -> None:
        version = record.version + 1
        if version % self.settings.eval_every == 0 or version == self.last_version:
            self.evals.start(version, self.params_at, self.counters.tick)

    def _checkpoint_when_due(self, trainer: Trainer, record: UpdateRecord) -> None:
        version = record.version + 1
        if version % self.settings.checkpoint_every == 0 or version == self.last_version:
            self._save()

    def _abandon_hopeless(self) -> None:
        """Jobs older than t − K can never be accepted: stop them now instead of finishing wasted work
        (discarded as 'abandoned'). Once the last update is applied, every job is cancelled."""
        done, floor = self.version >= self.last_version, self.version - self.K
        stopped = self.jobs.take(lambda jp: done or jp.job.member.version < floor)
        ids = {jid for jid, _ in stopped}
        if stopped:
            self.engine.stop(lambda e: e.kind == "train" and e.owner in ids)
        for jid, jp in stopped:
            (self.coord.cancel if done else self.coord.abandon)(jid, float(self.counters.tick - jp.started_tick))

    def _finish_run(self) -> None:
        """Cancel what is left, write the end record with the coordinator's final totals and re-save the last
        checkpoint as finished (a resume of a finished run then has nothing to do)."""
        if self.counters.finished:
            return
        self.log.end(self.coord.close(), self.counters)
        self.counters.finished = True
        self._save()

    # ----------------------------------------------------------------------------------------- training jobs
    def _episode_done(self, episode: Episode, done_jobs: list[int]) -> None:
        if episode.failure is not None:
            self._episode_failed(episode)
            return
        self.hooks.episode_ended(self, episode)
        if episode.kind == "train" and self.jobs.episode_done(episode, self.counters.since_update):
            done_jobs.append(episode.owner)

    def _episode_failed(self, episode: Episode) -> None:
        """The env raised or hung in this episode: re-run it (same member, goal and sampling stream) up to
        ``env.max_retries`` times per job, then drop the job (counted by the coordinator as abandoned)."""
        fields = {"owner_kind": episode.kind, "member": [episode.version, episode.index],
                  "position": episode.position, "goal": episode.goal, "step": episode.steps,
                  "reason": episode.failure}
        if episode.kind == "eval":
            self.evals.episode_failed(episode, fields)
        elif (jp := self.jobs.episode_failed(episode, fields)) is not None:  # dropped: counted as abandoned
            self.engine.stop(lambda e: e.kind == "train" and e.owner == episode.owner)
            self.coord.abandon(episode.owner, float(self.counters.tick - jp.started_tick))

    # ----------------------------------------------------------------------------------------- public view
    @property
    def version(self) -> int:
        return self.coord.version

    @property
    def last_version(self) -> int:
        """The version the run ends at: run.updates, or where it stopped early."""
        stopped = self.counters.stopped_at
        return self.settings.updates if stopped is None else stopped

    @property
    def params(self) -> Any:
        """θ now."""
        return self.es_update.state.params

    @property
    def mesh(self):
        """The device mesh θ is sharded over (None on one device)."""
        return self.parts.mesh

    def params_at(self, version: int) -> Any:
        if version in self.evals.params:
            return self.evals.params[version]
        return self.es_update.params_at(version)

    def wall_time(self) -> float:
        return self.counters.wall_time + time.perf_counter() - self._wall_start

    def totals(self) -> dict[str, Any]:
        """The coordinator's totals (dispatched, accepted, discarded, …)."""
        return self.coord.totals()

    def phase(self) -> str:
        """What the loop is waiting for, for the live progress line."""
        parts = []
        if self.version < self.last_version:
            parts.append(f"update {self.version + 1}: {self.coord.cohort_size()}/{self.coord.population} "
                         "members in")
        return " · ".join(parts + self.evals.phase()) or "finishing"

    def request_stop(self) -> bool:
        """Ask the loop to checkpoint at the end of this tick and stop; False when a stop was already asked."""
        asked, self._stop_requested = self._stop_requested, True
        return not asked

    def close(self) -> None:
        """Release the env pool's workers (processes or Ray actors); the trainer is not used afterwards."""
        self.parts.close()

    # ----------------------------------------------------------------------------------------- state
    def fresh(self) -> None:
        """A new run: θ_0 is the policy's parameters."""
        self.es_update = self.parts.es_update(self.parts.initial_state(), self.K + 1)
        self.coord = self.parts.new_coordinator()

    def _save(self) -> None:
        """A checkpoint at the current version (only at consistent points, see :mod:`esjax.train.persistence`)."""
        saved = persistence.needed_versions(self.version, self.K, self.engine, self.coord, self.evals)
        loop = persistence.loop_state(self.counters, self.wall_time(), self.coord, saved, self.engine, self.jobs,
                                      self.evals, self.log.count)
        persistence.save(self.checkpointer, self.version, self.es_update, self.params_at, loop)
        self._saved_at = self.wall_time()

    def restore(self, checkpointer: Checkpointer) -> tuple[int, int | None]:
        """Continue from the latest readable checkpoint; returns its version and how many metrics records to keep
        (None: a checkpoint from before record counting; a finished run extended redoes its end record)."""
        self.fresh()
        state = persistence.restore(checkpointer, self.es_update, lambda s: self.parts.es_update(s, self.K + 1), self.K,
                                    self.parts.new_coordinator, self.engine, self.jobs, self.evals)
        self.es_update, self.coord, self.counters = state.es_update, state.coord, state.counters
        records = state.records
        if records is not None and self.counters.finished and self.version < self.settings.updates:
            records -= 1  # a finished run extended: its end record (the last before that save) is redone
        return state.step, records
