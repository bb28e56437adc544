"""Many sessions over one shared Shop, stepped in batches.

``InProcessEnvPool`` keeps every session in this process (one catalog and index, as DESIGN.md asks).
:class:`~envs.webshop_bridge.process_pool.ProcessEnvPool` splits sessions across worker processes that each
build the shop from a picklable :class:`ShopSpec` (once per worker) — for CPU-heavy use where one core cannot
keep up. Both (and ``esjax.parallel.envpool_ray.RayEnvPool``) share one batched API, the one the trainer's
rollout engine drives (``esjax.loop.protocols.EnvPool``): ``reset_rows(rows, goals)``, ``step(actions,
timeout=None)`` with one action per session (None = leave that session alone this tick),
``available_actions(rows)`` and ``instructions(rows)``, each answering in row order; ``reset(goals)`` resets every
session. Their row answers are esjax's (:mod:`esjax.loop.envpool`).

A session whose step raises, or takes longer than ``timeout`` seconds, fails alone: that row comes back
``done`` with reward 0 and ``info['failure']`` naming why (``'error: ...'`` / ``'timeout: ...'``), the
other rows are unaffected, and a hung session is replaced by a fresh one (reset it before stepping it again).
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Sequence

import numpy as np

from esjax.loop.envpool import RowStep, StepResult, collect_step, failed_step

from .env import WebShopTextEnv
from .shop import Shop


class InProcessEnvPool:
    """``n`` :class:`WebShopTextEnv` sessions sharing ``shop``."""

    def __init__(self, shop: Shop, n: int, **env_kwargs):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.shop = shop
        self._env_kwargs = env_kwargs
        self.envs = [WebShopTextEnv(shop, **env_kwargs) for _ in range(n)]
        self._obs = [""] * n
        self._done = np.zeros(n, dtype=bool)
        self._stepper: _Stepper | None = None  # the helper thread of steps with a time limit

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self, goal_indices: Sequence[int | None]) -> tuple[list[str], list[dict]]:
        """Reset every session (``goal_indices[i]`` for session i; None = a random goal)."""
        self._check(goal_indices)
        out = self.reset_rows(range(len(self.envs)), goal_indices)
        return [o for o, _ in out], [info for _, info in out]

    def reset_rows(self, rows: Sequence[int], goal_indices: Sequence[int | None]) -> list[tuple[str, dict]]:
        """Reset session ``rows[k]`` to goal ``goal_indices[k]``: (first observation, info) per row."""
        out = []
        for i, g in zip(rows, goal_indices, strict=True):
            self._obs[i], info = self.envs[i].reset(g)
            self._done[i] = False
            out.append((self._obs[i], info))
        return out

    def reset_one(self, i: int, goal_index: int | None) -> tuple[str, dict]:
        return self.reset_rows([i], [goal_index])[0]

    def replace_env(self, i: int) -> None:
        """Give session ``i`` a fresh env (its old one failed or hung); reset it before stepping it."""
        self.envs[i] = WebShopTextEnv(self.shop, **self._env_kwargs)
        self._obs[i], self._done[i] = "", False

    def step(self, actions: Sequence[str | None], timeout: float | None = None) -> StepResult:
        """One action per session (None = leave it alone); ``timeout``: seconds one session's step may take."""
        self._check(actions)
        live = [(i, a) for i, a in enumerate(actions) if a is not None]
        return collect_step(len(self.envs), live, self.step_rows(live, timeout), self._obs, self._done)

    def step_rows(self, items: Sequence[tuple[int, str]], timeout: float | None = None) -> list[RowStep]:
        """Step ``(row, action)`` items one row at a time, in order, so one failing session fails only itself.

        ``timeout`` (None: no limit): the steps run on the pool's helper thread (one, kept between calls: a
        pipelined tick steps a few rows many times per tick, and a new thread per call cost ~0.7 ms); a step
        past the limit fails its row, its session is replaced (:meth:`replace_env`) and the thread, stuck in
        that step, is abandoned for a new one; the rows after it go on.
        """
        rows = [i for i, _ in items]
        actions = dict(items)
        outs: dict[int, RowStep] = {}
        if timeout is None:
            batch = _StepBatch(rows, self.envs, actions)
            batch.run()
            outs.update(batch.outs)
        poll = min(0.25, timeout / 4) if timeout is not None else 0.0
        while timeout is not None and rows:
            batch = _StepBatch(rows, self.envs, actions)
            if self._stepper is None:
                self._stepper = _Stepper()
                weakref.finalize(self, self._stepper.stop)  # its thread ends with the pool
            self._stepper.jobs.put(batch)
            hung = None
            while not batch.done.wait(poll):
                with batch.lock:
                    if batch.finished:
                        break
                    if time.monotonic() - batch.started > timeout:
                        batch.cancelled = True  # the thread drops whatever it does from now on
                        hung = batch.pos
                        break
            with batch.lock:
                outs.update(batch.outs)
            if hung is None:
                break
            row = rows[hung]
            outs[row] = failed_step(f"timeout: env step took longer than {timeout:g} s")
            self._stepper.stop()  # its thread is still in the hung step: abandoned, it ends if the step returns
            self._stepper = None
            self.replace_env(row)  # the hung session may still be running on the abandoned thread
            rows = rows[hung + 1:]
        return [outs[i] for i, _ in items]

    def available_actions(self, rows: Sequence[int] | None = None) -> list[dict]:
        """What each session's page allows (``rows``; None = every session)."""
        return [self.envs[i].available_actions() for i in self._rows(rows)]

    def instructions(self, rows: Sequence[int] | None = None) -> list[str]:
        """Each session's goal instruction (``rows``; None = every session)."""
        return [self.envs[i].instruction for i in self._rows(rows)]

    def close(self) -> None:
        """End the helper thread of timed steps, if one runs (the same call as on the process and Ray pools)."""
        if self._stepper is not None:
            self._stepper.stop()
            self._stepper = None

    def _rows(self, rows: Sequence[int] | None) -> Sequence[int]:
        return range(len(self.envs)) if rows is None else rows

    def _check(self, batch: Sequence) -> None:
        if len(batch) != len(self.envs):
            raise ValueError(f"expected {len(self.envs)} entries (one per session), got {len(batch)}")


class _Stepper:
    """A daemon thread running the step batches put on its queue, one after another, until :meth:`stop`."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_StepBatch | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, args=(self.jobs,), name="esjax-env-step", daemon=True).start()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while (batch := jobs.get()) is not None:
            batch.run()

    def stop(self) -> None:
        """The thread ends after the batch it is running (if any)."""
        self.jobs.put(None)


class _StepBatch:
    """Steps ``rows`` in order, recording each row's result or failure (run inline or on a thread); ``done`` is
    set when it returns."""

    def __init__(self, rows: list[int], envs: Sequence[WebShopTextEnv], actions: dict[int, str]):
        self.rows, self.envs, self.actions = rows, list(envs), actions
        self.outs: dict[int, RowStep] = {}
        self.lock = threading.Lock()
        self.pos = 0
        self.started = time.monotonic()
        self.cancelled = False
        self.finished = False
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.done.set()

    def _run(self) -> None:
        for pos, row in enumerate(self.rows):
            with self.lock:
                if self.cancelled:
                    return
                self.pos, self.started = pos, time.monotonic()
            try:
                out = tuple(self.envs[row].step(self.actions[row]))
            except Exception as err:  # noqa: BLE001 - any env failure ends only this episode
                text = str(err).splitlines()[0][:200] if str(err) else ""
                out = failed_step(f"error: {err.__class__.__name__}: {text}".rstrip(": "))
            with self.lock:
                if self.cancelled:
                    return
                self.outs[row] = out
        with self.lock:
            self.finished = True


def __getattr__(name: str):
    if name == "EnvPool":  # the former name (the trainer's protocol is esjax.loop.protocols.EnvPool)
        import warnings

        warnings.warn("envs.webshop_bridge EnvPool is now InProcessEnvPool", DeprecationWarning, stacklevel=2)
        return InProcessEnvPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
