"""σ schedules: functions of the version ``t`` (updates applied so far), jittable in ``t``.

They are frozen dataclasses (hashable, readable repr) so an :class:`~esjax.es.step.ESConfig` holding one
stays a valid static jit argument. ``t`` beyond ``steps`` holds the final value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

#: σ as a function of the version (any of the classes below, or a user callable).
SigmaSchedule = Callable[[jax.Array], jax.Array]


def _progress(t, steps: int) -> jax.Array:
    return jnp.clip(jnp.asarray(t, jnp.float32) / max(steps, 1), 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Constant:
    """``σ_t = value``."""

    value: float

    def __call__(self, t) -> jax.Array:
        return jnp.full(jnp.shape(t), self.value, jnp.float32)


@dataclasses.dataclass(frozen=True)
class Linear:
    """``σ_t = σ_0 + (σ_T - σ_0) · min(t / T, 1)``."""

    init: float
    final: float
    steps: int

    def __call__(self, t) -> jax.Array:
        return self.init + (self.final - self.init) * _progress(t, self.steps)


@dataclasses.dataclass(frozen=True)
class Cosine:
    """``σ_t = σ_T + (σ_0 - σ_T)(1 + cos(π · min(t / T, 1))) / 2`` (Agentic ESOpt)."""

    init: float
    final: float
    steps: int

    def __call__(self, t) -> jax.Array:
        return self.final + (self.init - self.final) * (1.0 + jnp.cos(math.pi * _progress(t, self.steps))) / 2.0


def constant(value: float) -> Constant:
    """σ fixed at ``value`` for every version."""
    return Constant(float(value))


def linear(init: float, final: float, steps: int) -> Linear:
    """σ going linearly from ``init`` at version 0 to ``final`` at version ``steps`` (then staying there)."""
    return Linear(float(init), float(final), int(steps))


def cosine(init: float, final: float, steps: int) -> Cosine:
    """σ following half a cosine from ``init`` at version 0 to ``final`` at version ``steps`` (then staying there)."""
    return Cosine(float(init), float(final), int(steps))


def as_schedule(sigma: float | SigmaSchedule) -> SigmaSchedule:
    """A float becomes :class:`Constant`; callables pass through."""
    if callable(sigma):
        return sigma
    value = float(sigma)
    if not value > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    return Constant(value)
