"""Many sessions over one shared Shop, stepped in batches; optionally spread over worker processes.

``EnvPool`` keeps every session in this process (one catalog and index, as DESIGN.md asks).
``ProcessEnvPool`` splits sessions across worker processes that each build the shop from a picklable
:class:`ShopSpec` (once per worker) — for CPU-heavy use where one core cannot keep up. Both take one
action per session per ``step`` (None = leave that session alone this tick) and return lists/arrays
in session order.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import traceback
from collections.abc import Sequence

import numpy as np

from .env import WebShopTextEnv
from .shop import Shop, ShopSpec, get_shop

StepResult = tuple[list[str], np.ndarray, np.ndarray, list[dict]]


class EnvPool:
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
        infos = []
        for i, g in enumerate(goal_indices):
            self._obs[i], info = self.envs[i].reset(g)
            self._done[i] = False
            infos.append(info)
        return list(self._obs), infos

    def replace_env(self, i: int) -> None:
        """Give session ``i`` a fresh env (its old one failed or hung); reset it before stepping it."""
        self.envs[i] = WebShopTextEnv(self.shop, **self._env_kwargs)
        self._obs[i], self._done[i] = "", False

    def reset_one(self, i: int, goal_index: int | None) -> tuple[str, dict]:
        self._obs[i], info = self.envs[i].reset(goal_index)
        self._done[i] = False
        return self._obs[i], info

    def step(self, actions: Sequence[str | None]) -> StepResult:
        self._check(actions)
        rewards = np.zeros(len(self.envs))
        infos: list[dict] = []
        for i, action in enumerate(actions):
            if action is None:
                infos.append({"skipped": True})
                continue
            self._obs[i], rewards[i], self._done[i], info = self.envs[i].step(action)
            infos.append(info)
        return list(self._obs), rewards, self._done.copy(), infos

    def available_actions(self) -> list[dict]:
        return [env.available_actions() for env in self.envs]

    @property
    def instructions(self) -> list[str]:
        return [env.instruction for env in self.envs]

    def _check(self, batch: Sequence) -> None:
        if len(batch) != len(self.envs):
            raise ValueError(f"expected {len(self.envs)} entries (one per session), got {len(batch)}")


def _worker(conn, spec: ShopSpec, n: int, env_kwargs: dict) -> None:
    try:
        pool = EnvPool(get_shop(spec), n, **env_kwargs)
        conn.send(("ok", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        cmd, arg = conn.recv()
        try:
            if cmd == "close":
                conn.send(("ok", None))
                return
            if cmd == "reset":
                out = [pool.reset_one(i, g) for i, g in arg]
            elif cmd == "step":
                out = []
                for i, action in arg:
                    obs, reward, done, info = pool.envs[i].step(action)
                    out.append((obs, reward, done, info))
            elif cmd == "available":
                out = [pool.envs[i].available_actions() for i in arg]
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
    the crash (exactly so when the envs are seeded, ``seed=``). After ``max_restarts`` replacements in
    total the pool gives up with a RuntimeError. ``restarts`` counts them.
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
        for conn in self._conns:
            self._recv(conn)
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
        conn.send(("reset", [(i // self.workers, self._history[i][0]) for i in sessions]))
        self._recv(conn)
        for t in range(max(len(self._history[i][1]) for i in sessions)):
            batch = [(i // self.workers, self._history[i][1][t]) for i in sessions if t < len(self._history[i][1])]
            conn.send(("step", batch))
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

    def _scatter(self, cmd: str, items: Sequence) -> list:
        """Send session-indexed items to their workers; return the results in session order."""
        per_worker: list[list] = [[] for _ in range(self.workers)]
        for i, item in items:
            per_worker[i % self.workers].append((i // self.workers, item))
        def message(w: int):
            batch = per_worker[w]
            return cmd, batch if cmd != "available" else [local for local, _ in batch]

        lost = set()
        for w, conn in enumerate(self._conns):
            try:
                conn.send(message(w))
            except OSError:
                lost.add(w)
        results: dict[int, object] = {}
        for w in range(self.workers):
            while True:
                try:
                    if w in lost:  # the command never reached a live worker: replace it, send again
                        self._replace_worker(w)
                        self._conns[w].send(message(w))
                        lost.discard(w)
                    outs = self._recv(self._conns[w])
                    break
                except (WorkerLost, OSError):
                    lost.add(w)
            for (local, _), out in zip(per_worker[w], outs):
                results[local * self.workers + w] = out
        return [results[i] for i, _ in items]

    def reset(self, goal_indices: Sequence[int | None]) -> tuple[list[str], list[dict]]:
        if len(goal_indices) != self.n:
            raise ValueError(f"expected {self.n} goal indices, got {len(goal_indices)}")
        out = self._scatter("reset", list(enumerate(goal_indices)))
        self._history = [(g, []) for g in goal_indices]
        self._obs = [o for o, _ in out]
        self._done[:] = False
        return list(self._obs), [info for _, info in out]

    def step(self, actions: Sequence[str | None]) -> StepResult:
        if len(actions) != self.n:
            raise ValueError(f"expected {self.n} actions, got {len(actions)}")
        live = [(i, a) for i, a in enumerate(actions) if a is not None]
        rewards = np.zeros(self.n)
        infos: list[dict] = [{"skipped": True} for _ in range(self.n)]
        for (i, action), (obs, reward, done, info) in zip(live, self._scatter("step", live)):
            self._obs[i], rewards[i], self._done[i], infos[i] = obs, reward, done, info
            if self._history[i] is not None:
                self._history[i][1].append(action)
        return list(self._obs), rewards, self._done.copy(), infos

    def available_actions(self) -> list[dict]:
        return self._scatter("available", [(i, None) for i in range(self.n)])

    def close(self) -> None:
        for conn, proc in zip(self._conns, self._procs):
            try:
                conn.send(("close", None))
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
