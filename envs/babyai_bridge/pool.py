"""Many BabyAI text sessions in this process, driven in batches: an ``esjax.loop.protocols.EnvPool``.

``BabyAIEnvPool(n, split, mix)``: rows ``0 .. n - 1``, each a :class:`~envs.babyai_bridge.env.BabyAITextEnv`;
``reset_rows(rows, goals)``, ``step(actions, timeout=None)`` (one action text per row, None = leave the row
alone), ``available_actions(rows)`` and ``instructions(rows)`` answer in row order; ``reset(goals)`` resets every
row. A minigrid step is a fraction of a millisecond of pure Python, so rows are stepped inline, one after another.
A row whose step raises fails alone (done, reward 0, ``info['failure']``); ``timeout`` can't interrupt a running
step here, so a step found to have taken longer than ``timeout`` seconds fails its row after the fact, the same
answer a pool that interrupts would give. A failed row is reset before it is stepped again (until then its steps
are the env's "episode is over" no-ops).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from esjax.loop.envpool import RowStep, collect_step, failed_step

from .env import BabyAITextEnv
from .levels import DEFAULT_MIX, LevelMix


class BabyAIEnvPool:
    """``n`` BabyAI sessions of ``split`` over the levels of ``mix``."""

    collective = False

    def __init__(self, n: int, split: str = "train", mix: LevelMix = DEFAULT_MIX):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.split, self.mix = split, mix
        self.envs = [BabyAITextEnv(split, mix) for _ in range(n)]
        self._obs = [""] * n
        self._done = np.ones(n, dtype=bool)

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self, goals: Sequence[int]) -> tuple[list[str], list[dict]]:
        self._check(goals)
        out = self.reset_rows(range(len(self.envs)), goals)
        return [o for o, _ in out], [i for _, i in out]

    def reset_rows(self, rows: Sequence[int], goals: Sequence[int]) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for i, g in zip(rows, goals, strict=True):
            self._obs[i], info = self.envs[i].reset(g)
            self._done[i] = False
            out.append((self._obs[i], info))
        return out

    def step(self, actions: Sequence[str | None], timeout: float | None = None
             ) -> tuple[list[str], np.ndarray, np.ndarray, list[dict[str, Any]]]:
        self._check(actions)
        live = [(i, a) for i, a in enumerate(actions) if a is not None]
        return collect_step(len(self.envs), live, self.step_rows(live, timeout), self._obs, self._done)

    def step_rows(self, items: Sequence[tuple[int, str]], timeout: float | None = None) -> list[RowStep]:
        """Step ``(row, action)`` items one row at a time, in order; a row whose step raises or outlasted
        ``timeout`` fails alone (its steps are no-ops until it is reset)."""
        outs = []
        for i, action in items:
            start = time.monotonic()
            try:
                out = self.envs[i].step(action)
            except Exception as err:  # noqa: BLE001 - a failing session ends only its own episode
                text = str(err).splitlines()[0][:200] if str(err) else ""
                out = self._fail(i, f"error: {err.__class__.__name__}: {text}".rstrip(": "))
            else:
                if timeout is not None and time.monotonic() - start > timeout:
                    out = self._fail(i, f"timeout: env step took longer than {timeout:g} s")
            outs.append(out)
        return outs

    def _fail(self, i: int, reason: str) -> RowStep:
        self.envs[i].done = True  # its steps are no-ops until it is reset
        return failed_step(reason)

    def available_actions(self, rows: Sequence[int] | None = None) -> list[dict[str, Any]]:
        return [self.envs[i].available_actions() for i in self._rows(rows)]

    def instructions(self, rows: Sequence[int] | None = None) -> list[str]:
        return [self.envs[i].instruction for i in self._rows(rows)]

    def close(self) -> None:
        """Nothing to release (every session lives in this process)."""

    def _rows(self, rows: Sequence[int] | None) -> Sequence[int]:
        return range(len(self.envs)) if rows is None else rows

    def _check(self, batch: Sequence) -> None:
        if len(batch) != len(self.envs):
            raise ValueError(f"expected {len(self.envs)} entries (one per session), got {len(batch)}")
