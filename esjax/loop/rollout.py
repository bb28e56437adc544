"""Continuous-batching rollouts: every tick, all waiting episodes take one action together.

Each live episode belongs to a training member ``(version, index)`` or to an evaluation of the
unperturbed θ at some version. Per tick, the episodes waiting for an action are grouped by version and
served by **a few batched policy calls per live version** (candidate scoring with per-row ES members; rows of
similar length share a call, see :meth:`RolloutEngine._calls`); the chosen actions go through the env pool
in batched steps (:class:`~esjax.loop.protocols.EnvPool`: in this process, in worker processes or in Ray
actors) — pipelined, one per call as soon as its scores are read, on a host worker thread, so env steps and the
next prompts of those rows run while the later calls compute and the loop's own thread only dispatches calls,
reads scores and picks actions; finished episodes are handed back, and freed env rows are reused at once.

Everything here is deterministic given the episodes started: action sampling draws from a counter-based
seed of (task batch sampling seed, position in the batch, step) — the same for every member of one version
(common random numbers) — and ties break by candidate order. An episode's ``trace`` (the candidates it
took) is enough to rebuild it exactly: :meth:`RolloutEngine.start` with a trace replays the env and the
agent's memory without calling the model, which is how a resumed run continues in-flight episodes.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Literal

import jax
import numpy as np

from esjax.agent.buckets import Buckets
from esjax.agent.scoring import DEVICE_PROGRAMS, ScoringPrograms, dispatch_scores
from esjax.es.noise import NoiseSpec
from esjax.loop.protocols import EnvPool, ScoringAgent
from esjax.loop.tasks import hash_ints
from esjax.model.config import ModelConfig
from esjax.model.perturb import Perturbation

EpisodeKind = Literal["train", "eval"]

#: Padded shapes of the rollout's policy calls. Every distinct shape is a compiled program (seconds of CPU
#: compile each), and every padded slot is computed: prompt lengths in steps of 8 to 32, then ~25% apart
#: (the compact prompt is ~90-120 tokens), and a row's packed candidates (a results page: ~12 titles of up to
#: 24 tokens; an item page: options of a few tokens each) in steps of 32 up to 256.
ROLLOUT_BUCKETS = Buckets(rows=(8, 16, 32, 64, 128),
                          lengths=(8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 512, 768, 1024,
                                   2048, 4096))

#: Most rows in one policy call on an accelerator: bigger groups are split, so this bounds a call's memory.
MAX_CALL_ROWS = 128

#: The same on a CPU, where small calls are both leaner and faster. Default config, seed 0, 2-core CPU alone:
#: 128-row calls 4 min 54 s and 2.61 GB peak RSS, 32-row calls 3 min 47 s and 1.58 GB, 16-row calls 3 min 10 s
#: and 1.37 GB, every evaluation identical.
MAX_CALL_ROWS_CPU = 16


def call_sizes(n: int, row_buckets: Sequence[int], most: int = MAX_CALL_ROWS) -> list[int]:
    """Split ``n`` rows into calls of bucket sizes, largest first, so only the last call pads rows.

    ``111 -> [64, 32, 8, 7]`` (7 padded to 8) instead of one call of 111 padded to 128: every padded row is
    computed, and a few more calls cost little next to that (they are all dispatched before any is read).
    """
    sizes = sorted(s for s in row_buckets if s <= most) or [most]
    out = []
    while n > 0:
        fitting = [s for s in sizes if s <= n]
        take = fitting[-1] if fitting else n
        out.append(take)
        n -= take
    return out


class _HostJobs:
    """One tick's jobs on the host worker (``worker``; None: run each at once, inline). Used as a context: leaving
    it waits for every job, also when the tick raises (nothing of a tick runs after it), then raises a job's error
    (an env-pool error, as in the serial tick) and adds the jobs' ``stats`` (their own, written by the worker only)
    to the tick's, counting their time as ``worker_s``."""

    def __init__(self, worker: ThreadPoolExecutor | None, tick_stats: TickStats):
        self.worker, self.tick_stats = worker, tick_stats
        self.stats = type(tick_stats)()
        self.futures: list[Future] = []

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        if self.worker is None:
            fn(*args)
        else:
            self.futures.append(self.worker.submit(fn, *args))

    def __enter__(self) -> _HostJobs:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        wait(self.futures)
        if kind is not None:
            return
        for future in self.futures:
            future.result()
        if self.worker is not None:
            self.stats.worker_s = self.stats.prepare_s + self.stats.env_s
        self.tick_stats.add(self.stats)


def sample_index(probs: np.ndarray, seed: int) -> int:
    """``np.random.default_rng(seed).choice(len(probs), p=probs)``, the same index (a test holds them equal), without
    ``choice``'s argument checks: ~15 instead of ~22 µs, once per sampled row of every policy call."""
    cdf = probs.astype(np.float64).cumsum()
    cdf /= cdf[-1]
    return int(cdf.searchsorted(np.random.Generator(np.random.PCG64(seed)).random(), side="right"))


@dataclasses.dataclass(frozen=True)
class _Replayed:
    """A candidate taken earlier, replayed from a checkpoint's trace."""

    text: str
    action: str


@dataclasses.dataclass
class Episode:
    """One live episode in an env-pool row."""

    row: int
    kind: EpisodeKind
    owner: int  # job id (train) or evaluation id (eval)
    version: int
    index: int  # member index (train); 0 for eval
    goal: int  # shop goal index
    position: int  # position in the task batch / eval set: the CRN sampling stream
    sampling_seed: int
    greedy: bool
    memory: Any  # the agent's (ScoringAgent.new_memory)
    observation: str = ""
    available: dict = dataclasses.field(default_factory=dict)
    trace: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict = dataclasses.field(default_factory=dict)
    failure: str | None = None  # why the env failed this episode (an exception or a step timeout)

    @property
    def steps(self) -> int:
        return len(self.trace)

    def to_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to rebuild this episode (see :meth:`RolloutEngine.start`)."""
        return {"row": self.row, "kind": self.kind, "owner": self.owner, "version": self.version, "index": self.index,
                "goal": self.goal, "position": self.position, "sampling_seed": self.sampling_seed,
                "greedy": self.greedy, "trace": [list(t) for t in self.trace]}


@dataclasses.dataclass
class TickStats:
    """What one tick did and where its time went (host seconds from ``time.perf_counter``)."""

    rows: int = 0  # episodes that acted
    model_rows: int = 0  # rows that needed a policy call (more than one candidate)
    calls: int = 0  # batched policy calls
    tokens: int = 0  # prompt + candidate tokens scored
    padded_tokens: int = 0  # tokens the policy programs computed (tokens / padded_tokens = padding efficiency)
    prepare_s: float = 0.0  # building prompts and candidates, tokenizing
    model_s: float = 0.0  # policy calls: padding, dispatch, device compute, reading scores back
    env_s: float = 0.0  # env steps
    worker_s: float = 0.0  # of prepare_s + env_s: run on the host worker thread (a pipelined tick), beside the loop
    shapes: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)  # (rows, prompt, candidate tokens)

    def add(self, other: TickStats) -> None:
        for f in dataclasses.fields(self):
            if f.name == "shapes":
                self.shapes.extend(other.shapes)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def restore_arguments(data: dict[str, Any]) -> dict[str, Any]:
    """:meth:`RolloutEngine.start`'s arguments for an episode from a checkpoint (:meth:`Episode.to_dict`)."""
    ints = {k: int(data[k]) for k in ("owner", "version", "index", "goal", "position", "sampling_seed", "row")}
    return {"kind": data["kind"], **ints, "greedy": bool(data["greedy"]), "trace": data["trace"]}


class RolloutEngine:
    """Runs episodes of many members and versions in lock-step ticks over one env pool.

    Args:
      pool: an :class:`~esjax.loop.protocols.EnvPool`: batched ``reset_rows`` / ``step`` /
        ``available_actions`` / ``instructions`` over rows.
      agent: a :class:`~esjax.loop.protocols.ScoringAgent`: prompts, candidates and its episode memory.
      model_config: the policy's :class:`ModelConfig`.
      noise: the run's noise spec (members' perturbations).
      sigma_at: σ of a version.
      max_steps: episode step cap (an episode that never buys scores 0).
      temperature: sampling temperature over candidate log-likelihoods (training rows); 0 = greedy.
      buckets: padding of policy calls; coarse buckets keep a run to a handful of compiled programs.
      max_call_rows: most rows in one policy call (None: :data:`MAX_CALL_ROWS_CPU` on a CPU backend, else
        :data:`MAX_CALL_ROWS`).
      step_timeout: seconds one env step may take (None: no limit), passed to ``pool.step``: a step past the
        limit fails its episode and the pool replaces the hung session (the in-process pool steps on a helper
        thread it abandons; process and Ray pools also replace a worker that stops answering). An env step
        that raises fails its episode either way; failed episodes come back from :meth:`tick` with
        ``failure`` set and ``reward`` 0.
      pipelined: overlap host work with the device inside a tick: the rows of each policy call are stepped in
        the env and their next prompts built as soon as that call's scores are read, on a host worker thread
        (on the loop's own thread if the pool's ``collective`` attribute is true: its calls are collectives of a
        multi-process job, to be made in one order with the loop's), while the loop's thread reads the later
        calls (rows with a single candidate step before any score is read). Every episode sees the same calls,
        actions and env steps as in the serial tick (False: one env step of all rows after every call is read,
        on the loop's thread), so runs are identical either way; only the number of ``pool.step`` calls per tick
        grows.
      programs: what a policy call runs on the device (:class:`~esjax.agent.scoring.ScoringPrograms`): the real
        programs, or a stand-in such as ``benchmarks/rollout.py``'s simulated accelerator.
    """

    def __init__(self, pool: EnvPool, agent: ScoringAgent, model_config: ModelConfig, noise: NoiseSpec,
                 sigma_at: Callable[[int], float], max_steps: int, temperature: float = 1.0,
                 buckets: Buckets = ROLLOUT_BUCKETS, step_timeout: float | None = None,
                 max_call_rows: int | None = None, pipelined: bool = True,
                 programs: ScoringPrograms = DEVICE_PROGRAMS):
        self.pool = pool
        self.agent = agent
        self.model_config = model_config
        self.noise = noise
        self.sigma_at = sigma_at
        self.max_steps = max_steps
        self.temperature = temperature
        self.buckets = buckets
        self.step_timeout = step_timeout
        if max_call_rows is None:
            max_call_rows = MAX_CALL_ROWS_CPU if jax.default_backend() == "cpu" else MAX_CALL_ROWS
        self.max_call_rows = max_call_rows
        self.pipelined = pipelined
        self.programs = programs
        self.free_rows: list[int] = list(range(len(pool)))[::-1]
        self.live: dict[int, Episode] = {}
        self._next_inputs: dict[int, tuple[Episode, tuple]] = {}  # row -> (episode, its next step's inputs)
        self._worker: ThreadPoolExecutor | None = None  # env steps and next prompts of a pipelined tick
        # A pool whose calls are collectives (env rows split over a multi-process job) must be called from the
        # loop's thread, in the loop's order with its other collectives: its steps stay inline there.
        self._offload = pipelined and not getattr(pool, "collective", False)

    # ------------------------------------------------------------------------------------------- episodes
    @property
    def capacity(self) -> int:
        return len(self.pool)

    @property
    def free(self) -> int:
        return len(self.free_rows)

    def start(self, kind: EpisodeKind, *, owner: int, version: int, index: int, goal: int, position: int,
              sampling_seed: int, greedy: bool, trace: Sequence[Sequence[str]] = (), row: int | None = None
              ) -> Episode:
        """Open an episode in a free row; a ``trace`` of (candidate text, action) pairs is replayed first.

        ``row`` pins the env row (a resumed run puts every episode back where it was, so batches are
        assembled in the same order as in the uninterrupted run).
        """
        episode = self._open_episode(Episode, row, kind, owner, version, index, goal, position, sampling_seed, greedy)
        for text, action in trace:
            self.agent.remember(episode.memory, episode.available, _Replayed(text, action))
            episode.observation, episode.available, done, _ = self._replay_step(episode.row, action)
            episode.trace.append((text, action))
            if done:
                raise RuntimeError(f"replayed trace of goal {goal} ended its episode; it should still be live")
        self.live[episode.row] = episode
        return episode

    def _open_episode(self, cls: type[Episode], row: int | None, *fields: Any) -> Any:
        """An episode of type ``cls`` in ``row`` (None: a free row), its env reset to its goal; ``fields``: the
        episode's fields from ``kind`` to ``greedy`` (as :meth:`start` takes them)."""
        if not self.free_rows:
            raise RuntimeError("no free env rows: start fewer episodes or raise the pool's capacity")
        if row is None:
            row = self.free_rows.pop()
        else:
            self.free_rows.remove(row)
        observation, instruction, available = self._open(row, fields[4])
        return cls(row, *fields, self.agent.new_memory(instruction), observation, available)

    def restore_episode(self, data: dict[str, Any]) -> Episode:
        """An episode from a checkpoint (:meth:`Episode.to_dict`), back in its row, its trace replayed."""
        return self.start(**restore_arguments(data))

    def checkpoint_episodes(self) -> list[dict[str, Any]]:
        """The live episodes as a checkpoint holds them (:meth:`Episode.to_dict`, in row order)."""
        return [self.live[row].to_dict() for row in sorted(self.live)]

    def stop(self, predicate: Callable[[Episode], bool]) -> list[Episode]:
        """Drop (without finishing) every live episode matching ``predicate``; frees their rows."""
        dropped = [e for e in self.live.values() if predicate(e)]
        for episode in dropped:
            del self.live[episode.row]
            self.free_rows.append(episode.row)
        return dropped

    # ------------------------------------------------------------------------------------------- one tick
    def choose(self, episode: Episode, scores: np.ndarray) -> int:
        """The index of the candidate ``episode`` takes, from its candidates' ``scores``: the best for a greedy
        episode (or at temperature 0), else a draw from their softmax at ``temperature``, seeded by the episode's
        sampling seed, position and step. A subclass may override it to change how actions are picked (the
        ``engine_cls`` of :func:`esjax.train.standalone_eval.evaluate_policy`)."""
        if episode.greedy or self.temperature <= 0 or len(scores) == 1:
            return int(np.argmax(scores))
        logits = (scores - scores.max()) / self.temperature
        probs = np.exp(logits)
        probs /= probs.sum()
        return sample_index(probs, hash_ints(episode.sampling_seed, episode.position, episode.steps))

    def _calls(self, waiting: list[Episode], inputs: dict[int, tuple]) -> list[tuple[int, list[Episode]]]:
        """The tick's policy calls: ``(version, episodes)`` in a fixed order (determinism).

        Rows are grouped by version (one θ per call), sorted by their packed candidate tokens so each call
        holds rows of similar length (a row pads to the longest of its call), and split into calls of
        bucket sizes (:func:`call_sizes`).
        """
        groups: dict[int, list[tuple[int, int, Episode]]] = {}
        for episode in waiting:
            cand_ids = inputs[episode.row][2]
            if len(cand_ids) > 1:
                total = sum(len(c) for c in cand_ids)
                groups.setdefault(episode.version, []).append((total, episode.row, episode))
        calls = []
        for version, group in sorted(groups.items()):
            ordered = [episode for _, _, episode in sorted(group, key=lambda item: item[:2])]
            start = 0
            for size in call_sizes(len(ordered), self.buckets.rows or (self.max_call_rows,), self.max_call_rows):
                calls.append((version, ordered[start:start + size]))
                start += size
        return calls

    def tick(self, params_at: Callable[[int], Any]) -> tuple[list[Episode], TickStats]:
        """Every live episode takes one action; returns the episodes that finished and the tick's stats."""
        stats = TickStats()
        waiting = [self.live[row] for row in sorted(self.live)]
        if not waiting:
            return [], stats
        t0 = time.perf_counter()
        inputs = {e.row: self._inputs(e) for e in waiting}
        self._next_inputs.clear()
        stats.prepare_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        pending = []  # every call is dispatched before any is read: host padding overlaps device compute
        for version, group in self._calls(waiting, inputs):
            prompts = [inputs[e.row][0] for e in group]
            cand_ids = [inputs[e.row][2] for e in group]
            perturbation = Perturbation.create(
                self.noise, self.sigma_at(version), [e.version for e in group], [e.index for e in group],
                [e.kind == "train" for e in group])
            call = dispatch_scores(self.model_config, params_at(version), prompts, cand_ids, perturbation,
                                   buckets=self.buckets, norm=self.agent.score_norm, programs=self.programs)
            pending.append((group, call))
            stats.calls += 1
            stats.model_rows += len(group)
            stats.tokens += sum(len(p) for p in prompts) + sum(len(c) for cs in cand_ids for c in cs)
            stats.padded_tokens += call.shape["padded_tokens"]
            stats.shapes.append(tuple(call.shape[k] for k in ("rows", "prompt_len", "candidate_len")))
        stats.model_s += time.perf_counter() - t0
        # Rows acting without a policy call (one candidate, or none: a dead end) first, then each call's rows;
        # pipelined, each batch steps the env (and builds its next prompts) while later calls still compute.
        called = {e.row for group, _ in pending for e in group}
        batches: list[tuple[list[Episode], Any]] = [([e for e in waiting if e.row not in called], None)]
        batches += pending
        acted: list[tuple[Episode, str]] = []
        with self._host_jobs(stats) as jobs:
            for group, call in batches:
                t0 = time.perf_counter()
                choice = {e.row: 0 for e in group} if call is None else {
                    e.row: self.choose(e, row_scores[: len(inputs[e.row][1])])
                    for e, row_scores in zip(group, call.result())}
                stats.model_s += time.perf_counter() - t0
                acted += self._take_actions(group, inputs, choice)
                if self.pipelined and acted:  # a batch's episodes are its own: the worker and this thread share none
                    jobs.submit(self._step_env, acted, jobs.stats, True)
                    acted = []
        self._step_env(acted, stats, prepare_next=False)
        finished = []
        for episode in waiting:
            self._retire_if_over(episode, finished)
        return finished, stats

    def _host_jobs(self, stats: TickStats) -> _HostJobs:
        """A tick's jobs for the host worker thread, the one that steps the env and builds next prompts in a
        pipelined tick (one: the pool's steps stay in order, and the GIL would serialise more anyway; it ends with
        the engine); run inline when the pool's calls are collectives."""
        if self._offload and self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="esjax-rollout-host")
            weakref.finalize(self, self._worker.shutdown, wait=False)
        return _HostJobs(self._worker if self._offload else None, stats)

    def _inputs(self, episode: Episode) -> tuple:
        """The episode's step inputs: built early by a pipelined tick, or now."""
        cached = self._next_inputs.get(episode.row)
        if cached is not None and cached[0] is episode:
            return cached[1]
        return self._build_inputs(episode)

    def _build_inputs(self, episode: Episode) -> tuple:
        return self.agent.step_inputs(episode.observation, episode.available, episode.memory)

    def _take_actions(self, group: list[Episode], inputs: dict[int, tuple], choice: dict[int, int]
                      ) -> list[tuple[Episode, str]]:
        """Each episode of ``group`` takes its chosen candidate (a dead end, with none, is over); returns the
        (episode, action) pairs to step."""
        acting = []
        for episode in group:
            candidates = inputs[episode.row][1]
            if not candidates:  # a dead end (e.g. the done page without done): the episode is over
                episode.done = True
                continue
            picked = candidates[choice[episode.row]]
            self.agent.remember(episode.memory, episode.available, picked)
            episode.trace.append((picked.text, picked.action))
            acting.append((episode, picked.action))
        return acting

    def _step_env(self, acting: list[tuple[Episode, str]], stats: TickStats, prepare_next: bool) -> None:
        """Step the env rows of ``acting`` in one batched pool call and take in what each sees; with
        ``prepare_next``, build the next step's inputs of those still running (a pipelined tick)."""
        if not acting:
            return
        actions: list[str | None] = [None] * len(self.pool)
        for episode, action in acting:
            actions[episode.row] = action
        stats.rows += len(acting)
        t0 = time.perf_counter()
        results, failures = self._step(actions)
        available = self._available(list(results))
        stats.env_s += time.perf_counter() - t0
        for episode, _ in acting:
            if episode.row in failures:
                episode.done, episode.reward, episode.failure = True, 0.0, failures[episode.row]
                continue
            observation, reward, done, info = results[episode.row]
            episode.observation = observation
            episode.available = available[episode.row]
            if done:
                episode.done, episode.reward, episode.info = True, float(reward), info
        if prepare_next:
            t0 = time.perf_counter()
            for episode, _ in acting:
                if not episode.done and episode.steps < self.step_budget(episode):
                    self._next_inputs[episode.row] = (episode, self._build_inputs(episode))
            stats.prepare_s += time.perf_counter() - t0

    def step_budget(self, episode: Episode) -> int:
        """The most steps ``episode`` may take: ``env.max_steps`` for every episode. The seam for tasks (or tests)
        whose episodes have budgets of their own; an episode at its budget ends as if it had reached the cap."""
        return self.max_steps

    def _retire_if_over(self, episode: Episode, finished: list[Episode]) -> None:
        """An episode that ended (or used its :meth:`step_budget`) leaves ``live`` for ``finished``; its row is
        free."""
        if episode.done or episode.steps >= self.step_budget(episode):
            episode.done = True
            finished.append(episode)
            del self.live[episode.row]
            self.free_rows.append(episode.row)

    # ------------------------------------------------------------------------------------------- env calls
    def _open(self, row: int, goal: int) -> tuple[str, str, dict]:
        """Reset ``row`` to ``goal``: (first observation, instruction, available actions)."""
        ((observation, _),) = self.pool.reset_rows([row], [goal])
        (instruction,) = self.pool.instructions([row])
        return observation, instruction, self.pool.available_actions([row])[0]

    def _step(self, actions: Sequence[str | None], replay: bool = False) -> tuple[dict[int, tuple], dict[int, str]]:
        """Step every row with an action in one batched pool call; a row past ``step_timeout`` (none when
        ``replay``) or whose step raised fails alone. Returns ``(results, failures)``: row -> (observation,
        reward, done, info) and row -> why it failed."""
        observations, rewards, done, infos = self.pool.step(actions, None if replay else self.step_timeout)
        results: dict[int, tuple] = {}
        failures: dict[int, str] = {}
        for row, action in enumerate(actions):
            if action is None:
                continue
            if "failure" in infos[row]:
                failures[row] = infos[row]["failure"]
            else:
                results[row] = (observations[row], float(rewards[row]), bool(done[row]), infos[row])
        return results, failures

    def _available(self, rows: list[int]) -> dict[int, dict]:
        """Row -> its page's available actions."""
        return dict(zip(rows, self.pool.available_actions(rows))) if rows else {}

    def _replay_step(self, row: int, action: str) -> tuple[str, dict, bool, dict]:
        """Replay one traced action in ``row`` (no time limit; a failure raises): (observation, available actions,
        done, info)."""
        actions: list[str | None] = [None] * len(self.pool)
        actions[row] = action
        results, failures = self._step(actions, replay=True)
        if row in failures:
            raise RuntimeError(f"replaying a trace in env row {row} failed: {failures[row]}")
        observation, _, done, info = results[row]
        return observation, self._available([row])[row], done, info
