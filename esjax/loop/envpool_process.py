"""``ProcessEnvPool``: any task's in-process sessions spread over worker processes on this machine (``env.pool:
process``), with the same batched API and failure semantics, and crash recovery: a worker that dies is replaced and
its sessions' actions replayed.

Each worker builds one in-process pool of its share of the sessions from the task's picklable recipe
(``make_pool(n)``: :meth:`esjax.task.Task.pool_recipe`, the one Ray actors use), so a task that can run in Ray
actors runs in worker processes too.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from esjax.loop.envpool import StepResult, collect_step, failed_step

if TYPE_CHECKING:  # a task's env worker processes import this module: it stays light
    from esjax.loop.protocols import EnvPool


def _worker(conn, make_pool: Callable[[int], EnvPool], n: int) -> None:
    try:
        pool = make_pool(n)
        conn.send(("ok", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        cmd, batch, arg = conn.recv()
        try:
            if cmd == "close":
                conn.send(("ok", None))
                return
            rows = [i for i, _ in batch]
            if cmd == "reset":
                out = pool.reset_rows(rows, [g for _, g in batch])
            elif cmd == "step":
                out = pool.step_rows(batch, arg)
            elif cmd == "available":
                out = pool.available_actions(rows)
            elif cmd == "instructions":
                out = pool.instructions(rows)
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", out))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


class WorkerLost(RuntimeError):
    """An env worker process died (or its pipe broke) while serving a command."""


class ProcessEnvPool:
    """``n`` sessions spread round-robin over ``workers`` processes (session i -> worker i % workers).

    Uses the 'spawn' start method by default: forking a process that has started JAX's thread pools is
    unsafe. Use as a context manager or call ``close()``.

    ``make_pool(n)``: a picklable recipe for ``n`` in-process sessions (a task's :meth:`~esjax.task.Task.pool_recipe`).
    A worker process that dies (killed, out of memory, a crash in native code) is replaced: a new one
    builds its pool, every session it owned is reset to its goal and its actions since that reset are
    replayed, and the interrupted command is sent again — the caller sees the same results as without
    the crash (exactly so when the envs are seeded, ``seed=``). A ``step`` with a ``timeout`` is timed in the
    worker, session by session, as in the in-process pool; a worker that does not answer at all within
    ``timeout`` × (its stepped sessions + 1) seconds is killed and replaced the same way, and the sessions it
    was stepping come back failed (``info['failure']``, reset them before stepping them again). After
    ``max_restarts`` replacements in total the pool gives up with a RuntimeError. ``restarts`` counts them.
    """

    def __init__(self, make_pool: Callable[[int], EnvPool], n: int, workers: int = 2, start_method: str = "spawn",
                 max_restarts: int = 10):
        if n < 1 or workers < 1:
            raise ValueError("n and workers must be >= 1")
        self.n = n
        self.workers = min(workers, n)
        self.max_restarts = max_restarts
        self.restarts = 0
        self._make_pool = make_pool
        self._ctx = mp.get_context(start_method)
        self._conns, self._procs = [], []
        for w in range(self.workers):
            conn, proc = self._spawn(w)
            self._conns.append(conn)
            self._procs.append(proc)
        for w, conn in enumerate(self._conns):
            try:
                self._recv(conn)
            except WorkerLost:
                message = self._startup_failure(w)
                self.close()
                raise WorkerLost(message) from None
        self._obs = [""] * n
        self._done = np.zeros(n, dtype=bool)
        # What a replacement worker replays: each session's goal and its actions since that reset.
        self._history: list[tuple[int | None, list[str]] | None] = [None] * n

    def _spawn(self, w: int):
        parent, child = self._ctx.Pipe()
        local = len(range(w, self.n, self.workers))
        proc = self._ctx.Process(target=_worker, args=(child, self._make_pool, local), daemon=True)
        proc.start()
        child.close()
        return parent, proc

    def _startup_failure(self, w: int) -> str:
        """Why worker ``w`` died before it was ready, in one message that says what to check."""
        proc = self._procs[w]
        proc.join(timeout=5)
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None)
        hint = ""
        if self._ctx.get_start_method() != "fork" and script:
            hint = (f" With the {self._ctx.get_start_method()!r} start method every worker imports the main module "
                    f"again ({script}); the usual cause: that script builds a ProcessEnvPool (or runs the trainer "
                    "with env.pool: process) outside `if __name__ == '__main__':`, so each worker tries to start "
                    "workers of its own and dies. Put that code under the guard.")
        return f"env worker {w} exited during start-up (exit code {proc.exitcode}).{hint}"

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (worker w serves sessions w, w + workers, ...)."""
        return [proc.pid for proc in self._procs]

    def _replace_worker(self, w: int) -> None:
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise RuntimeError(f"env worker {w} died again; gave up after {self.max_restarts} replacements")
        old = self._procs[w]
        if old.is_alive():
            old.kill()
        old.join(timeout=5)
        with contextlib.suppress(OSError):
            self._conns[w].close()
        conn, proc = self._spawn(w)
        self._conns[w], self._procs[w] = conn, proc
        self._recv(conn)
        sessions = [i for i in range(w, self.n, self.workers) if self._history[i] is not None]
        if not sessions:
            return
        conn.send(("reset", [(i // self.workers, self._history[i][0]) for i in sessions], None))
        self._recv(conn)
        for t in range(max(len(self._history[i][1]) for i in sessions)):
            batch = [(i // self.workers, self._history[i][1][t]) for i in sessions if t < len(self._history[i][1])]
            conn.send(("step", batch, None))
            self._recv(conn)

    def __len__(self) -> int:
        return self.n

    @staticmethod
    def _recv(conn):
        try:
            status, payload = conn.recv()
        except (EOFError, OSError) as err:
            raise WorkerLost(f"env worker connection lost ({err.__class__.__name__})") from err
        if status != "ok":
            raise RuntimeError(f"env worker failed:\n{payload}")
        return payload

    def _scatter(self, cmd: str, items: Sequence, arg=None, wait: float | None = None) -> list:
        """Send session-indexed items to their workers; return the results in session order.

        ``wait``: seconds a worker may take per item it got (plus one); one that does not answer in time is
        replaced (its items' sessions are forgotten, not replayed) and its items' results are None.
        """
        per_worker: list[list] = [[] for _ in range(self.workers)]
        for i, item in items:
            per_worker[i % self.workers].append((i // self.workers, item))
        deadline: dict[int, float] = {}
        replacing = 0.0  # seconds spent replacing dead workers in this call: not held against the others

        def send(w: int) -> None:
            self._conns[w].send((cmd, per_worker[w], arg))
            if wait is not None:
                deadline[w] = time.monotonic() + wait * (len(per_worker[w]) + 1)

        lost, hung = set(), []
        for w in range(self.workers):
            try:
                send(w)
            except OSError:
                lost.add(w)
        results: dict[int, object] = {}
        for w in range(self.workers):
            while True:
                try:
                    if w in lost:  # the command never reached a live worker: replace it, send again
                        started = time.monotonic()
                        self._replace_worker(w)
                        replacing += time.monotonic() - started
                        send(w)
                        lost.discard(w)
                    left = None if wait is None else deadline[w] + replacing - time.monotonic()
                    if left is not None and not self._conns[w].poll(max(0.0, left)):
                        hung.append(w)
                        outs = [None] * len(per_worker[w])
                    else:
                        outs = self._recv(self._conns[w])
                    break
                except (WorkerLost, OSError):
                    lost.add(w)
            for (local, _), out in zip(per_worker[w], outs):
                results[local * self.workers + w] = out
        for w in hung:  # after every worker had its time: forget the hung one's stepped sessions, replace it
            for local, _ in per_worker[w]:
                self._history[local * self.workers + w] = None
            self._replace_worker(w)
        return [results[i] for i, _ in items]

    def reset(self, goal_indices: Sequence[int | None]) -> tuple[list[str], list[dict]]:
        if len(goal_indices) != self.n:
            raise ValueError(f"expected {self.n} goal indices, got {len(goal_indices)}")
        out = self.reset_rows(range(self.n), goal_indices)
        return [o for o, _ in out], [info for _, info in out]

    def reset_rows(self, rows: Sequence[int], goal_indices: Sequence[int | None]) -> list[tuple[str, dict]]:
        """Reset session ``rows[k]`` to goal ``goal_indices[k]``: (first observation, info) per row."""
        items = list(zip(rows, goal_indices, strict=True))
        out = self._scatter("reset", items)
        for (i, g), (obs, _) in zip(items, out):
            self._history[i] = (g, [])
            self._obs[i], self._done[i] = obs, False
        return out

    def reset_one(self, i: int, goal_index: int | None) -> tuple[str, dict]:
        return self.reset_rows([i], [goal_index])[0]

    def step(self, actions: Sequence[str | None], timeout: float | None = None) -> StepResult:
        """One action per session (None = leave it alone); ``timeout``: seconds one session's step may take."""
        if len(actions) != self.n:
            raise ValueError(f"expected {self.n} actions, got {len(actions)}")
        live = [(i, a) for i, a in enumerate(actions) if a is not None]
        outs = self._scatter("step", live, timeout, wait=timeout)
        for k, ((i, action), out) in enumerate(zip(live, outs)):
            if out is None:
                outs[k] = failed_step(f"timeout: env worker {i % self.workers} did not answer in time; replaced")
            elif "failure" in out[3]:
                self._history[i] = None  # failed: reset before use, never replayed
            elif self._history[i] is not None:
                self._history[i][1].append(action)
        return collect_step(self.n, live, outs, self._obs, self._done)

    def available_actions(self, rows: Sequence[int] | None = None) -> list[dict]:
        """What each session's page allows (``rows``; None = every session)."""
        return self._scatter("available", [(i, None) for i in (range(self.n) if rows is None else rows)])

    def instructions(self, rows: Sequence[int] | None = None) -> list[str]:
        """Each session's goal instruction (``rows``; None = every session)."""
        return self._scatter("instructions", [(i, None) for i in (range(self.n) if rows is None else rows)])

    def close(self) -> None:
        for conn, proc in zip(self._conns, self._procs):
            try:
                conn.send(("close", None, None))
                conn.recv()
            except (OSError, EOFError, BrokenPipeError):
                pass
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
        self._conns, self._procs = [], []

    def __enter__(self) -> ProcessEnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_procs", None):
            self.close()
