"""Scale-out: the sharded ES update and population forward on a ``('data', 'model')`` mesh, multi-process
runs with a replicated coordinator (:mod:`esjax.parallel.multihost`), and a self-check
(``python -m esjax.parallel.smoke``).

Importing this package does not start JAX's backends, so :func:`initialize` can still be called first.
"""

from esjax.parallel.multihost import (
    DistributedConfig,
    DistributedError,
    ProcessInfo,
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
    MeshError,
    ShardedES,
    check_partitionable,
    like_params_shardings,
    mesh_from_config,
    mesh_shape,
    pad_rows_to,
    parse_mesh,
    per_device_bytes,
    population_forward,
    shard_perturbation,
    shard_rows,
    state_shardings,
    update_memory,
)

__all__ = [
    "DistributedConfig", "DistributedError", "MeshError", "ProcessInfo", "ShardedES", "allgather_rows", "barrier",
    "check_agreement", "check_partitionable", "decode_results", "encode_results", "exchange_results", "initialize",
    "is_initialized", "like_params_shardings", "local_rows", "mesh_from_config", "mesh_shape", "owned_rows",
    "pad_rows_to", "parse_mesh", "per_device_bytes", "population_forward", "process_info", "row_owners",
    "setup", "shard_perturbation", "shard_rows", "shutdown", "state_shardings", "update_memory",
]
