"""Many sessions over one shared Shop, stepped in batches; optionally spread over worker processes.

``EnvPool`` keeps every session in this process (one catalog and index, as DESIGN.md asks).
``ProcessEnvPool`` splits sessions across worker processes that each build the shop from a picklable
:class:`ShopSpec` (once per worker) — for CPU-heavy use where one core cannot keep up. Both take one
action per session per ``step`` (None = leave that session alone this tick) and return lists/arrays
in session order.
"""

from __future__ import annotations

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


class ProcessEnvPool:
    """``n`` sessions spread round-robin over ``workers`` processes (session i -> worker i % workers).

    Uses the 'spawn' start method by default: forking a process that has started JAX's thread pools is
    unsafe. Use as a context manager or call ``close()``.
    """

    def __init__(self, spec: ShopSpec, n: int, workers: int = 2, start_method: str = "spawn", **env_kwargs):
        if n < 1 or workers < 1:
            raise ValueError("n and workers must be >= 1")
        self.n = n
        self.workers = min(workers, n)
        ctx = mp.get_context(start_method)
        self._conns, self._procs = [], []
        for w in range(self.workers):
            parent, child = ctx.Pipe()
            local = len(range(w, n, self.workers))
            proc = ctx.Process(target=_worker, args=(child, spec, local, env_kwargs), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        for conn in self._conns:
            self._recv(conn)
        self._obs = [""] * n
        self._done = np.zeros(n, dtype=bool)

    def __len__(self) -> int:
        return self.n

    @staticmethod
    def _recv(conn):
        status, payload = conn.recv()
        if status != "ok":
            raise RuntimeError(f"env worker failed:\n{payload}")
        return payload

    def _scatter(self, cmd: str, items: Sequence) -> list:
        """Send session-indexed items to their workers; return the results in session order."""
        per_worker: list[list] = [[] for _ in range(self.workers)]
        for i, item in items:
            per_worker[i % self.workers].append((i // self.workers, item))
        for conn, batch in zip(self._conns, per_worker):
            conn.send((cmd, batch if cmd != "available" else [local for local, _ in batch]))
        results: dict[int, object] = {}
        for w, conn in enumerate(self._conns):
            for (local, _), out in zip(per_worker[w], self._recv(conn)):
                results[local * self.workers + w] = out
        return [results[i] for i, _ in items]

    def reset(self, goal_indices: Sequence[int | None]) -> tuple[list[str], list[dict]]:
        if len(goal_indices) != self.n:
            raise ValueError(f"expected {self.n} goal indices, got {len(goal_indices)}")
        out = self._scatter("reset", list(enumerate(goal_indices)))
        self._obs = [o for o, _ in out]
        self._done[:] = False
        return list(self._obs), [info for _, info in out]

    def step(self, actions: Sequence[str | None]) -> StepResult:
        if len(actions) != self.n:
            raise ValueError(f"expected {self.n} actions, got {len(actions)}")
        live = [(i, a) for i, a in enumerate(actions) if a is not None]
        rewards = np.zeros(self.n)
        infos: list[dict] = [{"skipped": True} for _ in range(self.n)]
        for (i, _), (obs, reward, done, info) in zip(live, self._scatter("step", live)):
            self._obs[i], rewards[i], self._done[i], infos[i] = obs, reward, done, info
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
