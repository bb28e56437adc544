"""What every env pool shares, whatever its task: one row's step answer, a failed row, the info of a row a step
left alone, and a pool's ``step`` answer assembled from the rows it stepped.

The pools of a task package (``envs.webshop_bridge.pool.InProcessEnvPool``, BabyAI's ``BabyAIEnvPool``) and the core's
(``esjax.loop.envpool_process.ProcessEnvPool``, ``esjax.parallel.envpool_ray.RayEnvPool``,
``esjax.parallel.envrows.ProcessRowsPool``) answer
:meth:`esjax.loop.protocols.EnvPool.step` with these, so a failed or skipped row looks the same from every pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

StepResult = tuple[list[str], np.ndarray, np.ndarray, list[dict]]
#: One stepped row: (observation, reward, done, info); a failed row has ``info['failure']``.
RowStep = tuple[str, float, bool, dict]


def failed_step(reason: str) -> RowStep:
    """The result of a row whose step failed: no observation, done, reward 0, ``info['failure'] = reason``."""
    return "", 0.0, True, {"failure": reason}


#: The info of a row a step left alone: one read-only mapping shared by every such row, because a pipelined tick
#: steps a few rows of a large pool many times per tick, and a fresh dict per pool row per call fed the garbage
#: collector (3 ms per call with ~750 rows in `benchmarks/rollout.py --simulate-device`).
SKIPPED: Mapping[str, Any] = MappingProxyType({"skipped": True})


def collect_step(n: int, live: Sequence[tuple[int, str]], outs: Sequence[RowStep], obs: list[str],
                 done: np.ndarray) -> StepResult:
    """A pool's ``step`` answer from the rows it stepped (``live``: (row, action), ``outs`` in the same order);
    updates the pool's last observations ``obs`` and ``done`` flags in place."""
    rewards = np.zeros(n)
    infos: list = [SKIPPED] * n
    for (i, _), (observation, reward, finished, info) in zip(live, outs):
        obs[i], rewards[i], done[i], infos[i] = observation, reward, finished, info
    return list(obs), rewards, done.copy(), infos


def step_rows(pool: Any, items: Sequence[tuple[int, str]], timeout: float | None = None) -> list[RowStep]:
    """Step ``(row, action)`` items of ``pool`` and answer one :data:`RowStep` per item, in order: the pool's own
    ``step_rows`` when it has one, else one ``step`` call with every other row left alone."""
    own = getattr(pool, "step_rows", None)
    if own is not None:
        return own(items, timeout)
    actions: list[str | None] = [None] * len(pool)
    for row, action in items:
        actions[row] = action
    observations, rewards, done, infos = pool.step(actions, timeout)
    return [(observations[row], float(rewards[row]), bool(done[row]), infos[row]) for row, _ in items]
