"""Evaluations of the unperturbed θ during training: greedy episodes on fixed held-out goals, run as extra rows of
the same ticks as training (so they never stop training rollouts).

The loop calls :class:`Evaluations` at named points: a version to evaluate (:meth:`~Evaluations.start`), free rows
to fill (:meth:`~Evaluations.dispatch`), a tick done (:meth:`~Evaluations.observe`), an evaluation episode ended or
failed (:meth:`~Evaluations.episode_done`, :meth:`~Evaluations.episode_failed`). A finished evaluation writes its
traces, then its ``eval`` record (a record in metrics.jsonl means its traces exist).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from esjax.loop.rollout import Episode, RolloutEngine
from esjax.loop.tasks import hash_ints
from esjax.rundir.traces import write_traces
from esjax.train.inflight import EvalProgress
from esjax.train.records import RunLog
from esjax.train.settings import LoopSettings


class Evaluations:
    """The evaluations in progress, θ of each version under evaluation, and which versions were evaluated.

    ``traces_dir``: where this process writes the traces files (None: another process writes them).
    """

    def __init__(self, goals: list[int], settings: LoopSettings, log: RunLog, traces_dir: Path | None,
                 clock: Callable[[], float]):
        self.goals = goals
        self.settings = settings
        self.log = log
        self.traces_dir = traces_dir
        self.clock = clock
        self.running: dict[int, EvalProgress] = {}
        self.params: dict[int, Any] = {}  # θ of each version under evaluation (kept past t − K)
        self.evaluated: set[int] = set()
        self.next_id = 0

    def __bool__(self) -> bool:
        return bool(self.running)

    def start(self, version: int, params_at: Callable[[int], Any], tick: int) -> None:
        """Evaluate θ of ``version`` (once per version)."""
        if version in self.evaluated:
            return
        self.evaluated.add(version)
        self.params[version] = params_at(version)
        ev = EvalProgress(self.next_id, version, self.goals, tick, self.clock(),
                        invalid_actions=0 if self.settings.generate else None)
        self.running[ev.eval_id] = ev
        self.next_id += 1

    def dispatch(self, engine: RolloutEngine) -> None:
        """Start evaluation episodes in free rows (before training jobs: they are few and fixed)."""
        for ev in self.running.values():
            while (ev.retry or ev.next_position < len(ev.goals)) and engine.free:
                if ev.retry:
                    p = ev.retry.pop(0)
                else:
                    p = ev.next_position
                    ev.next_position += 1
                engine.start("eval", owner=ev.eval_id, version=ev.version, index=0, goal=ev.goals[p],
                             position=p, sampling_seed=hash_ints(self.settings.seed, 7919, ev.version), greedy=True)

    def observe(self, engine: RolloutEngine, finished: list[Episode]) -> None:
        """run.traces: the page each evaluation episode's latest action led to (a snippet), after every tick."""
        if not (self.settings.traces and self.running):
            return
        for episode in (*engine.live.values(), *finished):
            if episode.kind == "eval" and episode.owner in self.running:
                self.running[episode.owner].recorder.observe(episode.position, episode)

    def episode_done(self, episode: Episode) -> None:
        ev = self.running[episode.owner]
        ev.rewards[episode.position] = episode.reward
        if ev.invalid_actions is not None:
            ev.invalid_actions += getattr(episode, "invalid_actions", 0)  # generate mode
        self._trace(ev, episode)
        self._maybe_finish(ev)

    def episode_failed(self, episode: Episode, fields: dict[str, Any]) -> None:
        """The env failed in an evaluation episode: run it again from the start, up to ``env.max_retries`` times
        per evaluation, then score it 0 (traced with its failure)."""
        ev = self.running[episode.owner]
        ev.failures += 1
        if ev.failures <= self.settings.max_retries:
            ev.retry.append(episode.position)
            self.log.event("env_fault", action="retry", **fields)
            ev.recorder.forget(episode.position)
        else:  # an evaluation episode past the retry limit scores 0
            ev.rewards[episode.position] = 0.0
            self.log.event("env_fault", action="scored_zero", **fields)
            self._trace(ev, episode)
        self._maybe_finish(ev)

    def _trace(self, ev: EvalProgress, episode: Episode) -> None:
        if self.settings.traces:
            ev.traces[episode.position] = ev.recorder.line(
                episode.position, episode, ev.rewards[episode.position], self.settings.max_steps,
                is_success=self.settings.is_success, version=ev.version, position=episode.position)

    def _maybe_finish(self, ev: EvalProgress) -> None:
        if ev.complete:
            # written before the record: a record in metrics.jsonl means its traces exist
            if self.settings.traces and self.traces_dir is not None:
                write_traces(self.traces_dir / f"eval-v{ev.version}.jsonl", (ev.traces[p] for p in sorted(ev.traces)))
            record = ev.record(self.clock(), self.settings.is_success)
            self.running.pop(ev.eval_id)
            if not any(e.version == ev.version for e in self.running.values()):
                self.params.pop(ev.version, None)
            self.log.eval_finished(record)

    def versions(self) -> set[int]:
        """Versions under evaluation (a checkpoint keeps their θ)."""
        return {ev.version for ev in self.running.values()}

    def phase(self) -> list[str]:
        return [f"eval v{ev.version} {len(ev.rewards)}/{len(ev.goals)} goals" for ev in self.running.values()]

    def to_dict(self) -> dict[str, Any]:
        return {"evals": [ev.to_dict() for ev in self.running.values()],
                "evaluated_versions": sorted(self.evaluated), "next_eval_id": self.next_id}

    def restore(self, loop: dict[str, Any], params_at: Callable[[int], Any], wall_time: float) -> None:
        """The evaluations a checkpoint's loop state holds (:meth:`to_dict`); ``params_at``: θ of a version."""
        self.evaluated = set(loop["evaluated_versions"])
        self.next_id = int(loop["next_eval_id"])
        for data in loop["evals"]:
            self.params[int(data["version"])] = params_at(int(data["version"]))
            ev = EvalProgress.from_dict(data, self.goals, wall_time)
            self.running[ev.eval_id] = ev
