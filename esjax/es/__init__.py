"""The ES core: counter-based noise, fitness shaping, σ schedules, the jitted update, evosax interop.

For library users: ``ES(ESConfig(...))`` with ``init`` / ``ask`` / ``tell`` (evosax-shaped), or the functional
``init`` / ``update`` on cohorts of ``(version, index)`` members. ``__all__`` is that face and all this package
exports; everything else is imported from its module: :mod:`~esjax.es.noise`, :mod:`~esjax.es.gradient`,
:mod:`~esjax.es.shaping`, :mod:`~esjax.es.sigma_schedules`, :mod:`~esjax.es.step`, :mod:`~esjax.es.grouped`,
:mod:`~esjax.es.evosax_compat`.

Direction, explicit on both faces: :class:`ESConfig` maximizes fitness by default (``maximize=False`` minimizes a
loss); :class:`esjax.es.evosax_compat.CounterOpenES`, an evosax drop-in, minimizes by default as evosax does
(``maximize=True`` maximizes). What the update computes is :class:`ESConfig`; how it is laid out in memory
(draws per chunk, leaves per optimizer step) is :class:`ESExecution`.
"""

from esjax.es.noise import NoiseSpec, Scope, lowrank_factors, lowrank_matmul, perturbed_leaves, perturbed_params
from esjax.es.shaping import centered_ranks
from esjax.es.sigma_schedules import constant, cosine, linear
from esjax.es.step import ES, ESConfig, ESExecution, ESState, init, update

#: The library face: the ES object (ask / tell / update), its config, execution settings and state, the functional
#: init / update, what a scope perturbs, the perturbed forward's building blocks, the default shaping and the σ
#: schedules.
__all__ = [
    "ES",
    "ESConfig",
    "ESExecution",
    "ESState",
    "NoiseSpec",
    "Scope",
    "centered_ranks",
    "constant",
    "cosine",
    "init",
    "linear",
    "lowrank_factors",
    "lowrank_matmul",
    "perturbed_leaves",
    "perturbed_params",
    "update",
]
