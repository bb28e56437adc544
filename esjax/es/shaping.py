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
  the result: ``w = -fn(pop, -f)``. The function only ever sees the valid members (evosax itself would rank
  a NaN member worst and so shift everyone else's rank). For ``centered_rank_fitness_shaping_fn`` that is
  exactly :func:`centered_ranks`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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

    evosax minimizes, so the wrapped function sees ``-fitness`` and its output is negated back to "larger =
    better". Invalid members are dropped *before* ``fn`` is called: ``fn`` gets the ``k`` valid members only
    (and their rows of ``population``), so its statistics (ranks, mean, std, min/max) are those of the valid
    members, exactly as if the others were absent; invalid members get weight 0, and so does a weight ``fn``
    returns as NaN/inf (e.g. evosax's centered ranks of a single member, 0/0). ``population`` (e.g. for
    ``add_weight_decay``) is only available when the caller has materialized it; the ES update does not, and
    passes ``None``.

    How ``k`` members are cut out depends on whether ``valid`` is known when the wrapper runs:

    * concrete (eager calls; :func:`esjax.es.step.update` shapes evosax functions this way before its jit):
      ``fn`` is called once on the ``k`` valid members;
    * traced (inside ``jax.jit``, e.g. ``CounterOpenES.tell``): evosax's own shaping functions, whose
      results for the valid members do not depend on NaN members (all but centered ranks, which
      :func:`centered_ranks` computes exactly), get NaN for the invalid ones; any other ``fn`` goes through
      a ``lax.switch`` on ``k`` that compiles it once for each possible ``k`` (``N + 1`` variants: call it
      with concrete fitness where compile time matters).
    """
    native = _native_evosax(fn)

    def nan_for_invalid(fitness: jax.Array, valid: jax.Array) -> jax.Array:
        minimized = jnp.where(valid, -fitness, jnp.nan)
        return -jnp.asarray(fn(population, minimized, state, params), jnp.float32).reshape(-1)

    def on_members(fitness: jax.Array, members: jax.Array) -> jax.Array:
        """``w`` of the members ``members`` (all valid), from ``fn`` seeing only them."""
        pop = None if population is None else jax.tree_util.tree_map(lambda x: x[members], population)
        return -jnp.asarray(fn(pop, -fitness[members], state, params), jnp.float32).reshape(-1)

    def shaped(fitness: jax.Array, valid: jax.Array) -> jax.Array:
        fitness = jnp.asarray(fitness, jnp.float32)
        n = fitness.shape[0]
        zeros = jnp.zeros((n,), jnp.float32)
        if not isinstance(valid, jax.core.Tracer):
            members = np.flatnonzero(np.asarray(valid))
            w = zeros.at[members].set(on_members(fitness, members)) if members.size else zeros
        elif native == "centered_ranks":
            w = centered_ranks(fitness, valid)  # evosax would divide by N - 1, ranking NaN members last
        elif native == "nan_aware":
            w = nan_for_invalid(fitness, valid)
        else:
            order = jnp.argsort(~valid, stable=True)  # the valid members first, in their own order

            def branch(k: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
                return lambda f, o: zeros.at[o[:k]].set(on_members(f, o[:k])) if k else zeros

            w = jax.lax.switch(_count(valid).astype(jnp.int32), [branch(k) for k in range(n + 1)], fitness,
                               order)
        return jnp.where(valid & jnp.isfinite(w), w, 0.0)

    shaped.__name__ = f"evosax:{getattr(fn, '__name__', repr(fn))}"
    return shaped


def _native_evosax(fn: Callable[..., Any]) -> str | None:
    """How a traced call can give the valid members exactly what ``fn`` gives them when only they are
    passed, for evosax's own shaping functions: ``'centered_ranks'`` (computed by :func:`centered_ranks`)
    or ``'nan_aware'`` (NaN for the invalid members is ignored by every statistic: nan-masked mean/std or
    min/max, NaN ranked after every finite value so the valid ranks are 0..k-1, or elementwise); None for
    any other function."""
    from evosax.core import fitness_shaping as evosax_fs

    if fn is evosax_fs.centered_rank_fitness_shaping_fn:
        return "centered_ranks"
    nan_aware = (evosax_fs.identity_fitness_shaping_fn, evosax_fs.standardize_fitness_shaping_fn,
                 evosax_fs.normalize_fitness_shaping_fn, evosax_fs.weights_fitness_shaping_fn)
    return "nan_aware" if fn in nan_aware else None


SHAPINGS: dict[str, ShapingFn] = {
    "centered_ranks": centered_ranks,
    "z_score": z_score,
    "raw": raw,
}


def is_evosax_style(fn: Any) -> bool:
    """Whether ``fn`` is a callable with evosax's shaping parameters ``(population, fitness, state, params)``."""
    if not callable(fn):
        return False
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
    return evosax_shaping(shaping) if is_evosax_style(shaping) else shaping


def shape(fitness: jax.Array, shaping: str | Callable[..., jax.Array] = "centered_ranks",
          mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Weights and validity of a cohort: ``(weights[N], valid[N])``; invalid members have weight 0."""
    fitness = jnp.asarray(fitness, jnp.float32)
    valid = valid_mask(fitness, mask)
    weights = get_shaping(shaping)(fitness, valid)
    return jnp.where(valid, weights, 0.0).astype(jnp.float32), valid
