"""Env sessions split over the processes of a multi-process job, behind the one-process pool protocol.

Every process runs the same host loop (the replicated coordinator and rollout engine take identical decisions
from identical inputs). The env sessions are the exception: process ``p`` serves only the rows it owns
(row ``r`` belongs to process ``r % P``, so every process gets a share of each call), steps them in its own
pool, and the answers of every process are gathered once per pool call — so each process's loop sees every
row's observation, reward and page exactly as a one-process pool would answer them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from esjax.loop.envpool import SKIPPED
from esjax.loop.protocols import EnvPool
from esjax.parallel.multihost import allgather_objects


def owner_of(row: int, processes: int) -> int:
    """The process that serves env row ``row``."""
    return row % processes


class ProcessRowsPool:
    """``n`` env rows of which this process serves ``row % processes == process_index`` in a local pool.

    ``make_local(k)`` builds the local pool of ``k`` sessions (in-process, worker processes or Ray actors):
    global row ``r`` is its session ``r // processes``. Every method is collective: all processes call it with
    the same arguments (the replicated loop does), and every process gets every row's answer.
    """

    #: Every call is a collective: a rollout engine makes them from its own thread, in the order of its other
    #: collectives (reading sharded scores), never from a helper thread beside them.
    collective = True

    def __init__(self, n: int, make_local: Callable[[int], EnvPool], process_index: int, processes: int):
        if not 0 <= process_index < processes:
            raise ValueError(f"process_index {process_index} is not in [0, {processes})")
        self.n, self.me, self.processes = n, process_index, processes
        self.owned = [r for r in range(n) if owner_of(r, processes) == process_index]
        self.local = make_local(max(1, len(self.owned)))

    def __len__(self) -> int:
        return self.n

    def _mine(self, rows: Sequence[int]) -> list[int]:
        """Positions ``k`` of ``rows`` whose row this process serves."""
        return [k for k, r in enumerate(rows) if owner_of(int(r), self.processes) == self.me]

    def _ask(self, rows: Sequence[int], call: Callable[[list[int], list[int]], list[Any]]) -> list[Any]:
        """One answer per row of ``rows``: ``call(local_rows, positions)`` answers the rows this process serves
        (``positions``: where they stand in ``rows``), then every process's answers are merged in order."""
        mine = self._mine(rows)
        outs = call([self._local_row(rows[k]) for k in mine], mine) if mine else []
        merged: dict[int, Any] = {}
        for part in allgather_objects(dict(zip(mine, outs))):
            merged.update(part)
        if len(merged) != len(rows):
            raise RuntimeError(f"env rows: {len(rows) - len(merged)} of {len(rows)} answers are missing after the "
                               "exchange")
        return [merged[k] for k in range(len(rows))]

    def _local_row(self, row: int) -> int:
        return int(row) // self.processes

    def reset_rows(self, rows: Sequence[int], goals: Sequence[int]) -> list[tuple[str, dict[str, Any]]]:
        return self._ask(rows, lambda local, mine: self.local.reset_rows(local, [goals[k] for k in mine]))

    def step(self, actions: Sequence[str | None], timeout: float | None = None
             ) -> tuple[list[str], Any, Any, list[dict[str, Any]]]:
        if len(actions) != self.n:
            raise ValueError(f"expected {self.n} actions (one per env row), got {len(actions)}")
        local: list[str | None] = [None] * len(self.local)
        for row in self.owned:
            local[self._local_row(row)] = actions[row]
        answers: dict[int, tuple] = {}
        if any(a is not None for a in local):
            observations, rewards, done, infos = self.local.step(local, timeout)
            for row in self.owned:
                if actions[row] is not None:
                    j = self._local_row(row)
                    answers[row] = (observations[j], float(rewards[j]), bool(done[j]), infos[j])
        merged: dict[int, tuple] = {}
        for part in allgather_objects(answers):
            merged.update(part)
        observations = [""] * self.n
        rewards, done = np.zeros(self.n), np.zeros(self.n, bool)
        infos: list = [SKIPPED] * self.n
        for row, (observation, reward, finished, info) in merged.items():
            observations[row], rewards[row], done[row], infos[row] = observation, reward, finished, info
        return observations, rewards, done, infos

    def available_actions(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        return self._ask(rows, lambda local, _: self.local.available_actions(local))

    def instructions(self, rows: Sequence[int]) -> list[str]:
        return self._ask(rows, lambda local, _: self.local.instructions(local))

    def close(self) -> None:
        self.local.close()
