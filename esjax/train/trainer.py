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

This module (~530 lines) is the loop and the bookkeeping of its episodes (retries of failed ones, evaluation
rows and their traces), which read and write the same loop state; what does not — building the parts, the run
directory, the in-flight records and their serialisation — lives in :mod:`esjax.train.parts`,
:mod:`esjax.rundir.directory` and :mod:`esjax.train.inflight`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from esjax.config import Config, ConfigError
from esjax.errors import UserError
from esjax.es.step import ESState
from esjax.loop.coordinator import Coordinator, RejectedUpdate
from esjax.loop.engine import ESUpdate
from esjax.loop.rollout import Episode, RolloutEngine
from esjax.loop.tasks import hash_ints
from esjax.loop.types import Result, UpdateRecord
from esjax.model.sharding import put_global
from esjax.rundir.checkpoint import Checkpointer
from esjax.rundir.metrics import MetricsWriter, RecordCounter
from esjax.rundir.metrics_schema import SCHEMA_VERSION
from esjax.rundir.traces import write_traces
from esjax.train.inflight import Evaluation, JobProgress, LoopCounters, SinceUpdate
from esjax.train.parts import (
    build_agent,
    build_coordinator,
    build_engine,
    build_es_config,
    build_policy,
    build_pool,
    build_shop,
    held_out_goals,
)
from esjax.train.progress import Progress

if TYPE_CHECKING:
    from esjax.loop.generate import GenerateEngine


class RunAborted(UserError):
    """The run cannot go on (e.g. too many rejected non-finite updates); the last checkpoint is intact."""


class Trainer:
    """Owns one run: its parts, its loop state and its run directory. :meth:`run` is the algorithm."""

    def __init__(self, config: Config, run_dir: Path):
        self.config = config
        self.run_dir = run_dir
        self.shop = build_shop(config)
        self.train_goals = list(self.shop.split("train"))
        self.eval_goals = held_out_goals(config, self.shop, quiet=jax.process_index() != 0)
        if not self.train_goals:
            raise ConfigError("env: the shop has no train goals")
        if not self.eval_goals:
            raise ConfigError(f"env.eval_split: the shop has no {config.env.eval_split!r} goals")
        self.policy = build_policy(config, self.shop)
        self.agent = build_agent(config, self.policy)
        self.es_config = build_es_config(config)
        self.K = config.schedule.max_lag
        self.traces = config.run.traces == "eval"  # write every evaluation's episode traces
        capacity = config.schedule.slots * config.env.tasks_per_member + len(self.eval_goals)
        self.pool = build_pool(config, self.shop, capacity)  # env.pool: in this process, worker processes or Ray
        self.engine: RolloutEngine | GenerateEngine = build_engine(config, self.pool, self.agent, self.policy,
                                                                   self.es_config)
        self.generate = config.agent.mode == "generate"  # update and eval records count invalid actions
        self.primary = jax.process_index() == 0  # writes the run directory's files in a multi-process job
        self.mesh = None
        self.sharded = None
        if len(jax.devices()) > 1:  # shard θ and its update over ('data', 'model'), all processes' devices
            from esjax.model.sharding import mesh_from_config
            from esjax.parallel.sharded import ShardedES

            self.mesh = mesh_from_config(config.mesh)
            self.sharded = ShardedES(self.es_config, self.policy.config, self.mesh)
        self.es_update: ESUpdate | None = None
        self.coord: Coordinator | None = None
        self.jobs: dict[int, JobProgress] = {}
        self.evals: dict[int, Evaluation] = {}
        self.eval_params: dict[int, Any] = {}  # θ of each version under evaluation (kept past t − K)
        self.evaluated_versions: set[int] = set()
        self.next_eval_id = 0
        self.counters = LoopCounters()
        self.constant_fitness_updates = 0  # updates whose cohort fitness was all equal, in this process
        self.last_update_wall = 0.0
        self.restored_records: int | None = None  # metrics records a restored checkpoint had seen written
        self.writer: MetricsWriter | RecordCounter | None = None
        self.checkpointer: Checkpointer | None = None
        self._progress: Progress | None = None
        # Set by a signal (Ctrl-C / SIGTERM, see esjax.train.session): checkpoint at the end of this tick, then stop.
        self.stop_requested = False
        self._saved_at = 0.0  # wall time of the last checkpoint (run.checkpoint_minutes)
        # run.checkpoint_minutes: single-process runs only (the processes of a job would not agree on the tick)
        self._checkpoint_minutes = config.run.checkpoint_minutes if jax.process_count() == 1 else None

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
        minutes = self._checkpoint_minutes
        due = minutes is not None and self.wall_time() - self._saved_at >= 60 * minutes
        if self.stop_requested or due:
            self._save()
        if self.stop_requested:
            raise KeyboardInterrupt("stop requested")

    def _apply_complete_cohorts(self) -> None:
        """θ_{t+1} = ES step of θ_t over each complete cohort, one at a time (a cascade is several steps)."""
        while self.version < self.last_version and (cohort := self.coord.complete_cohort()) is not None:
            try:
                metrics = self.es_update(cohort)
            except RejectedUpdate as err:  # θ_t and the optimizer state are unchanged; t stays
                self.coord.reject(str(err))
                self._drain_rejections()
                continue
            self._new_version(self.coord.advance(metrics))

    def _begin(self, writer: MetricsWriter | RecordCounter, checkpointer: Checkpointer, progress: Progress) -> None:
        self.writer, self.checkpointer, self._progress = writer, checkpointer, progress
        self._wall_start = time.perf_counter()
        self.last_update_wall = self._saved_at = self.wall_time()
        counters = self.counters
        if counters.finished and self.version < self.config.run.updates:  # resumed with a larger run.updates,
            counters.finished, counters.stopped_at, counters.constant_fitness_streak = False, None, 0  # or stopped
        if not counters.finished and self.version == 0 and not self.evaluated_versions:
            self._start_eval(0)

    def _dispatch(self) -> None:
        """Drop jobs that can no longer be accepted, then start episodes: evaluation rows first (they are few and
        fixed), then training jobs at the versions the schedule picks."""
        self._abandon_hopeless()
        for ev in self.evals.values():
            while (ev.retry or ev.next_position < len(ev.goals)) and self.engine.free:
                if ev.retry:
                    p = ev.retry.pop(0)
                else:
                    p = ev.next_position
                    ev.next_position += 1
                self.engine.start("eval", owner=ev.eval_id, version=ev.version, index=0, goal=ev.goals[p],
                                  position=p, sampling_seed=hash_ints(self.config.run.seed, 7919, ev.version),
                                  greedy=True)
        if self.version < self.last_version:
            free_slots = self.config.schedule.slots - len(self.jobs)
            for job in self.coord.next_jobs(free_slots):
                self.jobs[job.job_id] = JobProgress(job, self.counters.tick)
        per_member = self.config.env.tasks_per_member
        for jp in sorted(self.jobs.values(), key=lambda j: j.job.job_id):
            while (jp.retry or jp.started < per_member) and self.engine.free:
                if jp.retry:  # the same member, goal and sampling stream: a deterministic re-run
                    p = jp.retry.pop(0)
                else:
                    p = jp.started
                    jp.started += 1
                member = jp.job.member
                self.engine.start("train", owner=jp.job.job_id, version=member.version, index=member.index,
                                  goal=self.train_goals[jp.job.tasks.goals[p] % len(self.train_goals)], position=p,
                                  sampling_seed=jp.job.tasks.sampling_seed, greedy=False)

    def _step(self) -> list[Episode] | None:
        """One tick: every live episode acts; returns the episodes that ended (None when nothing is live and the
        run has nothing left to do)."""
        if not self.engine.live:
            if self.version >= self.last_version and not self.evals:
                return None
            raise RuntimeError(f"the loop stalled at version {self.version}: no episode is live "
                               f"(schedule {self.config.schedule.kind!r}, {len(self.jobs)} jobs)")
        since = self.counters.since_update
        since.busy_ticks += len(self.jobs) / self.config.schedule.slots
        finished, stats = self.engine.tick(self.params_at)
        if self.traces and self.evals:
            self._observe_evals(finished)
        self.counters.tick += 1
        self._progress.phase(self._phase())
        since.ticks += 1
        since.rows += stats.rows
        since.tokens += stats.tokens
        return finished

    def _member_results(self, finished: list[Episode]) -> list[Result]:
        """Roll the tick's finished episodes up: evaluation rewards, retries of failed episodes, and the fitness
        of every member whose episodes are all in (in job order, all before any update is applied)."""
        done_jobs: list[int] = []
        for episode in finished:
            self._episode_done(episode, done_jobs)
        results = []
        for jid in sorted(done_jobs):
            jp = self.jobs.pop(jid, None)
            if jp is not None:
                fitness = float(np.mean([jp.rewards[p] for p in range(self.config.env.tasks_per_member)]))
                results.append(jp.job.result(fitness, float(self.counters.tick - jp.started_tick)))
        return results

    def _new_version(self, record: UpdateRecord) -> None:
        """Version t + 1 exists: write its update record, then evaluate and checkpoint it when due."""
        version = record.version + 1
        if version != self.version or version != self.es_update.version:
            raise RuntimeError(f"update record for version {version}, but the coordinator is at {self.version} "
                               f"and θ at {self.es_update.version}")
        out = self._update_record(record, version)
        self._write(out)
        self._check_constant_fitness(record.cohort.fitness, version)
        self._progress.update(version, out, self.coord.totals())
        self.counters.since_update = SinceUpdate()
        self.last_update_wall = out["wall_time"]
        # Jobs dispatched before t - K can no longer be accepted (and θ of their version is no longer kept):
        # stop them at every version, checkpointed or not, so checkpoints never change the run.
        self._abandon_hopeless()
        last = self.last_version
        if version % self.config.run.eval_every == 0 or version == last:
            self._start_eval(version)
        if version % self.config.run.checkpoint_every == 0 or version == last:
            self._save()

    # ----------------------------------------------------------------------------------------- parts of a step
    @property
    def version(self) -> int:
        return self.coord.version

    @property
    def last_version(self) -> int:
        """The version the run ends at: run.updates, or where it stopped early."""
        stopped = self.counters.stopped_at
        return self.config.run.updates if stopped is None else stopped

    def params_at(self, version: int) -> Any:
        if version in self.eval_params:
            return self.eval_params[version]
        return self.es_update.params_at(version)

    def wall_time(self) -> float:
        return self.counters.wall_time + time.perf_counter() - self._wall_start

    def _update_record(self, record: UpdateRecord, version: int) -> dict[str, Any]:
        since = self.counters.since_update
        now = self.wall_time()
        ticks = max(since.ticks, 1)
        seconds = max(now - self.last_update_wall, 1e-9)
        # running totals of the applied updates (the open cohort left out), as the end record counts them;
        # the cohort's own lags are cohort_lag_hist (see esjax/rundir/metrics_schema.py)
        return {"kind": "update", **record.summary(), **self.coord.applied_totals(), "version": version,
                "wall_time": now, "tick": self.counters.tick,
                "slot_utilization": since.busy_ticks / ticks, "rows_per_tick": since.rows / ticks,
                "episodes_per_s": since.episodes / seconds, "tokens_per_s": since.tokens / seconds,
                "seconds": now - self.last_update_wall,
                # rollout time (ticks) of each accepted member, in acceptance order: the measured
                # episode-duration distribution that experiments/wallclock.py feeds to the simulator
                "durations": [float(d) for d in record.cohort.durations],
                **({"invalid_actions": since.invalid_actions} if self.generate else {})}

    def _start_eval(self, version: int) -> None:
        if version in self.evaluated_versions:
            return
        self.evaluated_versions.add(version)
        self.eval_params[version] = self.params_at(version)
        ev = Evaluation(self.next_eval_id, version, self.eval_goals, self.counters.tick, self.wall_time(),
                        invalid_actions=0 if self.generate else None)
        self.evals[ev.eval_id] = ev
        self.next_eval_id += 1

    def _abandon_hopeless(self) -> None:
        """Jobs older than t − K can never be accepted: stop them now instead of finishing wasted work
        (discarded as 'abandoned'). Once the last update is applied, every job is cancelled."""
        done = self.version >= self.last_version
        floor = self.version - self.K
        stop = sorted(jid for jid, jp in self.jobs.items() if done or jp.job.member.version < floor)
        if not stop:
            return
        ids = set(stop)
        self.engine.stop(lambda e: e.kind == "train" and e.owner in ids)
        for jid in stop:
            jp = self.jobs.pop(jid)
            duration = float(self.counters.tick - jp.started_tick)
            if done:
                self.coord.cancel(jid, duration)
            else:
                self.coord.abandon(jid, duration)

    def _write(self, record: dict[str, Any]) -> None:
        self.writer.write({**record, "schema_version": SCHEMA_VERSION})

    def _event(self, event: str, version: int | None = None, **fields: Any) -> None:
        """An ``event`` record (env faults, rejected updates, flat cohorts); ``version`` defaults to t + 1: it
        belongs to the history leading to the next update."""
        self._write({"kind": "event", "event": event, "version": self.version + 1 if version is None else version,
                     "at_version": self.version, "tick": self.counters.tick, "wall_time": self.wall_time(),
                     **fields})

    def _check_constant_fitness(self, fitness: Sequence[float], version: int) -> None:
        """A cohort whose (finite) fitnesses are all equal gives a zero ES gradient (no learning signal). Each such
        update gets a ``constant_fitness`` event record (counted in summary.md); the first one in this process
        also prints a warning; ``run.max_constant_fitness_updates`` of them in a row end the run here."""
        values = np.asarray(fitness, np.float64)
        values = values[np.isfinite(values)]
        counters = self.counters
        if len(values) >= 2 and values.max() > values.min():
            counters.constant_fitness_streak = 0
            return
        self.constant_fitness_updates += 1
        counters.constant_fitness_streak += 1
        value = float(values[0]) if len(values) else float("nan")
        self._event("constant_fitness", version, at_version=version - 1, fitness=value, members=len(values))
        if self.constant_fitness_updates == 1:
            print(f"warning: update {version}: every member of the cohort has fitness {value:.4g}, so the ES "
                  "gradient is zero: no learning signal from it (every episode scoring the same: too few or too easy / "
                  "hard tasks per member, σ too small to change any action, or env.max_steps too short); "
                  "further such updates are counted in summary.md", file=sys.stderr, flush=True)
        limit = self.config.run.max_constant_fitness_updates
        if limit is not None and counters.constant_fitness_streak >= limit:
            counters.stopped_at = version
            reason = (f"{counters.constant_fitness_streak} updates in a row had a constant cohort fitness "
                      f"(run.max_constant_fitness_updates={limit})")
            self._event("stopped", version, reason=reason)
            print(f"stopping at version {version}: {reason}; the run ends with an evaluation and a checkpoint here",
                  file=sys.stderr, flush=True)

    def _drain_rejections(self) -> None:
        """Updates the ES engine refused (θ would turn non-finite): θ and t were kept, the cohort dropped."""
        rejections, self.coord.rejections = self.coord.rejections, []
        counters = self.counters
        for rejection in rejections:
            counters.nonfinite_rejections += 1
            self._event("nonfinite_update", rejected=counters.nonfinite_rejections,
                        members=len(rejection["members"]), reason=rejection["reason"])
            limit = max(1, self.config.run.max_nonfinite_updates)
            if counters.nonfinite_rejections >= limit:
                raise RunAborted(f"stopping: {counters.nonfinite_rejections} updates rejected because they would "
                                 f"make the parameters non-finite (run.max_nonfinite_updates={limit}); θ stays at "
                                 f"version {self.version}, the last checkpoint is intact")

    def _finish_run(self) -> None:
        """Cancel what is left, write the end record with the coordinator's final totals and re-save the last
        checkpoint as finished (a resume of a finished run then has nothing to do)."""
        if self.counters.finished:
            return
        totals = self.coord.close()
        self._write({"kind": "end", **totals, "version": self.version, "tick": self.counters.tick,
                     "wall_time": self.wall_time(), "nonfinite_rejections": self.counters.nonfinite_rejections})
        self.counters.finished = True
        self._save()

    def close(self) -> None:
        """Release the env pool's workers (processes or Ray actors); the trainer is not used afterwards."""
        self.pool.close()

    def _phase(self) -> str:
        """What the loop is waiting for, for the live progress line."""
        parts = []
        if self.version < self.last_version:
            parts.append(f"update {self.version + 1}: {self.coord.cohort_size()}/{self.coord.population} "
                         "members in")
        parts += [f"eval v{ev.version} {len(ev.rewards)}/{len(ev.goals)} goals" for ev in self.evals.values()]
        return " · ".join(parts) or "finishing"

    # ----------------------------------------------------------------------------------------- episodes
    def _episode_done(self, episode: Episode, done_jobs: list[int]) -> None:
        if episode.failure is not None:
            self._episode_failed(episode)
            if episode.kind == "eval":
                ev = self.evals[episode.owner]
                if episode.position in ev.rewards:  # past the retry limit: scored 0, traced with its failure
                    self._trace_eval(ev, episode)
                else:  # run again from the start
                    ev.recorder.forget(episode.position)
                self._maybe_finish_eval(ev)
            return
        invalid = getattr(episode, "invalid_actions", 0)  # generate mode
        if episode.kind == "eval":
            ev = self.evals[episode.owner]
            ev.rewards[episode.position] = episode.reward
            if ev.invalid_actions is not None:
                ev.invalid_actions += invalid
            self._trace_eval(ev, episode)
            self._maybe_finish_eval(ev)
            return
        jp = self.jobs.get(episode.owner)
        if jp is None:
            return
        self.counters.since_update.episodes += 1
        self.counters.since_update.invalid_actions += invalid
        jp.rewards[episode.position] = episode.reward
        if len(jp.rewards) == self.config.env.tasks_per_member:
            done_jobs.append(episode.owner)

    def _episode_failed(self, episode: Episode) -> None:
        """The env raised or hung in this episode: re-run it (same member, goal and sampling stream) up to
        ``env.max_retries`` times per job, then drop the job (counted by the coordinator as abandoned)."""
        retries = self.config.env.max_retries
        fields = {"owner_kind": episode.kind, "member": [episode.version, episode.index],
                  "position": episode.position, "goal": episode.goal, "step": episode.steps,
                  "reason": episode.failure}
        if episode.kind == "eval":
            ev = self.evals[episode.owner]
            ev.failures += 1
            if ev.failures <= retries:
                ev.retry.append(episode.position)
                self._event("env_fault", action="retry", **fields)
            else:  # an evaluation episode past the retry limit scores 0
                ev.rewards[episode.position] = 0.0
                self._event("env_fault", action="scored_zero", **fields)
            return
        jp = self.jobs.get(episode.owner)
        if jp is None:
            return
        jp.failures += 1
        if jp.failures <= retries:
            jp.retry.append(episode.position)
            self._event("env_fault", action="retry", **fields)
            return
        self._event("env_fault", action="drop_job", **fields)
        self.engine.stop(lambda e: e.kind == "train" and e.owner == episode.owner)
        self.jobs.pop(episode.owner)
        self.coord.abandon(episode.owner, float(self.counters.tick - jp.started_tick))

    def _observe_evals(self, finished: list[Episode]) -> None:
        """run.traces: the page each evaluation episode's latest action led to (a snippet), after every tick."""
        for episode in (*self.engine.live.values(), *finished):
            if episode.kind == "eval" and episode.owner in self.evals:
                self.evals[episode.owner].recorder.observe(episode.position, episode)

    def _trace_eval(self, ev: Evaluation, episode: Episode) -> None:
        if self.traces:
            ev.traces[episode.position] = ev.recorder.line(
                episode.position, episode, ev.rewards[episode.position], self.config.env.max_steps,
                version=ev.version, position=episode.position)

    def _maybe_finish_eval(self, ev: Evaluation) -> None:
        if ev.complete:
            # written before the record: a record in metrics.jsonl means its traces exist
            if self.traces and self.primary:
                write_traces(self.run_dir / "traces" / f"eval-v{ev.version}.jsonl",
                             (ev.traces[p] for p in sorted(ev.traces)))
            record = ev.record(self.wall_time())
            self._write(record)
            self.evals.pop(ev.eval_id)
            if not any(e.version == ev.version for e in self.evals.values()):
                self.eval_params.pop(ev.version, None)
            self._progress.eval(record)

    # ----------------------------------------------------------------------------------------- state
    def _es_update(self, state: ESState) -> ESUpdate:
        """The ES update the loop applies to each complete cohort: on a multi-device mesh, the sharded
        program (θ stays sharded)."""
        update_fn = None
        if self.sharded is not None:
            state = self.sharded.place(state)
            update_fn = self.sharded.update_fn
        return ESUpdate(self.es_config, state=state, keep=self.K + 1, update_fn=update_fn)

    def fresh(self) -> None:
        from esjax.es.step import init

        params = self.policy.params
        if self.sharded is not None:
            params = put_global(params, self.sharded.shardings.params)
        self.es_update = self._es_update(init(self.es_config, params))
        self.coord = build_coordinator(self.config, len(self.train_goals))

    def _needed_versions(self) -> list[int]:
        versions = {e.version for e in self.engine.live.values()}
        versions |= {v for v in self.coord.live_versions() if v <= self.version}
        # θ older than t - K is no longer kept and nothing dispatched there can still be accepted (at the end of a
        # run the coordinator still lists such jobs as in flight); evaluations keep their own copy of θ.
        versions = {v for v in versions if v >= self.version - self.K}
        versions |= {ev.version for ev in self.evals.values()}
        return sorted(v for v in versions if v != self.version)

    def _save(self) -> None:
        """A checkpoint at the current version (only called at consistent points, see the module docstring):
        the ES state and θ of every older version still needed (the array tree), and the loop state (JSON)."""
        loop = self.loop_state()
        tree = {"state": self.es_update.state, "versions": {str(v): self.params_at(v) for v in loop["saved_versions"]}}
        self.checkpointer.save(self.version, tree, loop)
        self._saved_at = self.wall_time()

    def loop_state(self) -> dict[str, Any]:
        """Everything but arrays that a resume needs; :meth:`restore` reads exactly this back."""
        return {**self.counters.to_dict(), "wall_time": self.wall_time(),
                "coordinator": self.coord.state_dict(), "saved_versions": self._needed_versions(),
                "episodes": self.engine.checkpoint_episodes(),
                "free_rows": list(self.engine.free_rows),
                "jobs": {str(jid): jp.to_dict() for jid, jp in sorted(self.jobs.items())},
                "evals": [ev.to_dict() for ev in self.evals.values()],
                "evaluated_versions": sorted(self.evaluated_versions), "next_eval_id": self.next_eval_id,
                "metrics_records": self.writer.count if self.writer is not None else None}

    def restore(self, checkpointer: Checkpointer) -> int:
        """The latest readable checkpoint's θ, ES state and loop state (see :meth:`loop_state`); returns its
        version."""
        self.fresh()

        def target(loop: dict[str, Any]) -> dict[str, Any]:
            params = self.es_update.state.params
            return {"state": self.es_update.state, "versions": {str(v): params for v in loop["saved_versions"]}}

        step, tree, loop = checkpointer.restore_latest(target)
        self.es_update = self._es_update(tree["state"])
        saved = {int(v): p for v, p in tree["versions"].items()}
        for v, p in saved.items():
            if v >= self.es_update.version - self.K:
                self.es_update.keep_version(v, p)  # θ of a live older version
        self.coord = build_coordinator(self.config, len(self.train_goals), loop["coordinator"])
        self.counters = LoopCounters.from_dict(loop)
        records = loop.get("metrics_records")
        self.restored_records = None if records is None else int(records)
        self.evaluated_versions = set(loop["evaluated_versions"])
        self.next_eval_id = int(loop["next_eval_id"])
        jobs_by_id = {job.job_id: job for job in self.coord.in_flight_jobs()}
        self.jobs = {int(jid): JobProgress.from_dict(data, jobs_by_id[int(jid)]) for jid, data in loop["jobs"].items()}
        for data in loop["evals"]:
            version = int(data["version"])
            self.eval_params[version] = saved[version] if version in saved else self.es_update.params_at(version)
            ev = Evaluation.from_dict(data, self.eval_goals, self.counters.wall_time)
            self.evals[ev.eval_id] = ev
        for data in loop["episodes"]:
            self.engine.restore_episode(data)
        self.engine.free_rows = [int(r) for r in loop["free_rows"]]  # same row order as the original run
        return step
