"""BabyAI levels, the level mix, and the seeded instances of each split.

An *instance* is (level, seed): minigrid's level class, built as its gymnasium registration says
(``BabyAI-<Level>-v0``: entry point and keyword arguments), and reset with ``reset(seed=seed)``. Level generation
draws only from the env's own ``np_random``, so one seed gives one grid, agent start and mission.

Goals: a pool or env of split ``s`` plays *goal* ``g`` (``0 <= g < SPLITS[s].size``) as

- seed ``SPLITS[s].base + g``: the splits' seed ranges are disjoint (train ``[0, 10^9)``, eval
  ``[10^9, 10^9 + 10^5)``, test ``[1.1·10^9, 1.1·10^9 + 10^5)``), so no instance of one split is an instance of
  another, whatever the level;
- level ``mix.level_of(s, g)``: drawn by the mix's weights from a fixed hash of (split, goal), so consecutive goals
  (a member's task batch) are independent draws, not a round-robin over the levels.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any

#: Short level name -> gymnasium id; every BabyAI level minigrid registers can be named, these are the ones measured.
LEVEL_IDS = {
    "GoToLocal": "BabyAI-GoToLocal-v0",
    "PickupLoc": "BabyAI-PickupLoc-v0",
    "PutNextLocal": "BabyAI-PutNextLocal-v0",
    "Open": "BabyAI-Open-v0",
    "GoTo": "BabyAI-GoTo-v0",
    "GoToObjMaze": "BabyAI-GoToObjMaze-v0",
}


@dataclass(frozen=True)
class Split:
    base: int  # seed of goal 0
    size: int  # goals 0 .. size - 1


SPLITS = {
    "train": Split(0, 1_000_000_000),
    "eval": Split(1_000_000_000, 100_000),
    "test": Split(1_100_000_000, 100_000),
}
_SPLIT_SALT = {"train": 0x7A1, "eval": 0xE7A, "test": 0x7E5}

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def level_id(name: str) -> str:
    """The gymnasium id of level ``name`` (a short name such as ``GoTo``, or a full ``BabyAI-...-v0`` id)."""
    if name in LEVEL_IDS:
        return LEVEL_IDS[name]
    if name.startswith("BabyAI-"):
        return name
    raise ValueError(f"unknown BabyAI level {name!r}; known: {sorted(LEVEL_IDS)} or any 'BabyAI-...-v0' id")


@dataclass(frozen=True)
class LevelMix:
    """Levels and their integer weights; ``level_of(split, goal)`` is the level that goal plays."""

    levels: tuple[str, ...]
    weights: tuple[int, ...]

    def __post_init__(self):
        if len(self.levels) != len(self.weights) or not self.levels:
            raise ValueError("a LevelMix needs one positive weight per level")
        for name in self.levels:
            level_id(name)
        if any(w < 1 for w in self.weights):
            raise ValueError(f"weights must be positive integers, got {self.weights}")

    @classmethod
    def equal(cls, *levels: str) -> LevelMix:
        return cls(tuple(levels), (1,) * len(levels))

    def level_of(self, split: str, goal: int) -> str:
        h = _splitmix64((_SPLIT_SALT[split] << 40) ^ goal) % sum(self.weights)
        for name, w in zip(self.levels, self.weights):
            if h < w:
                return name
            h -= w
        raise AssertionError("unreachable")


#: The default mix (see README.md and experiments/results/babyai_horizons.md for why and what it measures).
DEFAULT_MIX = LevelMix(("GoToLocal", "PickupLoc", "PutNextLocal", "GoTo"), (1, 1, 1, 1))


def seed_of(split: str, goal: int) -> int:
    """The minigrid seed of ``goal`` in ``split``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    s = SPLITS[split]
    if not 0 <= goal < s.size:
        raise ValueError(f"goal {goal} is outside split {split!r} (0 .. {s.size - 1})")
    return s.base + goal


def make_level(name: str) -> Any:
    """A bare minigrid env of level ``name``, built as its registration says (no gymnasium wrappers)."""
    import gymnasium as gym
    import minigrid  # noqa: F401 - registers the BabyAI ids

    spec = gym.spec(level_id(name))
    entry = spec.entry_point
    if isinstance(entry, str):
        module, attr = entry.split(":")
        import importlib

        entry = getattr(importlib.import_module(module), attr)
    return entry(**(spec.kwargs or {}))


def reset_quietly(env: Any, seed: int) -> dict:
    """``env.reset(seed=seed)`` without the lines minigrid prints when its level generator rejects a sample."""
    with contextlib.redirect_stdout(io.StringIO()):
        obs, _ = env.reset(seed=seed)
    return obs
