"""The member jobs in flight in the training loop: each job's episodes (started, rewards in, failed ones to run
again) until its member's fitness — the mean reward over its ``tasks_per_member`` goals — can be reported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from esjax.loop.rollout import Episode, RolloutEngine
from esjax.loop.types import Job, Result
from esjax.train.inflight import JobProgress, SinceUpdate
from esjax.train.records import RunLog


class MemberJobs:
    """Jobs by id; ``train_goals`` are the goal indices a job's task batch picks from; env faults go to ``log``."""

    def __init__(self, train_goals: list[int], tasks_per_member: int, max_retries: int, log: RunLog):
        self.train_goals = train_goals
        self.tasks_per_member = tasks_per_member
        self.max_retries = max_retries
        self.log = log
        self.active: dict[int, JobProgress] = {}

    def __len__(self) -> int:
        return len(self.active)

    def add(self, jobs: list[Job], tick: int) -> None:
        for job in jobs:
            self.active[job.job_id] = JobProgress(job, tick)

    def dispatch(self, engine: RolloutEngine) -> None:
        """Start the jobs' episodes in free rows, oldest job first; a failed episode runs again first."""
        goals = self.train_goals
        for jp in sorted(self.active.values(), key=lambda j: j.job.job_id):
            while (jp.retry or jp.started < self.tasks_per_member) and engine.free:
                if jp.retry:  # the same member, goal and sampling stream: a deterministic re-run
                    p = jp.retry.pop(0)
                else:
                    p = jp.started
                    jp.started += 1
                member = jp.job.member
                engine.start("train", owner=jp.job.job_id, version=member.version, index=member.index,
                             goal=goals[jp.job.tasks.goals[p] % len(goals)], position=p,
                             sampling_seed=jp.job.tasks.sampling_seed, greedy=False)

    def episode_done(self, episode: Episode, since: SinceUpdate) -> bool:
        """A training episode ended; True when its job has every reward in."""
        jp = self.active.get(episode.owner)
        if jp is None:
            return False
        since.episodes += 1
        since.invalid_actions += getattr(episode, "invalid_actions", 0)  # generate mode
        jp.rewards[episode.position] = episode.reward
        return len(jp.rewards) == self.tasks_per_member

    def episode_failed(self, episode: Episode, fields: dict[str, Any]) -> JobProgress | None:
        """A training episode's env failed: it runs again (an ``env_fault`` event, ``retry``) while its job has
        retries left (``env.max_retries``); then the job leaves (``drop_job``) and is returned, for the loop to
        stop its episodes and tell the coordinator. None also for a job already gone."""
        jp = self.active.get(episode.owner)
        if jp is None:
            return None
        jp.failures += 1
        if jp.failures <= self.max_retries:
            jp.retry.append(episode.position)
            self.log.event("env_fault", action="retry", **fields)
            return None
        self.log.event("env_fault", action="drop_job", **fields)
        return self.active.pop(episode.owner)

    def take(self, stop: Callable[[JobProgress], bool]) -> list[tuple[int, JobProgress]]:
        """Remove the jobs ``stop`` picks and return them, in job order."""
        return [(jid, self.active.pop(jid)) for jid in sorted(j for j, jp in self.active.items() if stop(jp))]

    def results(self, done: list[int], tick: int) -> list[Result]:
        """Each finished job's member fitness (mean reward), in job order; the jobs leave."""
        results = []
        for jid in sorted(done):
            jp = self.active.pop(jid, None)
            if jp is not None:
                fitness = float(np.mean([jp.rewards[p] for p in range(self.tasks_per_member)]))
                results.append(jp.job.result(fitness, float(tick - jp.started_tick)))
        return results

    def to_dict(self) -> dict[str, Any]:
        return {str(jid): jp.to_dict() for jid, jp in sorted(self.active.items())}

    def restore(self, data: dict[str, Any], in_flight: list[Job]) -> None:
        jobs_by_id = {job.job_id: job for job in in_flight}
        self.active = {int(jid): JobProgress.from_dict(d, jobs_by_id[int(jid)]) for jid, d in data.items()}
