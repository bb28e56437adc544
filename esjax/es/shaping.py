"""Fitness shaping: raw fitness of a cohort -> per-member weights ``w_i`` (fitness is MAXIMIZED).

Every shaping function here has the signature ``fn(fitness[N], valid[N]) -> weights[N]``: members with
``valid=False`` (NaN/inf fitness, or masked by the caller) get weight exactly 0 and are excluded from every
statistic (mean, std, ranks), so a crashed rollout never shifts the weights of the others. Higher fitness
always means larger weight.

* :func:`z_score`: ``(f - mean) / (std + eps)`` over the valid members, ``ddof=0``, ``eps=1e-8`` (the
  published LLM-ES code).
* :func:`centered_ranks`: OpenAI-ES ``rank / (n - 1) - 0.5`` in ``[-0.5, 0.5]`` over the ``n`` valid members.
  Ties get the *average* of the ranks they span (deterministic, independent of member order, and
  identical to evosax's ``centered_rank_fitness_shaping_fn``); a cohort of equal fitness therefore gives
  all-zero weights instead of a spurious direction.
* :func:`raw`: the fitness itself.
* :func:`evosax_shaping`: adapter for any evosax fitness-shaping function. evosax *minimizes* and its
  weights are "larger = worse", so the adapter calls ``fn(population, -fitness, state, params)`` and negates
  the result: ``w = -fn(pop, -f)``. For ``centered_rank_fitness_shaping_fn`` that is exactly
  :func:`centered_ranks` when all members are valid.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

ShapingFn = Callable[[jax.Array, jax.Array], jax.Array]


def valid_mask(fitness: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Members whose fitness is finite (and, if given, where ``mask`` is True)."""
    valid = jnp.isfinite(fitness)
    return valid if mask is None else valid & jnp.asarray(mask, bool)


def _count(valid: jax.Array) -> jax.Array:
    return jnp.sum(valid.astype(jnp.float32))


def raw(fitness: jax.Array, valid: jax.Array) -> jax.Array:
    """The fitness itself (0 for invalid members)."""
    return jnp.where(valid, fitness, 0.0).astype(jnp.float32)


def z_score(fitness: jax.Array, valid: jax.Array, eps: float = 1e-8) -> jax.Array:
    """``(f - mean) / (std + eps)`` over valid members (population std, ``ddof=0``)."""
    f = jnp.where(valid, fitness, 0.0).astype(jnp.float32)
    n = jnp.maximum(_count(valid), 1.0)
    mean = jnp.sum(f) / n
    var = jnp.sum(jnp.where(valid, (f - mean) ** 2, 0.0)) / n
    return jnp.where(valid, (f - mean) / (jnp.sqrt(var) + eps), 0.0)


def ranks(fitness: jax.Array, valid: jax.Array) -> jax.Array:
    """0-based ascending ranks among valid members, ties averaged (invalid members: 0).

    ``O(N log N)``: rank = (#valid below + #valid at-or-below - 1) / 2 via two ``searchsorted`` on the
    sorted valid fitness (invalid members are sorted to ``+inf`` and never counted for finite values).
    """
    f = jnp.where(valid, fitness, jnp.inf).astype(jnp.float32)
    sorted_f = jnp.sort(f)
    below = jnp.searchsorted(sorted_f, f, side="left").astype(jnp.float32)
    at_or_below = jnp.searchsorted(sorted_f, f, side="right").astype(jnp.float32)
    return jnp.where(valid, (below + at_or_below - 1.0) / 2.0, 0.0)


def centered_ranks(fitness: jax.Array, valid: jax.Array) -> jax.Array:
    """OpenAI-ES centered ranks ``rank / (n - 1) - 0.5`` over the ``n`` valid members (0 if ``n < 2``)."""
    n = _count(valid)
    w = ranks(fitness, valid) / jnp.maximum(n - 1.0, 1.0) - 0.5
    return jnp.where(valid & (n > 1), w, 0.0)


def evosax_shaping(fn: Callable[..., jax.Array], population: Any = None, state: Any = None,
                   params: Any = None) -> ShapingFn:
    """Wrap an evosax fitness-shaping function ``fn(population, fitness, state, params)``.

    evosax minimizes, so the wrapped function sees ``-fitness`` (NaN for invalid members, which evosax's
    own functions already treat as failed) and its output is negated back to "larger = better"; invalid
    members then get weight 0. ``population`` (e.g. for ``add_weight_decay``) is only available when the
    caller has materialized it; the ES update does not, and passes ``None``.
    """

    def shaped(fitness: jax.Array, valid: jax.Array) -> jax.Array:
        minimized = jnp.where(valid, -fitness.astype(jnp.float32), jnp.nan)
        w = -jnp.asarray(fn(population, minimized, state, params), jnp.float32)
        return jnp.where(valid, w, 0.0)

    shaped.__name__ = f"evosax:{getattr(fn, '__name__', repr(fn))}"
    return shaped


SHAPINGS: dict[str, ShapingFn] = {
    "centered_ranks": centered_ranks,
    "z_score": z_score,
    "raw": raw,
}


def _is_evosax_style(fn: Callable[..., Any]) -> bool:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return names[:4] == ["population", "fitness", "state", "params"]


def get_shaping(shaping: str | Callable[..., jax.Array]) -> ShapingFn:
    """Resolve a shaping name (``'centered_ranks'``, ``'z_score'``, ``'raw'``) or callable.

    A callable with evosax's parameter names ``(population, fitness, state, params)`` is wrapped with
    :func:`evosax_shaping` (negated: evosax minimizes); any other callable must already be
    ``fn(fitness, valid) -> weights`` with "larger = better".
    """
    if isinstance(shaping, str):
        if shaping not in SHAPINGS:
            raise ValueError(f"unknown fitness shaping {shaping!r}; expected one of {sorted(SHAPINGS)} or a callable")
        return SHAPINGS[shaping]
    if not callable(shaping):
        raise TypeError(f"fitness shaping must be a name or a callable, got {type(shaping).__name__}")
    return evosax_shaping(shaping) if _is_evosax_style(shaping) else shaping


def shape(fitness: jax.Array, shaping: str | Callable[..., jax.Array] = "centered_ranks",
          mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Weights and validity of a cohort: ``(weights[N], valid[N])``; invalid members have weight 0."""
    fitness = jnp.asarray(fitness, jnp.float32)
    valid = valid_mask(fitness, mask)
    weights = get_shaping(shaping)(fitness, valid)
    return jnp.where(valid, weights, 0.0).astype(jnp.float32), valid
