"""WebShop's sessions in worker processes: esjax's :class:`~esjax.loop.envpool_process.ProcessEnvPool` over the
shop of a :class:`~envs.webshop_bridge.factory.ShopSpec` (each worker builds its own copy of the shop)."""

from __future__ import annotations

import functools

from esjax.loop.envpool_process import ProcessEnvPool as _ProcessEnvPool
from esjax.loop.envpool_process import WorkerLost

from .factory import ShopSpec, pool_of

__all__ = ["ProcessEnvPool", "WorkerLost"]


class ProcessEnvPool(_ProcessEnvPool):
    """``n`` WebShop sessions over ``workers`` processes; ``env_kwargs`` go to each worker's
    :class:`~envs.webshop_bridge.pool.InProcessEnvPool` (e.g. ``seed=``)."""

    def __init__(self, spec: ShopSpec, n: int, workers: int = 2, start_method: str = "spawn",
                 max_restarts: int = 10, **env_kwargs):
        super().__init__(functools.partial(pool_of, spec, **env_kwargs), n, workers, start_method, max_restarts)
