"""A Ray-backed env pool: WebShop sessions on other machines, same interface as the in-process pool.

Why: a policy forward on accelerators can outpace what one host's CPUs step (and the full 1.18 M-product
catalog takes many GB of RAM per copy). ``RayEnvPool`` keeps sessions in Ray actors — each actor builds
the shop once from a picklable :class:`~envs.webshop_bridge.shop.ShopSpec` and holds an
:class:`~envs.webshop_bridge.pool.EnvPool` — placed anywhere in a Ray cluster, while the trainer keeps calling
``reset`` / ``step`` / ``available_actions`` exactly as on ``EnvPool`` / ``ProcessEnvPool``. Session ``i``
lives on actor ``i % workers``; every call fans out to all actors at once and gathers in session order.

Ray is optional (``pip install 'esjax[ray]'``) and imported only when a pool is created.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

StepResult = tuple[list[str], np.ndarray, np.ndarray, list[dict]]


class RayUnavailable(ImportError):
    """Ray is not installed (``pip install 'esjax[ray]'``)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise RayUnavailable("RayEnvPool needs Ray: pip install 'esjax[ray]'") from err
    return ray


class _Sessions:
    """The actor body: one EnvPool of ``n`` sessions over the shop of ``spec`` (built once per actor)."""

    def __init__(self, spec: Any, n: int, env_kwargs: dict[str, Any]) -> None:
        from envs.webshop_bridge.pool import EnvPool
        from envs.webshop_bridge.shop import get_shop

        self.pool = EnvPool(get_shop(spec), n, **env_kwargs)

    def reset(self, items: list[tuple[int, int | None]]) -> list[tuple[str, dict]]:
        return [self.pool.reset_one(i, g) for i, g in items]

    def step(self, items: list[tuple[int, str]]) -> list[tuple[str, float, bool, dict]]:
        return [tuple(self.pool.envs[i].step(a)) for i, a in items]

    def available(self, items: list[tuple[int, None]]) -> list[dict]:
        return [self.pool.envs[i].available_actions() for i, _ in items]

    def instructions(self, items: list[tuple[int, None]]) -> list[str]:
        return [self.pool.envs[i].instruction for i, _ in items]


class RayEnvPool:
    """``n`` WebShop sessions spread over ``workers`` Ray actors (the ``EnvPool`` interface).

    Args:
      spec: a ``ShopSpec`` (picklable recipe; the data path must exist on the actors' machines).
      n: number of sessions.
      workers: number of actors (``min(workers, n)``).
      address: Ray cluster address for ``ray.init`` when Ray is not initialized yet (None: local Ray, or the
        ``RAY_ADDRESS`` environment variable).
      actor_options: ``.options(...)`` for every actor, e.g. ``{"num_cpus": 2, "resources": {"cpu_node": 1}}``.
      timeout: seconds to wait for any call (a dead or stuck actor raises instead of hanging the trainer).
      env_kwargs: passed to every ``WebShopTextEnv``.
    """

    def __init__(self, spec: Any, n: int, workers: int = 4, *, address: str | None = None,
                 actor_options: dict[str, Any] | None = None, timeout: float = 600.0, **env_kwargs: Any) -> None:
        if n < 1 or workers < 1:
            raise ValueError(f"RayEnvPool: n and workers must be >= 1, got n={n}, workers={workers}")
        ray = self._ray = _ray()
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        self.n, self.workers, self.timeout = n, min(workers, n), float(timeout)
        actor_cls = ray.remote(_Sessions)
        options = dict(actor_options or {"num_cpus": 1})
        self._actors = [actor_cls.options(**options).remote(spec, len(range(w, n, self.workers)), dict(env_kwargs))
                        for w in range(self.workers)]
        self._get([a.instructions.remote([]) for a in self._actors])  # wait until every shop is built
        self._obs = [""] * n
        self._done = np.zeros(n, dtype=bool)

    def __len__(self) -> int:
        return self.n

    def _get(self, refs: list[Any]) -> list[Any]:
        try:
            return self._ray.get(refs, timeout=self.timeout)
        except self._ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"RayEnvPool: env actors did not answer within {self.timeout} s") from None

    def _scatter(self, method: str, items: Sequence[tuple[int, Any]]) -> list[Any]:
        """Send ``(session, payload)`` items to their actors in one round; results in ``items`` order."""
        per_actor: list[list[tuple[int, Any]]] = [[] for _ in range(self.workers)]
        for i, payload in items:
            if not 0 <= i < self.n:
                raise IndexError(f"RayEnvPool: session {i} out of range 0..{self.n - 1}")
            per_actor[i % self.workers].append((i // self.workers, payload))
        refs = [getattr(actor, method).remote(batch) for actor, batch in zip(self._actors, per_actor)]
        results: dict[int, Any] = {}
        for w, outs in enumerate(self._get(refs)):
            for (local, _), out in zip(per_actor[w], outs):
                results[local * self.workers + w] = out
        return [results[i] for i, _ in items]

    def reset(self, goal_indices: Sequence[int | None]) -> tuple[list[str], list[dict]]:
        """Reset every session (``goal_indices[i]`` for session i; None = a random goal)."""
        self._check(goal_indices)
        out = self._scatter("reset", list(enumerate(goal_indices)))
        self._obs = [o for o, _ in out]
        self._done[:] = False
        return list(self._obs), [info for _, info in out]

    def reset_one(self, i: int, goal_index: int | None) -> tuple[str, dict]:
        ((obs, info),) = self._scatter("reset", [(i, goal_index)])
        self._obs[i], self._done[i] = obs, False
        return obs, info

    def step(self, actions: Sequence[str | None]) -> StepResult:
        """One action per session (None = leave it alone this tick)."""
        self._check(actions)
        live = [(i, a) for i, a in enumerate(actions) if a is not None]
        rewards = np.zeros(self.n)
        infos: list[dict] = [{"skipped": True} for _ in range(self.n)]
        for (i, _), (obs, reward, done, info) in zip(live, self._scatter("step", live)):
            self._obs[i], rewards[i], self._done[i], infos[i] = obs, reward, done, info
        return list(self._obs), rewards, self._done.copy(), infos

    def available_actions(self) -> list[dict]:
        return self._scatter("available", [(i, None) for i in range(self.n)])

    @property
    def instructions(self) -> list[str]:
        return self._scatter("instructions", [(i, None) for i in range(self.n)])

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
