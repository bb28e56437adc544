"""A Ray-backed env pool: any task's sessions on other machines, same interface as the in-process pool.

Why: a policy forward on accelerators can outpace what one host's CPUs step (and the full 1.18 M-product
WebShop catalog takes many GB of RAM per copy). ``RayEnvPool`` keeps sessions in Ray actors — each actor builds
one in-process pool of its share of the sessions from a picklable recipe (``make_pool(n)``: the task's
:meth:`esjax.task.Task.pool_recipe`, e.g. WebShop's ``functools.partial(pool_of, spec)``) — placed anywhere in a
Ray cluster, while the trainer's rollout engine drives it through the batched API every pool shares
(``esjax.loop.protocols.EnvPool``: ``reset_rows``, ``step``, ``available_actions``, ``instructions``).
Session ``i`` lives on actor ``i % workers``; every call fans out to all actors at once and gathers in
session order. ``env.pool: ray`` in a run config builds one.

Ray is optional (``pip install 'esjax[ray]'``) and imported only when a pool is created.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from esjax.errors import EsjaxError
from esjax.loop.envpool import RowStep, StepResult, collect_step, failed_step, step_rows
from esjax.loop.protocols import EnvPool


class RayUnavailable(EsjaxError, ImportError):
    """Ray is not installed (``pip install 'esjax[ray]'``)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise RayUnavailable("RayEnvPool needs Ray: pip install 'esjax[ray]'") from err
    return ray


class _Sessions:
    """The actor body: one in-process pool of ``n`` sessions, ``make_pool(n)`` (built once per actor)."""

    def __init__(self, make_pool: Callable[[int], EnvPool], n: int) -> None:
        self.pool = make_pool(n)

    def reset(self, items: list[tuple[int, int | None]], _: None = None) -> list[tuple[str, dict]]:
        return self.pool.reset_rows([i for i, _ in items], [g for _, g in items])

    def step(self, items: list[tuple[int, str]], timeout: float | None = None) -> list[RowStep]:
        return step_rows(self.pool, items, timeout)

    def available(self, items: list[tuple[int, None]], _: None = None) -> list[dict]:
        return self.pool.available_actions([i for i, _ in items])

    def instructions(self, items: list[tuple[int, None]], _: None = None) -> list[str]:
        return self.pool.instructions([i for i, _ in items])


class RayEnvPool:
    """``n`` env sessions spread over ``workers`` Ray actors (the ``esjax.loop.protocols.EnvPool`` interface).

    Args:
      make_pool: a picklable recipe, ``make_pool(k)`` -> an in-process pool of ``k`` sessions (the task's
        :meth:`esjax.task.Task.pool_recipe`; whatever data it reads must exist on the actors' machines).
      n: number of sessions.
      workers: number of actors (``min(workers, n)``).
      address: Ray cluster address for ``ray.init`` when Ray is not initialized yet (None: local Ray, or the
        ``RAY_ADDRESS`` environment variable).
      actor_options: ``.options(...)`` for every actor, e.g. ``{"num_cpus": 2, "resources": {"cpu_node": 1}}``.
      timeout: seconds to wait for any call (a dead or stuck actor raises instead of hanging the trainer).

    A ``step`` with a ``timeout`` is timed in the actor, session by session, as on the in-process pool. An actor
    that dies during a step, or does not answer within ``timeout`` × (its stepped sessions + 1) seconds, is
    killed and replaced by a fresh one (``restarts`` counts them); the sessions it was stepping come back
    failed (``info['failure']``), and every session it held must be reset before it is stepped again.
    """

    def __init__(self, make_pool: Callable[[int], EnvPool], n: int, workers: int = 4, *, address: str | None = None,
                 actor_options: dict[str, Any] | None = None, timeout: float = 600.0) -> None:
        if n < 1 or workers < 1:
            raise ValueError(f"RayEnvPool: n and workers must be >= 1, got n={n}, workers={workers}")
        ray = self._ray = _ray()
        if not ray.is_initialized():
            with warnings.catch_warnings():  # JAX warns of any os.fork; Ray's is subprocess's fork + exec: safe
                warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        self.n, self.workers, self.timeout = n, min(workers, n), float(timeout)
        self._actor_cls = ray.remote(_Sessions)
        self._options = dict(actor_options or {"num_cpus": 1})
        self._make_pool, self.restarts = make_pool, 0
        self._actors = [self._new_actor(w) for w in range(self.workers)]
        self._get([a.instructions.remote([]) for a in self._actors])  # wait until every actor's pool is built
        self._obs = [""] * n
        self._done = np.zeros(n, dtype=bool)

    def _new_actor(self, w: int) -> Any:
        return self._actor_cls.options(**self._options).remote(self._make_pool, len(range(w, self.n, self.workers)))

    def _replace_actor(self, w: int) -> None:
        """Kill actor ``w`` (dead or stuck) and start a fresh one with fresh sessions."""
        self.restarts += 1
        self._ray.kill(self._actors[w])
        self._actors[w] = self._new_actor(w)
        self._get([self._actors[w].instructions.remote([])])

    def __len__(self) -> int:
        return self.n

    def _get(self, refs: list[Any]) -> list[Any]:
        try:
            return self._ray.get(refs, timeout=self.timeout)
        except self._ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"RayEnvPool: env actors did not answer within {self.timeout} s") from None

    def _scatter(self, method: str, items: Sequence[tuple[int, Any]], arg: Any = None,
                 wait: float | None = None) -> list[Any]:
        """Send ``(session, payload)`` items to their actors in one round; results in ``items`` order.

        ``wait``: seconds an actor may take per item it got (plus one); an actor that dies or does not answer
        in time is replaced and its items' results are None (without ``wait`` that raises instead).
        """
        per_actor: list[list[tuple[int, Any]]] = [[] for _ in range(self.workers)]
        for i, payload in items:
            if not 0 <= i < self.n:
                raise IndexError(f"RayEnvPool: session {i} out of range 0..{self.n - 1}")
            per_actor[i % self.workers].append((i // self.workers, payload))
        refs = [getattr(actor, method).remote(batch, arg) for actor, batch in zip(self._actors, per_actor)]
        if wait is None:
            answers = self._get(refs)
        else:
            sent, answers, gone = time.monotonic(), [], []
            lost = (self._ray.exceptions.GetTimeoutError, getattr(self._ray.exceptions, "RayActorError", OSError))
            for w, ref in enumerate(refs):
                left = sent + wait * (len(per_actor[w]) + 1) - time.monotonic()
                try:
                    answers.append(self._ray.get(ref, timeout=max(0.0, left)))
                except lost:
                    gone.append(w)
                    answers.append([None] * len(per_actor[w]))
            for w in gone:  # after every actor had its time: a replacement takes seconds
                self._replace_actor(w)
        results: dict[int, Any] = {}
        for w, outs in enumerate(answers):
            for (local, _), out in zip(per_actor[w], outs):
                results[local * self.workers + w] = out
        return [results[i] for i, _ in items]

    def reset(self, goal_indices: Sequence[int | None]) -> tuple[list[str], list[dict]]:
        """Reset every session (``goal_indices[i]`` for session i; None = a random goal)."""
        self._check(goal_indices)
        out = self.reset_rows(range(self.n), goal_indices)
        return [o for o, _ in out], [info for _, info in out]

    def reset_rows(self, rows: Sequence[int], goal_indices: Sequence[int | None]) -> list[tuple[str, dict]]:
        """Reset session ``rows[k]`` to goal ``goal_indices[k]``: (first observation, info) per row."""
        out = self._scatter("reset", list(zip(rows, goal_indices, strict=True)))
        for i, (obs, _) in zip(rows, out):
            self._obs[i], self._done[i] = obs, False
        return out

    def reset_one(self, i: int, goal_index: int | None) -> tuple[str, dict]:
        return self.reset_rows([i], [goal_index])[0]

    def step(self, actions: Sequence[str | None], timeout: float | None = None) -> StepResult:
        """One action per session (None = leave it alone); ``timeout``: seconds one session's step may take."""
        self._check(actions)
        live = [(i, a) for i, a in enumerate(actions) if a is not None]
        outs = self._scatter("step", live, timeout, wait=timeout)
        outs = [failed_step(f"timeout: env actor {i % self.workers} did not answer in time; replaced")
                if out is None else out for (i, _), out in zip(live, outs)]
        return collect_step(self.n, live, outs, self._obs, self._done)

    def available_actions(self, rows: Sequence[int] | None = None) -> list[dict]:
        """What each session's page allows (``rows``; None = every session)."""
        return self._scatter("available", [(i, None) for i in (range(self.n) if rows is None else rows)])

    def instructions(self, rows: Sequence[int] | None = None) -> list[str]:
        """Each session's goal instruction (``rows``; None = every session)."""
        return self._scatter("instructions", [(i, None) for i in (range(self.n) if rows is None else rows)])

    def _check(self, batch: Sequence[Any]) -> None:
        if len(batch) != self.n:
            raise ValueError(f"expected {self.n} entries (one per session), got {len(batch)}")

    def close(self) -> None:
        """Stop the actors (the Ray cluster itself stays up)."""
        for actor in getattr(self, "_actors", []):
            self._ray.kill(actor)
        self._actors = []

    def __enter__(self) -> RayEnvPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
