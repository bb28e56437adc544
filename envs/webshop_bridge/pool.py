"""Many sessions over one shared Shop, stepped in batches; optionally spread over worker processes.

``InProcessEnvPool`` keeps every session in this process (one catalog and index, as DESIGN.md asks).
``ProcessEnvPool`` splits sessions across worker processes that each build the shop from a picklable
:class:`ShopSpec` (once per worker) — for CPU-heavy use where one core cannot keep up. Both (and
``esjax.envpool_ray.RayEnvPool``) share one batched API, the one the trainer's rollout engine drives
(``esjax.loop.protocols.EnvPool``): ``reset_rows(rows, goals)``, ``step(actions, timeout=None)`` with one
action per session (None = leave that session alone this tick), ``available_actions(rows)`` and
``instructions(rows)``, each answering in row order; ``reset(goals)`` resets every session.

A session whose step raises, or takes longer than ``timeout`` seconds, fails alone: that row comes back
``done`` with reward 0 and ``info['failure']`` naming why (``'error: ...'`` / ``'timeout: ...'``), the
other rows are unaffected, and a hung session is replaced by a fresh one (reset it before stepping it again).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sys
import threading
import time
import traceback
from collections.abc import Sequence

import numpy as np

from .env import WebShopTextEnv
from .shop import Shop, ShopSpec, get_shop

StepResult = tuple[list[str], np.ndarray, np.ndarray, list[dict]]
#: One stepped row: (observation, reward, done, info); a failed row has ``info['failure']``.
RowStep = tuple[str, float, bool, dict]


def failed_step(reason: str) -> RowStep:
    """The result of a row whose step failed: no observation, done, reward 0, ``info['failure'] = reason``."""
    return "", 0.0, True, {"failure": reason}


def collect_step(n: int, live: Sequence[tuple[int, str]], outs: Sequence[RowStep], obs: list[str],
                 done: np.ndarray) -> StepResult:
    """A pool's ``step`` answer from the rows it stepped (``live``: (row, action), ``outs`` in the same order);
    updates the pool's last observations ``obs`` and ``done`` flags in place."""
    rewards = np.zeros(n)
    infos: list[dict] = [{"skipped": True} for _ in range(n)]
    for (i, _), (observation, reward, finished, info) in zip(live, outs):
        obs[i], rewards[i], done[i], infos[i] = observation, reward, finished, info
    return list(obs), rewards, done.copy(), infos


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

        ``timeout`` (None: no limit): the steps run on a helper thread; a step past the limit fails its row,
        its session is replaced (:meth:`replace_env`) and the thread is abandoned; the rows after it go on.
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
            thread = threading.Thread(target=batch.run, name="esjax-env-step", daemon=True)
            thread.start()
            hung = None
            while thread.is_alive():
                thread.join(poll)
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
        """Nothing to release (the same call as on the process and Ray pools)."""

    def _rows(self, rows: Sequence[int] | None) -> Sequence[int]:
        return range(len(self.envs)) if rows is None else rows

    def _check(self, batch: Sequence) -> None:
        if len(batch) != len(self.envs):
            raise ValueError(f"expected {len(self.envs)} entries (one per session), got {len(batch)}")


class _StepBatch:
    """Steps ``rows`` in order, recording each row's result or failure (run inline or on a thread)."""

    def __init__(self, rows: list[int], envs: Sequence[WebShopTextEnv], actions: dict[int, str]):
        self.rows, self.envs, self.actions = rows, list(envs), actions
        self.outs: dict[int, RowStep] = {}
        self.lock = threading.Lock()
        self.pos = 0
        self.started = time.monotonic()
        self.cancelled = False
        self.finished = False

    def run(self) -> None:
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


def _worker(conn, spec: ShopSpec, n: int, env_kwargs: dict) -> None:
    try:
        pool = InProcessEnvPool(get_shop(spec), n, **env_kwargs)
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

    A worker process that dies (killed, out of memory, a crash in native code) is replaced: a new one
    builds the shop, every session it owned is reset to its goal and its actions since that reset are
    replayed, and the interrupted command is sent again — the caller sees the same results as without
    the crash (exactly so when the envs are seeded, ``seed=``). A ``step`` with a ``timeout`` is timed in the
    worker, session by session, as on :class:`InProcessEnvPool`; a worker that does not answer at all within
    ``timeout`` × (its stepped sessions + 1) seconds is killed and replaced the same way, and the sessions it
    was stepping come back failed (``info['failure']``, reset them before stepping them again). After
    ``max_restarts`` replacements in total the pool gives up with a RuntimeError. ``restarts`` counts them.
    """

    def __init__(self, spec: ShopSpec, n: int, workers: int = 2, start_method: str = "spawn",
                 max_restarts: int = 10, **env_kwargs):
        if n < 1 or workers < 1:
            raise ValueError("n and workers must be >= 1")
        self.n = n
        self.workers = min(workers, n)
        self.max_restarts = max_restarts
        self.restarts = 0
        self._spec, self._env_kwargs = spec, env_kwargs
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
        proc = self._ctx.Process(target=_worker, args=(child, self._spec, local, self._env_kwargs), daemon=True)
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


def __getattr__(name: str):
    if name == "EnvPool":  # the former name (the trainer's protocol is esjax.loop.protocols.EnvPool)
        import warnings

        warnings.warn("envs.webshop_bridge EnvPool is now InProcessEnvPool", DeprecationWarning, stacklevel=2)
        return InProcessEnvPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
