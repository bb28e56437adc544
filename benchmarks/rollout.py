"""Rollout-loop throughput against its floor: the same policy calls through the bare jitted programs.

Runs the trainer (``python -m esjax.run`` minus the CLI) on a config twice in one process: a warm-up run that
compiles every program, then the timed run with the same seed (so the same shapes, nothing to compile). While
the timed run goes, every policy call's padded shape is counted and one example input per shape is kept. Then
each shape's bare program (noise preparation + candidate scoring on device arrays, no host work) is timed on
its example, and the floor is ``Σ calls(shape) × bare seconds(shape)``: what the loop would take if the host
cost nothing. Printed:

- env steps per wall second and per CPU second (process time, all threads) of the loop proper (the trainer's
  ``run``: ticks, updates, evaluations, checkpoints) and of the whole job (start-up: loading the shop and the
  policy; end: plots and summary), scored tokens per second;
- the loop/floor ratio (``floor seconds / loop seconds``; 1.0 = the loop runs at the model's pace);
- the per-tick breakdown from ``TickStats`` (prepare: prompts and candidates; model: padding, dispatch,
  device compute, reading back; env: env steps; other: bookkeeping, updates, evaluations, checkpoints);
- padding efficiency (real tokens / computed tokens) and the compiled-program count of the warm-up run.

    python benchmarks/rollout.py                                  # configs/default.yaml, 3 updates
    python benchmarks/rollout.py --model 30m --updates 1          # a ~30M-parameter Qwen2-shaped random model
    python benchmarks/rollout.py --quick                          # seconds: tiny random model (tests)
    python benchmarks/rollout.py --simulate-device 0.9            # no model: a device taking 0.9 ms per row
    python benchmarks/rollout.py --config configs/generate.yaml --simulate-device 0.9 --decode-ms 0.5

``--simulate-device MS`` (the serial tick, then the pipelined one) predicts the loop on an accelerator from a
CPU: every policy call still does its host work (prompts, candidates, tokenising, padding, host-to-device
copies, reading scores back) but its compiled programs are replaced by a simulated device that takes ``MS``
milliseconds per padded row, one call after another, without host CPU (the scores it returns are zeros: every
candidate ties). The floor is then the device's busy time, and the loop's own cost is measured as CPU time:
host microseconds per env step of the whole process and of the loop's own thread (the one that dispatches the
device's work; a pipelined tick's env steps and next prompts run on a host worker thread beside it), and wall time
by part. With a generate-mode config the decode lanes' programs are simulated instead (``MS`` per prefilled row,
``--decode-ms`` per decode step of a lane; every reply writes ``--reply``), and the loop thread's CPU is reported
per decode call and per decode step.

Timings need an otherwise idle machine: the load average is printed with the results.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import esjax.loop.generate_rollout as generate  # noqa: E402
import esjax.train.parts as parts  # noqa: E402
import esjax.train.session as session  # noqa: E402
from esjax.agent.automaton import START, turn_ends  # noqa: E402
from esjax.agent.lanes import DECODE_FIELDS, LanePrograms  # noqa: E402
from esjax.agent.scoring import DEVICE_PROGRAMS as SCORING  # noqa: E402
from esjax.agent.scoring import ScoringPrograms  # noqa: E402
from esjax.config import load_config  # noqa: E402
from esjax.loop.generate_rollout import GenerateEngine  # noqa: E402
from esjax.loop.rollout import RolloutEngine, TickStats  # noqa: E402
from esjax.rundir.machine import machine_info  # noqa: E402
from esjax.train.hooks import Hooks  # noqa: E402

#: A ~30M-parameter Qwen2-shaped model (random weights: the throughput, not the policy, is measured).
MODEL_30M = {"model_type": "qwen2", "vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1536,
             "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
             "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
             "tie_word_embeddings": True, "hidden_act": "silu", "eos_token_id": 1, "pad_token_id": 0}

#: Qwen2.5-0.5B's shape (random weights), issue 33's reference model for the loop on an accelerator.
MODEL_05B = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
             "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
             "tie_word_embeddings": True, "hidden_act": "silu", "eos_token_id": 151643, "pad_token_id": 151643}

TINY = ["model.source=random", "es.population=4", "schedule.slots=4", "env.tasks_per_member=2", "env.eval_goals=4",
        "env.max_steps=4"]


class Recorder:
    """Counts policy-call shapes, keeps one example input per shape, sums ``TickStats`` of every tick (an ``on_tick``
    hook), and times the loop proper (the trainer's ``run``)."""

    def __init__(self) -> None:
        self.active = False
        self.ticks = 0
        self.stats = TickStats()
        self.shape_calls: Counter = Counter()
        self.examples: dict[tuple, tuple] = {}
        self.compiled: set[tuple] = set()
        self.loop_seconds = self.loop_cpu_seconds = self.loop_thread_cpu_seconds = 0.0
        self.last_perturbation = None
        self.hooks = Hooks()
        self.hooks.on_tick(self._ticked)

    def _ticked(self, trainer, tick) -> None:
        if self.active:
            self.ticks += 1
            self.stats.add(tick.stats)

    def programs(self) -> ScoringPrograms:
        """The real scoring programs, recording each call's shape and one example input per shape."""
        recorder = self

        def recorded_program(config, params, prepared, *arrays):
            key = tuple(a.shape for a in arrays) + ((None if prepared is None else prepared.groups),)
            recorder.compiled.add(key)
            if recorder.active:
                recorder.shape_calls[key] += 1
                recorder.examples.setdefault(key, (config, params, recorder.last_perturbation, arrays))
            return SCORING.score(config, params, prepared, *arrays)

        def recorded_prepare(perturbation, params):
            recorder.last_perturbation = perturbation
            return SCORING.prepare(perturbation, params)

        return ScoringPrograms(score=recorded_program, prepare=recorded_prepare)

    def trainer_class(self) -> type:
        """The trainer with its ``run`` timed: the loop proper (ticks, updates, evaluations, checkpoints), without
        start-up and end-of-run files."""
        recorder = self

        class TimedTrainer(session.Trainer):
            def run(self, *args, **kwargs):
                start, start_cpu, start_thread = time.perf_counter(), time.process_time(), time.thread_time()
                try:
                    return super().run(*args, **kwargs)
                finally:
                    if recorder.active:
                        recorder.loop_seconds += time.perf_counter() - start
                        recorder.loop_cpu_seconds += time.process_time() - start_cpu
                        recorder.loop_thread_cpu_seconds += time.thread_time() - start_thread
        return TimedTrainer

    def bare_seconds(self, key: tuple, repeats: int) -> float:
        """Median wall seconds of one shape's bare call (noise + program, inputs already on device)."""
        config, params, perturbation, arrays = self.examples[key]
        arrays = [jax.device_put(a) for a in arrays]

        def call():
            prepared = None if perturbation is None else SCORING.prepare(perturbation, params)
            return SCORING.score(config, params, prepared, *arrays)

        jax.block_until_ready(call())
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(call())
            times.append(time.perf_counter() - start)
        return float(np.median(times))


@contextlib.contextmanager
def built_with(recorder: Recorder, *, pipelined: bool = True, scoring: ScoringPrograms | None = None,
               generate_engine: Any = None):
    """Trainers built inside this block use ``recorder``'s timed trainer, score-mode engines with the given tick
    (``pipelined``) and programs (default: the recorder's), and ``generate_engine`` (a factory taking the engine's
    arguments; default: the pipelined or serial GenerateEngine with the real programs): the names the trainer's
    parts are built from, put back afterwards."""
    saved = session.Trainer, parts.RolloutEngine, generate.GenerateEngine
    session.Trainer = recorder.trainer_class()
    parts.RolloutEngine = functools.partial(RolloutEngine, pipelined=pipelined, programs=scoring or recorder.programs())
    generate.GenerateEngine = generate_engine or functools.partial(GenerateEngine, pipelined=pipelined)
    try:
        yield
    finally:
        session.Trainer, parts.RolloutEngine, generate.GenerateEngine = saved


class SimulatedDevice:
    """Stands in for the scoring programs: a call is "dispatched" at once and its output becomes readable when a
    device that runs one call at a time, ``seconds_per_row`` per padded row, would have finished it. Reading it
    sleeps (no CPU) until then."""

    def __init__(self, seconds_per_row: float) -> None:
        self.seconds_per_row = seconds_per_row
        self.free_at = 0.0  # perf_counter time the simulated device finishes its queued calls
        self.busy_seconds = self.waited_seconds = 0.0

    def program(self, config, params, prepared, *arrays):
        rows = arrays[0].shape[0]
        cost = rows * self.seconds_per_row
        self.free_at = max(self.free_at, time.perf_counter()) + cost
        self.busy_seconds += cost
        return _SimulatedOutput(self, self.free_at, (rows, arrays[2].shape[1]))

    def programs(self) -> ScoringPrograms:
        """The scoring programs of this device (noise preparation is device work too: nothing on the host)."""
        return ScoringPrograms(score=self.program, prepare=lambda perturbation, params: None)


class _SimulatedOutput:
    """A pending output of :class:`SimulatedDevice` (zeros) or :class:`SimulatedLaneDevice` (``values``);
    ``np.asarray`` waits for it like a device array."""

    def __init__(self, device: SimulatedDevice, ready_at: float, shape: tuple[int, ...],
                 values: np.ndarray | None = None) -> None:
        self.device, self.ready_at, self.shape, self.values = device, ready_at, shape, values

    def __array__(self, dtype=None, copy=None):
        wait = self.ready_at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
            self.device.waited_seconds += wait
        if self.values is not None:
            return self.values if dtype is None else self.values.astype(dtype)
        return np.zeros(self.shape, dtype or np.float32)

    def __getitem__(self, index):
        values = self.values[index]
        return _SimulatedOutput(self.device, self.ready_at, values.shape, values)


class SimulatedLaneDevice(SimulatedDevice):
    """Generate mode's stand-in: replaces the decode lanes' programs (prefill, insert, decode, shift) by a serial
    device taking ``seconds_per_row`` per prefilled row and ``seconds_per_step`` per decode step of a lane (decoding
    is bound by reading the weights once per step, whatever the rows). Every row writes ``reply`` token by token
    (token ``n`` of a turn is ``reply[n]``), so turns end, are parsed and step the env as in a real run; what the
    policy would write is not simulated (nor constrained turns: the choices pass through unchanged)."""

    def __init__(self, seconds_per_row: float, seconds_per_step: float, reply: str) -> None:
        super().__init__(seconds_per_row)
        self.seconds_per_step = seconds_per_step
        self.reply = reply
        self.reply_ids: np.ndarray | None = None  # the reply in the run's tokenizer, set by the engine hook
        self.engine: GenerateEngine | None = None  # the run's engine, set by the engine hook
        self._decoded: dict[tuple[int, int], np.ndarray] = {}  # a decode call's output by (live + fresh, count)
        self.decode_calls = self.decode_steps = self.prefill_rows = 0
        self.decode_cpu_seconds = 0.0  # the host CPU of this stand-in's decode calls (not the engine's)

    def _queue(self, cost: float, values: np.ndarray) -> _SimulatedOutput:
        self.free_at = max(self.free_at, time.perf_counter()) + cost
        self.busy_seconds += cost
        return _SimulatedOutput(self, self.free_at, values.shape, values)

    def _tokens(self, counts) -> np.ndarray:
        return self.reply_ids[np.asarray(counts) % len(self.reply_ids)].astype(np.int32)

    def prefill(self, config, sampling, params, prepared, tokens, mask, lo, hi, counts, greedy, choices=None,
                alive=None):
        self.prefill_rows += tokens.shape[0]
        return None, None, self._queue(tokens.shape[0] * self.seconds_per_row, self._tokens(counts)), alive

    def decode(self, config, sampling, params, prepared, cache, cur, fields, choices=None, alive=None, turns=None,
               events=None, *, steps):
        """What the decode program returns with a turn automaton (the engine's lanes have one): as every turn writes
        the reply from its start, a row's output depends only on whether it is live, just prefilled, and its count,
        so it is looked up in a table made once."""
        cpu = time.thread_time()
        self.decode_calls += 1
        self.decode_steps += steps
        key = (steps, self.engine.max_new_tokens)  # every engine of a run has the same agent (automaton)
        if key not in self._decoded:
            self._decoded[key] = self._decode_table(steps)
        table = self._decoded[key]
        counts = table.shape[1] // 3
        count, live, fresh = (np.asarray(fields)[DECODE_FIELDS.index(name)] for name in ("count", "live", "fresh"))
        column = (live + fresh) * counts + np.minimum(count, counts - 1)
        output = self._queue(steps * self.seconds_per_step, table[:, column])
        self.decode_cpu_seconds += time.thread_time() - cpu
        return cache, cur, output, alive

    def _decode_table(self, steps: int) -> np.ndarray:
        """``[1 + steps + 3, 3 * counts]``: a decode call's output column of a row not live, live, just prefilled,
        by the turn's count (:func:`esjax.agent.lanes._decode`)."""
        engine = self.engine
        automaton, counts = engine.automaton, engine.max_new_tokens + steps + 1
        reply = np.resize(self.reply_ids, counts + steps).astype(np.int32)
        walk = automaton.advance(np.array([START], np.int32), reply[:, None])[:, 0]
        after = np.concatenate([[START], walk])  # the state after each count of tokens
        count = np.arange(counts)
        columns = count[:, None] + np.arange(steps + 1)
        table = np.empty((1 + steps + 3, 3, counts), np.int32)
        for kind in range(3):  # not live, live, just prefilled
            fresh = np.full(counts, kind == 2)
            table[0, kind] = np.where(fresh, reply[count - 1], automaton.hole)
            table[1:1 + steps, kind] = reply[columns[:, :-1]].T
            table[1 + steps:, kind] = turn_ends(after[columns], count, np.full(counts, kind > 0),
                                                automaton.events(engine.max_new_tokens))
        return table.reshape(len(table), -1)

    def lane_programs(self) -> LanePrograms:
        """The decode lanes' programs of this device: prefill and decode as above; inserting rows, shifting the cache
        and preparing noise are device work that costs the host nothing here."""
        return LanePrograms(prefill=self.prefill, decode=self.decode,
                            insert=lambda cache, k_new, v_new, mask, rows, cur, first: (cache, cur),
                            shift=lambda cache, shift: cache, prepare=lambda perturbation, params: None)

    def engine_factory(self, pipelined: bool) -> Any:
        """Builds the run's GenerateEngine on this device's programs, learning the reply's tokens (the run's
        tokenizer) before and the engine (its automaton) after."""
        device = self

        def build(pool, agent, *args, **kwargs):
            device.reply_ids = np.asarray(agent.tokenizer.encode(device.reply, add_special_tokens=False).ids)
            device.engine = GenerateEngine(pool, agent, *args, pipelined=pipelined,
                                           lane_programs=device.lane_programs(), **kwargs)
            return device.engine
        return build


def measure_simulated(config_path: str, overrides: list[str], milliseconds_per_row: float,
                      pipelined: bool = True) -> dict[str, Any]:
    """The loop against a simulated device (see the module docstring): loop/floor and host µs per env step, with
    the pipelined tick or the serial one (``RolloutEngine(pipelined=False)``)."""
    recorder = Recorder()
    device = SimulatedDevice(milliseconds_per_row / 1000)
    with built_with(recorder, pipelined=pipelined, scoring=device.programs()):
        run_config(config_path, overrides, recorder.hooks)  # warm-up: compiles the update and evaluation programs
        device.busy_seconds = device.waited_seconds = 0.0
        recorder.active = True
        result = run_config(config_path, overrides, recorder.hooks)
    s, steps = recorder.stats, max(recorder.stats.rows, 1)
    model_host = s.model_s - device.waited_seconds
    per_step = {"prepare": s.prepare_s, "model (host part)": model_host, "env": s.env_s,
                "of which on the host worker": s.worker_s,  # prepare and env of a pipelined tick, beside the loop
                "other": recorder.loop_seconds - (s.prepare_s + s.env_s - s.worker_s) - s.model_s}
    return {
        "config": config_path, "overrides": overrides, "machine": machine_info(),
        "simulated_ms_per_row": milliseconds_per_row, "pipelined": pipelined, "updates": result.version,
        "ticks": recorder.ticks, "env_steps": s.rows, "calls": s.calls,
        "padded_rows": sum(shape[0] for shape in s.shapes), "loop_seconds": recorder.loop_seconds,
        "loop_cpu_seconds": recorder.loop_cpu_seconds, "loop_thread_cpu_seconds": recorder.loop_thread_cpu_seconds,
        "device_busy_seconds": device.busy_seconds, "waited_seconds": device.waited_seconds,
        "loop_vs_floor": device.busy_seconds / recorder.loop_seconds,
        "host_us_per_env_step": 1e6 * recorder.loop_cpu_seconds / steps,
        "loop_thread_us_per_env_step": 1e6 * recorder.loop_thread_cpu_seconds / steps,
        "host_wall_us_per_env_step_by_part": {k: 1e6 * v / steps for k, v in per_step.items()},
    }


def measure_simulated_generate(config_path: str, overrides: list[str], milliseconds_per_row: float,
                               milliseconds_per_step: float, reply: str, pipelined: bool = True) -> dict[str, Any]:
    """Generate mode against :class:`SimulatedLaneDevice`: loop/floor and the loop thread's CPU per decode call and
    per decode step, with the pipelined tick or the serial one (``GenerateEngine(pipelined=False)``)."""
    recorder = Recorder()
    recorder.stats = generate.GenTickStats()  # generate mode's ticks count lanes, rows and steps too
    device = SimulatedLaneDevice(milliseconds_per_row / 1000, milliseconds_per_step / 1000, reply)
    with built_with(recorder, generate_engine=device.engine_factory(pipelined)):
        run_config(config_path, overrides, recorder.hooks)  # warm-up: compiles the update programs
        device.busy_seconds = device.waited_seconds = 0.0
        device.decode_calls = device.decode_steps = device.prefill_rows = 0
        device.decode_cpu_seconds = 0.0
        recorder.active = True
        result = run_config(config_path, overrides, recorder.hooks)
    s, calls, steps = recorder.stats, max(device.decode_calls, 1), max(device.decode_steps, 1)
    return {
        "config": config_path, "overrides": overrides, "machine": machine_info(), "mode": "generate",
        "pipelined": pipelined,
        "simulated_ms_per_row": milliseconds_per_row, "simulated_ms_per_decode_step": milliseconds_per_step,
        "reply": reply, "updates": result.version, "ticks": recorder.ticks, "env_steps": s.rows,
        "decode_calls": device.decode_calls, "decode_steps": device.decode_steps, "prefill_rows": device.prefill_rows,
        "loop_seconds": recorder.loop_seconds, "loop_cpu_seconds": recorder.loop_cpu_seconds,
        "loop_thread_cpu_seconds": recorder.loop_thread_cpu_seconds,
        "device_busy_seconds": device.busy_seconds, "waited_seconds": device.waited_seconds,
        "loop_vs_floor": device.busy_seconds / recorder.loop_seconds,
        "loop_thread_us_per_decode_call": 1e6 * recorder.loop_thread_cpu_seconds / calls,
        "loop_thread_us_per_decode_step": 1e6 * recorder.loop_thread_cpu_seconds / steps,
        "decode_path_cpu_us_per_decode_step": 1e6 * s.decode_cpu_s / steps,
        # the same without the simulated device's own host work in its decode calls (a real call's dispatch instead)
        "decode_path_cpu_us_per_decode_step_engine": 1e6 * (s.decode_cpu_s - device.decode_cpu_seconds) / steps,
        "turns_ended_per_decode_step": s.rows / steps,
        "lane_row_steps": s.row_steps,
        "model_host_us_per_decode_step": 1e6 * (s.model_s - device.waited_seconds) / steps,
        "prepare_us_per_prefill": 1e6 * s.prepare_s / max(device.prefill_rows, 1),
        "host_us_per_decode_step": 1e6 * recorder.loop_cpu_seconds / steps,
        "host_wall_s_by_part": {"prepare": s.prepare_s, "model (host part)": s.model_s - device.waited_seconds,
                                "env": s.env_s, "of which on the host worker": s.worker_s,
                                "other": recorder.loop_seconds - (s.prepare_s + s.env_s - s.worker_s) - s.model_s},
    }


def report_simulated_generate(r: dict[str, Any]) -> str:
    parts = ", ".join(f"{k} {v:.1f}" for k, v in r["host_wall_s_by_part"].items())
    return "\n".join([
        *_simulated_head(r),
        f"  generate mode, {'pipelined' if r['pipelined'] else 'serial'} tick, simulated device: "
        f"{r['simulated_ms_per_row']} ms per prefilled row, "
        f"{r['simulated_ms_per_decode_step']} ms per decode step; every reply {r['reply']!r}",
        f"  {r['decode_calls']} decode calls ({r['decode_steps']} lane steps), {r['prefill_rows']} prefilled rows, "
        f"{r['env_steps']} env steps",
        _simulated_floor(r),
        f"  CPU of the loop's own thread: {r['loop_thread_us_per_decode_call']:.0f} µs per decode call, "
        f"{r['loop_thread_us_per_decode_step']:.0f} µs per decode step (process, all threads: "
        f"{r['host_us_per_decode_step']:.0f} µs per decode step); of it in the decode steps' own path (dispatch, "
        f"token intake): {r['decode_path_cpu_us_per_decode_step']:.0f} µs per decode step, "
        f"{r['decode_path_cpu_us_per_decode_step_engine']:.0f} µs without the simulated device's own decode calls "
        f"({r['turns_ended_per_decode_step']:.1f} turns ended per decode step)",
        f"  host wall by part (s, device waits excluded): {parts}; per decode step the model's host part "
        f"{r['model_host_us_per_decode_step']:.0f} µs (lanes of {r['lane_row_steps'] / max(r['decode_steps'], 1):.0f}"
        f" rows on average), per prefilled row the prompt {r['prepare_us_per_prefill']:.0f} µs",
    ])


def report_simulated(r: dict[str, Any]) -> str:
    parts = ", ".join(f"{k} {v:.0f}" for k, v in r["host_wall_us_per_env_step_by_part"].items())
    return "\n".join([
        *_simulated_head(r),
        f"  {'pipelined' if r['pipelined'] else 'serial'} tick, simulated device: {r['simulated_ms_per_row']} ms "
        f"per padded row; {r['calls']} calls, "
        f"{r['padded_rows']} padded rows for {r['env_steps']} env steps",
        _simulated_floor(r),
        f"  host CPU per env step: {r['host_us_per_env_step']:.0f} µs (process CPU time of the loop, all threads), "
        f"of which the loop's own thread {r['loop_thread_us_per_env_step']:.0f} µs (the rest: env-step thread or "
        f"workers, XLA's threads for updates and evaluations' bookkeeping)",
        f"  host wall per env step by part (µs, device waits excluded): {parts}",
    ])


def _simulated_head(r: dict[str, Any]) -> list[str]:
    return [f"{r['config']} {' '.join(r['overrides'])}",
            f"  machine: {r['machine']['cpu']}, {r['machine']['cores']} cores, load {r['machine']['loadavg']}"]


def _simulated_floor(r: dict[str, Any]) -> str:
    return (f"  loop vs simulated-device floor: {r['loop_vs_floor']:.2f} (device busy {r['device_busy_seconds']:.1f} s "
            f"of {r['loop_seconds']:.1f} s; the loop waited for it {r['waited_seconds']:.1f} s)")


def run_config(config_path: str, overrides: list[str], hooks: Hooks | None = None) -> Any:
    config = load_config(config_path, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        return session.train(config, Path(tmp) / "run", hooks=hooks)


def _progress(began: float, message: str) -> None:
    """One line on stderr per phase, so a run cut off by a time limit still says where its time went."""
    print(f"[rollout {time.perf_counter() - began:6.1f} s] {message}", file=sys.stderr, flush=True)


def measure(config_path: str, overrides: list[str], repeats: int = 5) -> dict[str, Any]:
    began = time.perf_counter()
    recorder = Recorder()
    with built_with(recorder):
        _progress(began, "warm-up run (compiles every program)")
        start = time.perf_counter()
        run_config(config_path, overrides, recorder.hooks)  # warm-up: compiles every program of this run
        warm_seconds = time.perf_counter() - start
        programs = len(recorder.compiled)
        _progress(began, f"timed run ({programs} programs compiled)")
        recorder.active = True
        start, start_cpu = time.perf_counter(), time.process_time()
        result = run_config(config_path, overrides, recorder.hooks)
        job_seconds, job_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        recorder.active = False
        loop_seconds, loop_cpu = recorder.loop_seconds, recorder.loop_cpu_seconds
    _progress(began, f"floor: {len(recorder.shape_calls)} shapes' bare programs, {repeats} repeats each")
    floor = sum(n * recorder.bare_seconds(key, repeats) for key, n in recorder.shape_calls.items())
    s = recorder.stats
    evals = [r for r in result.records if r.get("kind") == "eval"]
    return {
        "config": config_path, "overrides": overrides, "machine": machine_info(),
        "updates": result.version, "ticks": recorder.ticks, "env_steps": s.rows, "model_rows": s.model_rows,
        "calls": s.calls, "loop_seconds": loop_seconds, "loop_cpu_seconds": loop_cpu,
        "job_seconds": job_seconds, "job_cpu_seconds": job_cpu,
        "job_env_steps_per_s": s.rows / job_seconds, "job_env_steps_per_cpu_s": s.rows / max(job_cpu, 1e-9),
        "env_steps_per_s": s.rows / loop_seconds, "env_steps_per_cpu_s": s.rows / max(loop_cpu, 1e-9),
        "tokens_per_s": s.tokens / loop_seconds, "floor_seconds": floor, "loop_vs_floor": floor / loop_seconds,
        "padding_efficiency": s.tokens / max(s.padded_tokens, 1),
        "breakdown_s": {"prepare": s.prepare_s, "model": s.model_s, "env": s.env_s,
                        "other": loop_seconds - s.prepare_s - s.model_s - s.env_s},
        "programs": programs, "warmup_seconds_incl_compile": warm_seconds,
        "shapes": {str(k[:4]): n for k, n in recorder.shape_calls.most_common()},
        "final_eval": evals[-1]["score"] if evals else None,
    }


def report(r: dict[str, Any]) -> str:
    b = r["breakdown_s"]
    total = r["loop_seconds"]
    lines = [
        f"{r['config']} {' '.join(r['overrides'])}",
        f"  machine: {r['machine']['cpu']}, {r['machine']['cores']} cores, load {r['machine']['loadavg']}",
        f"  {r['updates']} updates, {r['ticks']} ticks, {r['env_steps']} env steps, {r['calls']} policy calls "
        f"in {total:.1f} s ({r['loop_cpu_seconds']:.1f} CPU s) of the loop; the whole job (start-up, plots and "
        f"summary included) {r['job_seconds']:.1f} s ({r['job_cpu_seconds']:.1f} CPU s)",
        f"  env steps/s {r['env_steps_per_s']:.0f}, per CPU-second {r['env_steps_per_cpu_s']:.0f} (whole job: "
        f"{r['job_env_steps_per_s']:.0f}, {r['job_env_steps_per_cpu_s']:.0f}); "
        f"scored tokens/s {r['tokens_per_s']:.0f}",
        f"  loop vs bare-forward floor: {r['loop_vs_floor']:.2f} (floor {r['floor_seconds']:.1f} s of "
        f"{total:.1f} s)",
        f"  per tick: prepare {b['prepare'] / total:.0%}, model {b['model'] / total:.0%}, env {b['env'] / total:.0%}, "
        f"other {b['other'] / total:.0%}",
        f"  padding efficiency {r['padding_efficiency']:.2f}; {r['programs']} compiled scoring programs "
        f"(warm-up run incl. compile {r['warmup_seconds_incl_compile']:.0f} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--model", choices=["config", "30m", "0.5b"], default="config",
                    help="30m / 0.5b: replace the config's policy by a ~30M-parameter or a Qwen2.5-0.5B-shaped "
                         "random model")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides (key=value)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats of each bare program")
    ap.add_argument("--quick", action="store_true", help="tiny random model, 1 update (a smoke test)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--simulate-device", type=float, metavar="MS", default=None,
                    help="no model: a simulated device taking MS milliseconds per padded row of a policy call")
    ap.add_argument("--decode-ms", type=float, default=0.5,
                    help="generate mode with --simulate-device: milliseconds per decode step of a lane")
    ap.add_argument("--reply", default="search[women's long sleeve cotton shirt, size medium, price under 30 dollars]",
                    help="generate mode with --simulate-device: what every simulated reply writes")
    args = ap.parse_args(argv)
    overrides = [f"run.updates={args.updates}", "run.progress=false", "run.eval_every=1000",
                 "run.checkpoint_every=1000"]
    if args.model != "config":
        shape = MODEL_30M if args.model == "30m" else MODEL_05B
        overrides += ["model.source=random", f"model.random_config={json.dumps(shape)}"]
    if args.quick:
        overrides = [o for o in overrides if not o.startswith("run.updates")] + ["run.updates=1"] + TINY
        args.repeats = 1
    generate_mode = load_config(args.config, overrides + args.set).agent.mode == "generate"
    if args.simulate_device is not None and generate_mode:  # the serial tick first, as below
        runs = [measure_simulated_generate(args.config, overrides + args.set, args.simulate_device, args.decode_ms,
                                           args.reply, pipelined) for pipelined in (False, True)]
        for run in runs:
            print(report_simulated_generate(run))
        serial, result = runs
        result["serial"] = serial
        print(f"  pipelined / serial: loop wall {result['loop_seconds'] / serial['loop_seconds']:.2f}×, "
              f"loop/floor {serial['loop_vs_floor']:.2f} → {result['loop_vs_floor']:.2f}")
    elif args.simulate_device is not None:  # the serial tick first: the baseline of the same run
        serial = measure_simulated(args.config, overrides + args.set, args.simulate_device, pipelined=False)
        print(report_simulated(serial))
        result = measure_simulated(args.config, overrides + args.set, args.simulate_device, pipelined=True)
        print(report_simulated(result))
        result["serial"] = serial
        print(f"  pipelined / serial: loop wall {result['loop_seconds'] / serial['loop_seconds']:.2f}×, "
              f"loop/floor {serial['loop_vs_floor']:.2f} → {result['loop_vs_floor']:.2f}")
    else:
        result = measure(args.config, overrides + args.set, args.repeats)
        print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
