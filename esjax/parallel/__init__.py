"""Scale-out: the sharded ES update and population forward on a ``('data', 'model')`` mesh, multi-process
runs with a replicated coordinator (:mod:`esjax.parallel.multihost`), and a self-check
(``python -m esjax.parallel.smoke``).

Importing this package does not start JAX's backends, so :func:`initialize` can still be called first.
"""

from esjax.parallel.multihost import (
    DistributedConfig,
    DistributedError,
    ProcessInfo,
    allgather_objects,
    allgather_rows,
    barrier,
    check_agreement,
    decode_results,
    encode_results,
    exchange_results,
    initialize,
    is_initialized,
    local_rows,
    owned_rows,
    process_info,
    row_owners,
    setup,
    shutdown,
)
from esjax.parallel.sharded import (
    ShardedES,
    check_partitionable,
    like_params_shardings,
    per_device_bytes,
    population_forward,
    shard_perturbation,
    state_shardings,
    update_memory,
)

__all__ = [
    "DistributedConfig", "DistributedError", "ProcessInfo", "ShardedES", "allgather_objects", "allgather_rows",
    "barrier", "check_agreement", "check_partitionable", "decode_results", "encode_results", "exchange_results",
    "initialize", "is_initialized", "like_params_shardings", "local_rows", "owned_rows", "per_device_bytes",
    "population_forward", "process_info", "row_owners", "setup", "shard_perturbation", "shutdown", "state_shardings",
    "update_memory",
]
