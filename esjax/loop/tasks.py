"""Deterministic task batches and counter-based hashing for the loop.

The task batch of a version must be a pure function of (seed, version): every member dispatched at that
version (on any worker, before or after a resume) sees the same goals and sampling seed — common random
numbers, which is what makes a cohort's fitness values comparable. Counter-based draws (a hash of
integers, no generator state) keep the coordinator's state trivially serializable.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from esjax.loop.types import TaskBatch

_MASK64 = (1 << 64) - 1
_TAG_GOALS = 0x7A5C
_TAG_SAMPLING = 0x5EED


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def hash_ints(*values: int) -> int:
    """A 64-bit hash of a tuple of integers (splitmix64 chain): stable across processes and runs."""
    h = 0
    for value in values:
        h = _splitmix64(h ^ (int(value) & _MASK64))
    return h


def hash_uniform(*values: int) -> float:
    """A uniform float in [0, 1) that is a pure function of ``values``."""
    return (hash_ints(*values) >> 11) / float(1 << 53)


@dataclasses.dataclass(frozen=True)
class TaskSampler:
    """(seed, version) → the version's task batch: ``batch_size`` goals from a train split of ``train_size``.

    Goals are drawn without replacement when the split is large enough (else with replacement).
    """

    seed: int = 0
    train_size: int = 1000
    batch_size: int = 4

    def __post_init__(self) -> None:
        if self.train_size < 1:
            raise ValueError(f"TaskSampler.train_size must be >= 1, got {self.train_size}")
        if self.batch_size < 1:
            raise ValueError(f"TaskSampler.batch_size must be >= 1, got {self.batch_size}")

    def __call__(self, version: int) -> TaskBatch:
        if version < 0:
            raise ValueError(f"task batch of a negative version {version} requested")
        rng = np.random.default_rng(np.random.SeedSequence([self.seed & _MASK64, _TAG_GOALS, version]))
        replace = self.batch_size > self.train_size
        goals = rng.choice(self.train_size, size=self.batch_size, replace=replace)
        sampling_seed = hash_ints(self.seed, _TAG_SAMPLING, version) & 0x7FFFFFFF
        return TaskBatch(version, tuple(int(g) for g in goals), sampling_seed)
