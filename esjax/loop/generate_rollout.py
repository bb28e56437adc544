"""Generate-mode rollouts: the policy writes each action, with continuous batching at the decode-step level.

**Tick structure.** A tick of :class:`GenerateEngine` is ``decode_steps`` decode steps (default 1), not one
action per episode as in score mode, because turns have very different lengths: a ``click[buy now]`` takes a few
tokens, a search query or a ReAct thought dozens. One tick:

1. rows whose episode starts a turn (a new episode, or the page after an env step) are **prefilled**: their
   prompts, grouped per version, run through the model as one small batch; their keys and values are inserted
   into their version's decode lane (:class:`esjax.agent.lanes.Lane`) and their first token is drawn;
2. every row mid-turn takes ``decode_steps`` **decode steps** (one batched forward per live version: rows of one
   version share θ_v, each row applies its own ES member inside the matmuls); the same program advances each
   row's action automaton (:class:`~esjax.agent.automaton.TurnAutomaton`) over its new tokens and finds where its
   turn ends (:func:`~esjax.agent.automaton.turn_ends`);
3. the host reads the new tokens and the turn ends in one transfer; a row whose reply now holds a complete
   action (or an end-of-sequence token, or ``max_new_tokens`` tokens) ends its turn: its action is parsed and the
   **env steps** it, and a row whose episode ended frees its env row and lane row for the next episode at once.

So a row that finishes its turn at decode step 3 acts and starts its next turn's prefill in the next tick while
its neighbours keep decoding; nobody waits for the longest reply, and lane rows left over by an ended episode
are refilled by the driver's next dispatch. The wasted compute is the lane rows that hold no live turn during a
decode step (lanes grow in powers of two) and, with ``decode_steps > 1``, the steps after a row's reply
completed within a tick (``benchmarks/generation.py`` measures both). One decode step per tick costs a host
round trip per step; several trade that for wasted steps.

**Sampling.** Training rows sample with the configured temperature / top-k / top-p from counter-based keys:
token ``n`` of turn ``t`` of the episode at task position ``p`` uses a key derived from
``hash(sampling seed of the task batch, p, t)`` and ``n`` only. The sampling seed is the version's (every member
of a version shares it: common random numbers), so two members draw with the same keys and differ only
through their parameters. Evaluation rows are greedy.

**Determinism and resume.** Everything is a function of the episodes started and the parameters. An episode's
``trace`` holds each finished turn's reply and the action sent to the env, so :meth:`GenerateEngine.start`
replays an episode without the model; a turn in progress at a checkpoint is kept as its tokens so far
(``partial``). When the driver checkpoints (:meth:`GenerateEngine.checkpoint_episodes`), the engine drops its
device state and every live row resumes by a prefill of its prompt plus its partial tokens at the next tick —
in the uninterrupted run exactly as in a run resumed from that checkpoint, so the two stay bit-identical.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from esjax.agent.automaton import ASKING, COMPLETE, LOOK, OVER, UNKNOWN, TurnAutomaton
from esjax.agent.buckets import next_power_of_two
from esjax.agent.lanes import (
    DEVICE_PROGRAMS,
    PREFILL_BUCKETS,
    Lane,
    LanePrograms,
    RowState,
    Sampling,
    decoded_parts,
    split_seed,
)
from esjax.es.noise import NoiseSpec
from esjax.loop.protocols import EnvPool, GeneratingAgent
from esjax.loop.rollout import Episode, EpisodeKind, RolloutEngine, TickStats, restore_arguments
from esjax.loop.tasks import hash_ints
from esjax.model.config import ModelConfig
from esjax.model.sharding import to_host

_TAG_TURN = 0x7E57  # separates the turn seeds from any other use of the sampling seed


@dataclasses.dataclass
class GenEpisode(Episode):
    """An episode of generate mode: its current turn's prompt and tokens so far."""

    tokens: list[int] = dataclasses.field(default_factory=list)  # partial turn to prefill (mid-turn: the lane's)
    prompt: list[int] | None = None  # this turn's prompt ids once built (a pipelined tick builds them early)
    prompt_len: int = 0
    needs_prefill: bool = True
    slot: int = -1  # its lane row in its version's lane while it holds one
    invalid_actions: int = 0

    @property
    def turn(self) -> int:
        return len(self.trace)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "partial": list(self.tokens)}


@dataclasses.dataclass
class GenTickStats(TickStats):
    """:class:`TickStats` plus generation's own counts."""

    prefill_rows: int = 0
    decode_steps: int = 0  # decode steps run (per lane)
    row_steps: int = 0  # lane rows × decode steps computed
    generated: int = 0  # tokens kept in replies
    invalid_actions: int = 0
    decode_cpu_s: float = 0.0  # CPU of the calling thread in the decode steps' host path (dispatch, token intake)


class TurnTokens:
    """The turns of a lane's rows so far, as a log of the lane's steps: ``log [steps, rows]`` holds each row's token
    of every step the lane took (a prefill's first token, a decode step's; the automaton's ``hole`` id where a row
    took none), so a decode call's tokens go in as one slice. A row's turn is its column from ``begin`` on, holes
    skipped, its first ``count`` tokens; ``complete``: they end with a complete action. Also each turn's
    :class:`~esjax.agent.automaton.TurnAutomaton` state, and which episode (and env row) holds each lane row."""

    def __init__(self, rows: int, span: int, hole: int):
        self.span, self.hole = span, hole  # span: the log steps one turn can cover
        self.log = np.full((2 * span, rows), hole, np.int32)
        self.t = span  # the next log step (a turn put back from a checkpoint is written before it)
        self.begin = np.zeros(rows, np.int64)
        self.count = np.zeros(rows, np.int64)
        self.state = np.zeros(rows, np.int32)
        self.complete = np.zeros(rows, bool)
        self.episode = np.full(rows, None, object)
        self.env_row = np.zeros(rows, np.int64)

    def fit(self, rows: int) -> None:
        """Grow to ``rows`` rows (a lane that grew)."""
        extra = rows - len(self.count)
        if extra > 0:
            self.log = np.concatenate([self.log, np.full((len(self.log), extra), self.hole, np.int32)], axis=1)
            for name in ("begin", "count", "state", "complete", "episode", "env_row"):
                values = getattr(self, name)
                setattr(self, name, np.concatenate([values, np.zeros(extra, values.dtype)]))

    def put(self, row: int, episode: GenEpisode, state: int) -> None:
        """Lane row ``row`` starts ``episode``'s turn, holding its tokens so far (in automaton ``state``)."""
        n = len(episode.tokens)
        self.log[self.t - n:self.t, row] = episode.tokens
        self.begin[row], self.count[row], self.state[row], self.complete[row] = self.t - n, n, state, False
        self.episode[row], self.env_row[row] = episode, episode.row

    def write(self, block: np.ndarray) -> None:
        """Append ``block [steps, rows]`` to the log (first moving its last ``span`` steps, which hold every live
        turn, to its start when it is full)."""
        if self.t + len(block) > len(self.log):
            self.log[:self.span] = self.log[self.t - self.span:self.t]
            self.begin -= self.t - self.span
            self.t = self.span
        self.log[self.t:self.t + len(block)] = block
        self.t += len(block)

    def get(self, row: int) -> list[int]:
        """The turn of lane row ``row`` (``-1`` after a complete action)."""
        return self.replies(np.array([row]), marked=True)[0]

    def replies(self, rows: np.ndarray, marked: bool = False) -> list[list[int]]:
        """The turns of lane ``rows`` (``marked``: ``-1`` after a complete action), in a few array operations."""
        lo = int(self.begin[rows].min(initial=self.t))
        window = self.log[lo:self.t, rows].T  # [rows, steps]
        keep = (window != self.hole) & (np.arange(window.shape[1]) >= (self.begin[rows] - lo)[:, None])
        keep &= np.cumsum(keep, axis=1) <= self.count[rows][:, None]
        tokens, ends = window[keep].tolist(), np.cumsum(keep.sum(axis=1)).tolist()
        turns = [tokens[a:b] for a, b in zip([0, *ends], ends)]
        if marked:
            for turn, complete in zip(turns, self.complete[rows].tolist()):
                turn.extend([-1] * complete)
        return turns


def turn_seed(sampling_seed: int, position: int, turn: int) -> int:
    """The 64-bit seed of one turn's token draws (common to every member of a version)."""
    return hash_ints(_TAG_TURN, sampling_seed, position, turn)


class GenerateEngine(RolloutEngine):
    """Runs generate-mode episodes of many members and versions over one env pool (see the module docstring).

    Same interface as :class:`~esjax.loop.rollout.RolloutEngine` (``start``, ``restore_episode``, ``stop``,
    ``tick``, ``live``, ``free``, ``free_rows``); the agent is a :class:`~esjax.loop.protocols.GeneratingAgent`.

    Args:
      sampling: temperature / top-k / top-p of training rows (evaluation rows are greedy).
      max_new_tokens: longest reply of one turn.
      decode_steps: decode steps per tick.
      max_prompt_tokens: the agent's prompt limit (sizes the decode lanes).
      unperturbed_turns: an episode's first turns written with the version's own θ even by a training member (its
        ES member applies from the next turn on): every member of a version then sees the same first pages, so the
        members differ only by the decisions after them (0: every turn perturbed).
      pipelined: as soon as a lane's tokens are read, the rows whose turn ended there step the env and build
        their next prompts on the host worker thread while the loop's thread reads the next lanes (False: every
        ended row steps at the end of the tick, on the loop's thread). The same env steps, prompts and tokens
        either way, so runs are identical; the overlap grows with the versions live at once.
      lane_programs: what the decode lanes run on the device (:class:`~esjax.agent.lanes.LanePrograms`): the real
        programs, or a stand-in such as ``benchmarks/rollout.py``'s simulated accelerator.
    """

    def __init__(self, pool: EnvPool, agent: GeneratingAgent, model_config: ModelConfig, noise: NoiseSpec,
                 sigma_at: Callable[[int], float], max_steps: int, sampling: Sampling, max_new_tokens: int,
                 decode_steps: int = 1, max_prompt_tokens: int = 1024, step_timeout: float | None = None,
                 pipelined: bool = True, unperturbed_turns: int = 0,
                 lane_programs: LanePrograms = DEVICE_PROGRAMS):
        super().__init__(pool, agent, model_config, noise, sigma_at, max_steps, sampling.temperature,
                         step_timeout=step_timeout, pipelined=pipelined)
        self.lane_programs = lane_programs
        if max_new_tokens < 1 or decode_steps < 1:
            raise ValueError(f"generate: need max_new_tokens >= 1 and decode_steps >= 1, got {max_new_tokens}, "
                             f"{decode_steps}")
        self.sampling = sampling
        self.unperturbed_turns = unperturbed_turns
        self.max_new_tokens = max_new_tokens
        self.decode_steps = decode_steps
        longest_prefill = PREFILL_BUCKETS.length(max_prompt_tokens + max_new_tokens)
        self.lane_length = longest_prefill + 2 * (max_new_tokens + decode_steps)
        self.lanes: dict[int, Lane] = {}
        self.turn_tokens: dict[int, TurnTokens] = {}  # version -> its lane rows' turns so far
        ids = max([model_config.vocab_size, *agent.stop_token_ids, *agent.closing_ids]) + 1
        self.automaton = TurnAutomaton(agent.automaton, agent.stop_token_ids, agent.closing_ids, ids)
        self._turns = jnp.asarray(self.automaton.table)  # the lanes advance it on the device, beside the sampling
        self.live: dict[int, GenEpisode] = {}

    # ------------------------------------------------------------------------------------------- episodes
    def start(self, kind: EpisodeKind, *, owner: int, version: int, index: int, goal: int, position: int,
              sampling_seed: int, greedy: bool, trace: Sequence[Sequence[str]] = (), row: int | None = None,
              partial: Sequence[int] = ()) -> GenEpisode:
        """Open an episode in a free row; a ``trace`` of (reply, action) pairs is replayed first and ``partial``
        (tokens of the turn in progress) continues at the next tick."""
        episode = self._open_episode(GenEpisode, row, kind, owner, version, index, goal, position, sampling_seed,
                                     greedy)
        for reply, action in trace:
            episode.observation, available, done, info = self._replay_step(episode.row, action)
            self._acted(episode, reply, action, info, available)
            if done:
                raise RuntimeError(f"replayed trace of goal {goal} ended its episode; it should still be live")
        episode.tokens = [int(t) for t in partial]
        self.live[episode.row] = episode
        return episode

    def restore_episode(self, data: dict[str, Any]) -> GenEpisode:
        return self.start(**restore_arguments(data), partial=data.get("partial", ()))

    def stop(self, predicate: Callable[[Episode], bool]) -> list[Episode]:
        dropped = super().stop(predicate)
        for episode in dropped:
            self._release(episode)
        return dropped

    def checkpoint_episodes(self) -> list[dict[str, Any]]:
        """The live episodes as a checkpoint holds them. Also drops the device state (lanes): every live row
        resumes at the next tick by a prefill of its prompt and partial tokens, as a resumed run's rows do."""
        for episode in self.live.values():
            if episode.slot >= 0 and not episode.needs_prefill:
                episode.tokens = self.turn_tokens[episode.version].get(episode.slot)
            episode.needs_prefill = True
            episode.slot = -1
        self.lanes.clear()
        self.turn_tokens.clear()
        return [self.live[row].to_dict() for row in sorted(self.live)]

    def _release(self, episode: GenEpisode) -> None:
        """Free the episode's lane row (if it holds one)."""
        if episode.slot >= 0:
            self.lanes[episode.version].release(episode.slot)
            self.turn_tokens[episode.version].episode[episode.slot] = None
            episode.slot = -1

    def _acted(self, episode: GenEpisode, reply: str, action: str, info: dict, available: dict) -> None:
        self.agent.remember(episode.memory, reply, action, info)
        episode.available = available
        episode.trace.append((reply, action))
        if not info.get("valid", True):
            episode.invalid_actions += 1

    # ------------------------------------------------------------------------------------------- one tick
    def _state(self, episode: GenEpisode) -> RowState:
        lo, hi = split_seed(turn_seed(episode.sampling_seed, episode.position, episode.turn))
        perturbed = episode.kind == "train" and episode.turn >= self.unperturbed_turns
        choices = self.agent.reply_choices(episode.available, episode.memory)
        if choices is not None:  # a reply the turn could not finish would be cut before its action is complete
            choices = [c for c in choices if len(c) <= self.max_new_tokens] or None
        return RowState((episode.version, episode.index, perturbed), lo, hi, episode.greedy,
                        count=len(episode.tokens), choices=choices)

    def _lane(self, version: int, dtype: Any, rows: int) -> Lane:
        lane = self.lanes.get(version)
        if lane is None:
            lane = Lane(self.model_config, next_power_of_two(max(rows, 1)), self.lane_length, dtype, self.sampling,
                        self._turns, self.automaton.events(self.max_new_tokens), self.lane_programs)
            self.lanes[version] = lane
            self.turn_tokens[version] = TurnTokens(lane.rows, 2 * (self.max_new_tokens + self.decode_steps + 1),
                                                   self.automaton.hole)  # a hole at most per token taken
        return lane

    def tick(self, params_at: Callable[[int], Any]) -> tuple[list[Episode], GenTickStats]:
        """Prefill starting turns, ``decode_steps`` decode steps for every row mid-turn, env steps for rows whose
        turn ended; returns the episodes that finished and the tick's stats."""
        stats = GenTickStats()
        episodes = [self.live[row] for row in sorted(self.live)]
        if not episodes:
            return [], stats
        versions: dict[int, list[GenEpisode]] = {}
        for episode in episodes:
            versions.setdefault(episode.version, []).append(episode)
        for version in [v for v in self.lanes if v not in versions]:
            del self.lanes[version], self.turn_tokens[version]  # its rows were released when their turns ended
        steps = self.decode_steps
        pending = []
        for version, group in sorted(versions.items()):
            params = params_at(version)
            lane = self._lane(version, params["embed"]["embedding"].dtype, len(group))
            turn = self.turn_tokens[version]
            t0 = time.perf_counter()
            entries, starting = [], []
            for episode in group:
                if not episode.needs_prefill:
                    continue
                self._release(episode)
                episode.slot = slot = lane.free_row()
                episode.needs_prefill = False
                ids = self._prompt(episode)
                episode.prompt_len = len(ids)
                entries.append((slot, ids + episode.tokens, self._state(episode)))
                starting.append((slot, episode))
                stats.tokens += len(ids) + len(episode.tokens)
            turn.fit(lane.rows)
            for slot, episode in starting:
                turn.put(slot, episode, self.automaton.state_of(episode.tokens))
            stats.prepare_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            sigma = float(self.sigma_at(version))
            first = lane.prefill(params, self.noise, sigma, entries, steps, max_rows=self.max_call_rows)
            cpu = time.thread_time()
            out = lane.decode(params, self.noise, sigma, steps, turn.state)
            stats.decode_cpu_s += time.thread_time() - cpu
            stats.model_s += time.perf_counter() - t0
            pending.append((lane, turn, first is not None, out))
            stats.model_rows += len(group)
            stats.calls += 1 + (lane.prefill_calls if first is not None else 0)
            stats.prefill_rows += len(entries)
            stats.decode_steps += steps
            stats.row_steps += lane.rows * steps

        ended: list[GenEpisode] = []
        turns: list[tuple[GenEpisode, list[int]]] = []  # (episode, reply tokens) of the turns not yet stepped
        with self._host_jobs(stats) as jobs:
            for lane, turn, prefilled, out in pending:
                t0, cpu = time.perf_counter(), time.thread_time()
                lane_ended, slots = self._read_tokens(turn, out, prefilled)
                stats.decode_cpu_s += time.thread_time() - cpu
                stats.model_s += time.perf_counter() - t0
                ended += lane_ended
                turns += self._end_turns(lane, turn, lane_ended, slots, stats)
                if self.pipelined and turns:  # a lane's episodes are its own: the worker and this thread share none
                    jobs.submit(self._step_turns, turns, jobs.stats, True)
                    turns = []
        self._step_turns(turns, stats, prepare_next=False)
        finished: list[Episode] = []
        for episode in ended:  # in the serial tick's order: freed rows are reused in it
            self._retire_if_over(episode, finished)
        return finished, stats

    def _prompt(self, episode: GenEpisode) -> list[int]:
        """The turn's prompt ids: built early by a pipelined tick, or now (and kept for the turn)."""
        if episode.prompt is None:
            episode.prompt = self.agent.prompt_ids(episode.observation, episode.available, episode.memory)
        return episode.prompt

    def _read_tokens(self, turn: TurnTokens, out: Any, prefilled: bool) -> tuple[list[GenEpisode], np.ndarray]:
        """Take a lane's decode call ``out`` (the prefilled rows' first tokens if the lane ``prefilled``, then the
        decode steps') into its rows' turns, with where the decode program found them to end; returns the episodes
        whose turn ended, in env-row order (the serial tick's), and their lane rows."""
        block, ends = decoded_parts(to_host(out))
        ending = self._take_block(turn, block if prefilled else block[1:], ends)
        slots = ending[np.argsort(turn.env_row[ending])]
        return turn.episode[slots].tolist(), slots

    def _take_block(self, turn: TurnTokens, block: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Append a call's tokens ``block [steps, lane rows]`` (the automaton's hole where a row took none) to the
        lane rows' turns, each until its turn is over (a stop token, a complete action or ``max_new_tokens``), as
        ``ends [3, lane rows]`` says (:func:`~esjax.agent.automaton.turn_ends` over the block: the decode
        program's). Returns the rows whose turn is over, ascending.

        The log takes the block as one slice and the turns their states and lengths as two, for every lane row at
        once (rows not live hold no turn: whatever they take is never read); only the rows :data:`LOOK` marks are
        then looked at. A reply the automaton can't read (a token that is not ASCII) is asked of the agent at each
        closing token."""
        turn.write(block)
        before = turn.count
        turn.state, turn.count = ends[0].copy(), ends[1].astype(np.int64)  # the host changes some below
        looking = np.flatnonzero(ends[2] >= LOOK)
        if not len(looking):
            return looking
        flags = ends[2, looking]
        complete, asking = (flags & COMPLETE) != 0, np.flatnonzero(flags & ASKING)
        if len(asking):
            rows = looking[asking]
            lengths = self.agent.action_lengths(turn.replies(rows), before[rows].tolist())
            found = lengths > 0
            complete[asking[found]] = True
            turn.count[rows[found]] = lengths[found]
        turn.complete[looking] = complete
        unread = looking[~complete & (turn.state[looking] == self.automaton.unread)]
        turn.state[unread] = UNKNOWN  # asked: it goes on
        return looking[complete | ((flags & OVER) != 0)]

    def _end_turns(self, lane: Lane, turn: TurnTokens, ended: list[GenEpisode], slots: np.ndarray,
                   stats: GenTickStats) -> list[tuple[GenEpisode, list[int]]]:
        """Take the ended turns' reply tokens and free their lane rows ``slots``: (episode, reply tokens) each."""
        replies = turn.replies(slots)
        lane.release(slots)
        turn.episode[slots] = None
        generated = sum(map(len, replies))
        stats.generated += generated
        stats.tokens += generated
        for episode in ended:
            episode.slot = -1
            episode.tokens = []
            episode.prompt = None
            episode.needs_prefill = True
        return list(zip(ended, replies))

    def _step_turns(self, ended: list[tuple[GenEpisode, list[int]]], stats: GenTickStats, prepare_next: bool
                    ) -> None:
        """Parse each ended turn's reply into its action, step the env rows in one batched pool call and take in
        what each sees; with ``prepare_next``, build the next turn's prompt of those still running (a pipelined
        tick: all of this runs on the host worker)."""
        if not ended:
            return
        t0 = time.perf_counter()
        turns = [(episode, *self.agent.parse(self.agent.decode(tokens))[:2]) for episode, tokens in ended]
        stats.prepare_s += time.perf_counter() - t0
        actions: list[str | None] = [None] * len(self.pool)
        for episode, _, action in turns:
            actions[episode.row] = action
        stats.rows += len(turns)
        t0 = time.perf_counter()
        results, failures = self._step(actions)
        available = self._available(list(results))
        stats.env_s += time.perf_counter() - t0
        for episode, reply, action in turns:
            if episode.row in failures:
                episode.done, episode.reward, episode.failure = True, 0.0, failures[episode.row]
                continue
            observation, reward, done, info = results[episode.row]
            episode.observation = observation
            self._acted(episode, reply, action, info, available[episode.row])
            stats.invalid_actions += not info.get("valid", True)
            if done:
                episode.done, episode.reward, episode.info = True, float(reward), info
        if prepare_next:
            t0 = time.perf_counter()
            for episode, _, _ in turns:
                if not episode.done and episode.steps < self.step_budget(episode):
                    self._prompt(episode)
            stats.prepare_s += time.perf_counter() - t0

