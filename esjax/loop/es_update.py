"""Glue between the coordinator and the ES update (:mod:`esjax.es.step`), and a JAX surrogate fitness for the
simulator.

:class:`ESUpdate` is the update function a driver applies to each complete cohort the coordinator hands
out (:class:`~esjax.loop.types.UpdateFn`; see :func:`esjax.loop.coordinator.apply_cohorts`): it hands the
cohort's accepted ``(versions, indices, fitness)`` to :func:`esjax.es.step.update` on the *current* ES
state (θ_t), so stale members contribute their own regenerated noise with no correction. It also keeps θ of the last few
versions, because the rollout side (and :class:`QuadraticFitness`) evaluates members at their dispatch
version.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from esjax.es import noise as es_noise
from esjax.es import step as es_step
from esjax.loop.coordinator import RejectedUpdate
from esjax.loop.tasks import hash_ints
from esjax.loop.types import Cohort, Job
from esjax.model.sharding import to_host

PyTree = Any


class ESUpdate:
    """An :class:`~esjax.loop.types.UpdateFn` backed by the ES update; keeps θ of versions t − keep + 1 … t.

    Raises :class:`~esjax.loop.coordinator.RejectedUpdate` (state unchanged) when the step would make θ
    non-finite; the driver then calls ``Coordinator.reject``.

    Args:
      config: an :class:`esjax.es.step.ESConfig`.
      params: initial θ (ignored when ``state`` is given).
      state: a restored ``ESState`` (resume).
      keep: how many recent versions of θ to keep (K + 1 covers every dispatchable version).
      update_fn: replaces :func:`esjax.es.step.update` (same signature), e.g. the mesh-sharded update of
        ``esjax.parallel.ShardedES.update_fn`` (which has its own :class:`~esjax.es.step.ESExecution`).
      execution: the memory layout of :func:`esjax.es.step.update` (:class:`~esjax.es.step.ESExecution`;
        default: its defaults); not with ``update_fn``.
    """

    def __init__(self, config: Any, params: PyTree = None, *, state: Any = None, keep: int = 1,
                 update_fn: Any = None, execution: Any = None) -> None:
        if update_fn is not None and execution is not None:
            raise ValueError("ESUpdate: an update_fn brings its own execution; pass one or the other")
        if update_fn is None:
            update_fn = es_step.update if execution is None else functools.partial(es_step.update, execution=execution)
        self._update = update_fn
        self.config = config
        self.state = state if state is not None else es_step.init(config, params)
        self.keep = max(1, keep)
        self._params = {self.version: self.state.params}

    @property
    def version(self) -> int:
        return int(self.state.version)

    def params_at(self, version: int) -> PyTree:
        """θ at ``version`` (must be one of the kept versions)."""
        try:
            return self._params[version]
        except KeyError:
            raise KeyError(f"θ of version {version} is not kept (have {sorted(self._params)})") from None

    def keep_version(self, version: int, params: PyTree) -> None:
        """Keep θ of an older ``version`` (t − keep < version < t) again: a resume restores the versions live
        episodes still act with."""
        if not self.version - self.keep < version < self.version:
            raise ValueError(f"version {version} is outside the kept window ({self.version - self.keep}, "
                             f"{self.version})")
        self._params[version] = params

    def __call__(self, cohort: Cohort) -> Mapping[str, Any]:
        if cohort.version != self.version:
            raise RuntimeError(f"cohort for version {cohort.version}, but the ES state is at {self.version}")
        state, metrics = self._update(
            self.config, self.state, jnp.asarray(cohort.versions, jnp.int32), jnp.asarray(cohort.indices, jnp.int32),
            jnp.asarray(cohort.fitness, jnp.float32))
        bad = nonfinite_leaves(state.params)
        if bad:  # θ_t and the optimizer state stay as they were; the coordinator drops the cohort
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise RejectedUpdate(f"update {self.version} -> {self.version + 1} would make parameters non-finite "
                                 f"({', '.join(bad[:3])}{more})")
        self.state = state
        self._params[self.version] = self.state.params
        for old in [v for v in self._params if v <= self.version - self.keep]:
            del self._params[old]
        return {k: float(np.asarray(v)) for k, v in dict(metrics).items() if np.ndim(v) == 0}


@jax.jit
def _finite_flags(params: PyTree) -> list:
    return [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(params)]


def nonfinite_leaves(params: PyTree) -> list[str]:
    """Paths of the leaves of ``params`` holding a NaN or an infinity (one fused device check)."""
    flags = np.array([to_host(flag) for flag in _finite_flags(params)])
    if flags.all():
        return []
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)]
    return [p for p, ok in zip(paths, flags) if not ok]


@functools.partial(jax.jit, static_argnums=0)
def _member_loss(spec: es_noise.NoiseSpec, params: PyTree, target: PyTree, version, index, sigma):
    perturbed = es_noise.perturbed_params(spec, params, version, index, sigma)
    sq = jax.tree_util.tree_map(lambda p, q: jnp.sum((p - q) ** 2), perturbed, target)
    size = sum(x.size for x in jax.tree_util.tree_leaves(target))
    return sum(jax.tree_util.tree_leaves(sq)) / size


class QuadraticFitness:
    """Noisy quadratic surrogate: fitness = −mean((θ_v + σ·ε_(v,i) − θ*)²) + noise.

    The noise has a part shared by every member of a version (common random numbers: it cancels in
    cohort shaping, as task-batch difficulty does) and a per-member part. Evaluated when a job starts,
    on θ of the job's version, with the same counter-based noise the ES update regenerates.
    """

    def __init__(self, spec: es_noise.NoiseSpec, sigma: float, target: PyTree, params_at: Any,
                 shared_noise: float = 0.0, member_noise: float = 0.0, seed: int = 0) -> None:
        self.spec, self.sigma, self.target, self.params_at = spec, float(sigma), target, params_at
        self.shared_noise, self.member_noise, self.seed = shared_noise, member_noise, seed

    def _normal(self, *values: int) -> float:
        return float(np.random.default_rng(hash_ints(self.seed, *values)).standard_normal())

    def __call__(self, jobs: Sequence[Job]) -> np.ndarray:
        out = np.empty(len(jobs), np.float64)
        for n, job in enumerate(jobs):
            v, i = job.member.version, job.member.index
            loss = float(_member_loss(self.spec, self.params_at(v), self.target, v, i, self.sigma))
            noise = self.shared_noise * self._normal(job.tasks.sampling_seed)
            noise += self.member_noise * self._normal(job.tasks.sampling_seed, v, i)
            out[n] = -loss + noise
        return out
