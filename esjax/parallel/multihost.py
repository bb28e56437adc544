"""Multi-controller runs: JAX's distributed runtime, the per-tick result exchange, row ownership.

esjax does not add a distributed engine of its own. Every process runs the same program
(``python -m esjax.run --config FILE`` on every host); ``jax.distributed.initialize`` connects them, the
mesh spans all devices, and jitted computations (population forward, ES update, orbax checkpoints) are
collective. What is host-side and must agree everywhere is the coordinator (dispatch / accept / update
decisions). It is replicated: every process holds one and feeds it the *same* results in the *same*
order. Once per tick each process contributes what finished on the rollout slots it owns, and
:func:`exchange_results` gathers everything with one small fixed-size collective and sorts it by job id —
so all replicas take identical decisions without a leader.

Settings come from the config or the environment (:meth:`DistributedConfig.from_env`); with nothing set,
JAX's cluster auto-detection (TPU pods, SLURM, Open MPI, Kubernetes/GKE) fills them in. Timeouts are
bounded: a peer that never shows up makes ``initialize`` fail after ``init_timeout`` seconds (JAX's
runtime terminates the process; esjax first prints a ``DistributedError`` line saying what to check),
and a peer that dies mid-run stops sending heartbeats, after which JAX's coordination service terminates
the survivors with "the JAX distributed service detected fatal errors …
another task died" within ``heartbeat_timeout`` seconds instead of letting them hang in a collective.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from esjax.errors import EsjaxError
from esjax.loop.types import Member, Result

ENV_PREFIX = "ESJAX_"
_COLUMNS = 8  # valid, job_id, version, index, fitness (2 words), duration (2 words)


class DistributedError(EsjaxError, RuntimeError):
    """The distributed runtime could not start or the processes disagree (message says what to check)."""


# ---------------------------------------------------------------------------------------------------------
# Initialization
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How this process joins the job. ``None`` fields are auto-detected by JAX (cluster environments).

    Attributes:
      coordinator_address: ``host:port`` of process 0's coordination service.
      num_processes: processes in the job.
      process_id: this process's rank, ``0 <= process_id < num_processes``.
      local_device_ids: accelerators this process drives (GPU hosts running one process per GPU).
      cpu_devices: on the CPU backend, how many devices each process exposes (tests, laptops).
      init_timeout: seconds to wait for every process to connect before failing.
      heartbeat_timeout: seconds without a heartbeat after which a peer counts as dead and the job stops.
      shutdown_timeout: seconds to wait for peers at shutdown.
    """

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    cpu_devices: int | None = None
    init_timeout: int = 300
    heartbeat_timeout: int = 100
    shutdown_timeout: int = 300

    def __post_init__(self) -> None:
        if self.num_processes is not None and self.num_processes < 1:
            raise DistributedError(f"distributed: num_processes must be >= 1, got {self.num_processes}")
        if self.process_id is not None and self.num_processes is not None and not (
                0 <= self.process_id < self.num_processes):
            raise DistributedError(f"distributed: process_id must be in [0, {self.num_processes}), "
                                   f"got {self.process_id}")
        for name in ("init_timeout", "heartbeat_timeout", "shutdown_timeout"):
            if getattr(self, name) < 1:
                raise DistributedError(f"distributed: {name} must be >= 1 second, got {getattr(self, name)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> DistributedConfig:
        """Read ``ESJAX_COORDINATOR_ADDRESS``, ``ESJAX_NUM_PROCESSES``, ``ESJAX_PROCESS_ID``,
        ``ESJAX_LOCAL_DEVICE_IDS`` (comma list), ``ESJAX_CPU_DEVICES``, ``ESJAX_INIT_TIMEOUT``,
        ``ESJAX_HEARTBEAT_TIMEOUT``, ``ESJAX_SHUTDOWN_TIMEOUT`` (JAX's own ``JAX_COORDINATOR_ADDRESS``,
        ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` work too); keyword ``overrides`` win."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name, env.get("JAX_" + name))
            return value if value not in (None, "") else None

        def integer(name: str) -> int | None:
            value = get(name)
            if value is None:
                return None
            try:
                return int(value)
            except ValueError:
                raise DistributedError(f"environment: {ENV_PREFIX}{name}={value!r} is not an integer") from None

        ids = get("LOCAL_DEVICE_IDS")
        values: dict[str, Any] = {
            "coordinator_address": get("COORDINATOR_ADDRESS"),
            "num_processes": integer("NUM_PROCESSES"),
            "process_id": integer("PROCESS_ID"),
            "local_device_ids": tuple(int(x) for x in ids.split(",")) if ids else None,
            "cpu_devices": integer("CPU_DEVICES"),
        }
        for name, key in (("init_timeout", "INIT_TIMEOUT"), ("heartbeat_timeout", "HEARTBEAT_TIMEOUT"),
                          ("shutdown_timeout", "SHUTDOWN_TIMEOUT")):
            value = integer(key)
            if value is not None:
                values[name] = value
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in the job."""

    process_index: int
    process_count: int
    local_device_count: int
    device_count: int

    @property
    def is_primary(self) -> bool:
        return self.process_index == 0


def process_info() -> ProcessInfo:
    import jax

    return ProcessInfo(jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


def is_initialized() -> bool:
    import jax

    return bool(jax.distributed.is_initialized())


def initialize(config: DistributedConfig | None = None) -> ProcessInfo:
    """Join the multi-process job (call before anything touches a JAX device); idempotent.

    ``config`` defaults to :meth:`DistributedConfig.from_env`. On the CPU backend, collectives use gloo
    (JAX's default; set explicitly here). Raises :class:`DistributedError` naming the address and the
    timeout when the job cannot be formed.
    """
    import jax

    config = config if config is not None else DistributedConfig.from_env()
    if is_initialized():
        return process_info()
    if config.cpu_devices is not None:
        jax.config.update("jax_num_cpu_devices", int(config.cpu_devices))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if os.environ.get("ESJAX_GLOO_LOGS", "0") in ("", "0"):
        drop_native_stdout_lines(GLOO_CHATTER)
    kwargs: dict[str, Any] = dict(
        coordinator_address=config.coordinator_address, num_processes=config.num_processes,
        process_id=config.process_id, initialization_timeout=config.init_timeout,
        heartbeat_timeout_seconds=config.heartbeat_timeout, shutdown_timeout_seconds=config.shutdown_timeout)
    if config.local_device_ids is not None:
        kwargs["local_device_ids"] = list(config.local_device_ids)
    where = (f"coordinator {config.coordinator_address or '<auto-detected>'}, process "
             f"{config.process_id if config.process_id is not None else '?'} of "
             f"{config.num_processes if config.num_processes is not None else '?'}")
    # JAX aborts the process (LOG(FATAL), not a Python exception) when the job does not form in time; say
    # what to check just before that happens.
    watchdog = threading.Timer(max(0.5, config.init_timeout - 0.25), _say_init_timeout, (where, config.init_timeout))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, TypeError) as err:
        raise DistributedError(f"jax.distributed.initialize ({where}): {err}. Set ESJAX_COORDINATOR_ADDRESS, "
                               "ESJAX_NUM_PROCESSES and ESJAX_PROCESS_ID (or run under a supported cluster "
                               "manager)") from None
    except Exception as err:  # noqa: BLE001 - XlaRuntimeError (DEADLINE_EXCEEDED, UNAVAILABLE, ...)
        first = str(err).splitlines()[0][:300] if str(err) else err.__class__.__name__
        raise DistributedError(f"jax.distributed.initialize ({where}) failed within {config.init_timeout} s: "
                               f"{first}. {_CHECK}") from None
    finally:
        watchdog.cancel()
    return process_info()


#: What gloo prints on stdout each time a process connects a communicator ("[Gloo] Rank 0 is connected to 7 peer
#: ranks. ..."), several times per process: set-up noise, dropped unless ESJAX_GLOO_LOGS=1.
GLOO_CHATTER = "[Gloo] Rank "
_native_stdout_filtered = False


def drop_native_stdout_lines(prefix: str) -> None:
    """Drop lines starting with ``prefix`` that native code (C++ ``std::cout``) writes to file descriptor 1.

    Python's own output is unaffected: ``sys.stdout`` moves to a duplicate of the original descriptor (so it is
    still a terminal where it was one), and fd 1 becomes a pipe that a daemon thread copies there, line by line,
    without the dropped lines. Called once per process; a no-op where fd 1 cannot be redirected."""
    global _native_stdout_filtered
    if _native_stdout_filtered:
        return
    try:
        sys.stdout.flush()
        original = os.dup(1)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        os.close(write_end)
    except (OSError, ValueError, AttributeError):
        return
    _native_stdout_filtered = True
    sys.stdout = io.TextIOWrapper(io.FileIO(original, "w", closefd=False), line_buffering=True,
                                  encoding=getattr(sys.stdout, "encoding", None) or "utf-8")

    def copy() -> None:
        with io.FileIO(read_end, "r") as pipe:
            for line in io.BufferedReader(pipe):
                if not line.startswith(prefix.encode()):
                    os.write(original, line)

    threading.Thread(target=copy, name="esjax-native-stdout", daemon=True).start()


_CHECK = ("Check that every process was started with the same coordinator address and process count, that "
          "process 0 is running, and that the port is reachable")


def _say_init_timeout(where: str, timeout: int) -> None:
    sys.stderr.write(f"esjax: DistributedError: the multi-process job did not form within {timeout} s ({where}). "
                     f"{_CHECK}. JAX's runtime now terminates this process.\n")
    sys.stderr.flush()


def setup(mesh_config: Any = None, distributed: DistributedConfig | None = None) -> tuple[Any, ProcessInfo]:
    """What a trainer calls first: join the job when ``mesh_config.distributed`` is true (settings from
    ``distributed`` or the environment), then build the global ``('data', 'model')`` mesh."""
    from esjax.model.sharding import mesh_from_config

    wants = bool(getattr(mesh_config, "distributed", False) or (isinstance(mesh_config, Mapping)
                                                              and mesh_config.get("distributed")))
    if wants or distributed is not None:
        initialize(distributed)
    return mesh_from_config(mesh_config), process_info()


def shutdown() -> None:
    """Leave the job cleanly (every process should call it at the end)."""
    import jax

    if is_initialized():
        jax.distributed.shutdown()


def barrier(name: str) -> None:
    """Wait until every process reaches ``name`` (no-op with one process)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


# ---------------------------------------------------------------------------------------------------------
# The per-tick exchange
# ---------------------------------------------------------------------------------------------------------


def _words(values: np.ndarray) -> np.ndarray:
    """float64 [n] → int32 [n, 2], bit-exact (no reliance on jax_enable_x64 for the collective)."""
    return np.ascontiguousarray(values, np.float64).view(np.int32).reshape(-1, 2)


def _unwords(words: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(words, np.int32).reshape(-1).view(np.float64)


def encode_results(results: Sequence[Result], capacity: int) -> np.ndarray:
    """``[capacity, 8]`` int32 rows (valid flag, job id, version, index, fitness/duration as float64 bits)."""
    if len(results) > capacity:
        raise ValueError(f"encode_results: {len(results)} results do not fit capacity {capacity}")
    out = np.zeros((capacity, _COLUMNS), np.int32)
    if results:
        n = len(results)
        ints = np.array([(1, r.job_id, r.member.version, r.member.index) for r in results], np.int64)
        if ints.max() > np.iinfo(np.int32).max:
            raise ValueError("encode_results: job id, version or index exceeds int32")
        out[:n, :4] = ints
        out[:n, 4:6] = _words(np.array([r.fitness for r in results]))
        out[:n, 6:8] = _words(np.array([r.duration for r in results]))
    return out


def decode_results(rows: np.ndarray) -> list[Result]:
    """Inverse of :func:`encode_results` (rows with valid = 0 are padding)."""
    rows = np.asarray(rows, np.int32).reshape(-1, _COLUMNS)
    rows = rows[rows[:, 0] == 1]
    fitness, duration = _unwords(rows[:, 4:6]), _unwords(rows[:, 6:8])
    return [Result(int(r[1]), Member(int(r[2]), int(r[3])), float(f), float(d))
            for r, f, d in zip(rows, fitness, duration)]


def allgather_rows(rows: np.ndarray) -> np.ndarray:
    """``[P, *rows.shape]``: every process's ``rows`` (same shape and dtype everywhere); one collective."""
    import jax

    if jax.process_count() == 1:
        return np.asarray(rows)[None]
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray(rows), tiled=False)
    return np.asarray(gathered)


def allgather_objects(value: Any) -> list[Any]:
    """Every process's ``value`` (any picklable object), in process order — identical on every process.

    Two collectives: the pickled sizes, then the bytes padded to the largest. Every process must call it
    at the same point of the program (the replicated host loop guarantees that)."""
    import pickle

    import jax

    if jax.process_count() == 1:
        return [value]
    blob = np.frombuffer(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = allgather_rows(np.array([blob.size], np.int32)).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: blob.size] = blob
    everything = allgather_rows(padded)
    return [pickle.loads(everything[p, : int(n)].tobytes()) for p, n in enumerate(sizes)]


def exchange_results(local: Sequence[Result], capacity: int = 64) -> list[Result]:
    """All processes' finished results of this tick, sorted by job id — identical on every process.

    Every process must call it once per tick (with its own, possibly empty, list). One ``[capacity, 8]``
    int32 allgather per round; in the rare tick where some process has more than ``capacity`` results,
    further rounds follow (every process learns that from the round's flag, so all stay in lockstep).
    A job id reported by two processes raises :class:`DistributedError` (two owners for one slot).
    """
    if capacity < 1:
        raise ValueError(f"exchange_results: capacity must be >= 1, got {capacity}")
    pending = sorted(local, key=lambda r: r.job_id)
    gathered: list[Result] = []
    while True:
        batch, pending = pending[:capacity], pending[capacity:]
        rows = encode_results(batch, capacity + 1)
        rows[capacity, 0] = 2 if pending else 0  # the extra row carries "more to come" (not a result)
        everything = allgather_rows(rows)
        gathered.extend(decode_results(everything[:, :capacity]))
        if not np.any(everything[:, capacity, 0] == 2):
            break
    gathered.sort(key=lambda r: r.job_id)
    ids = [r.job_id for r in gathered]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise DistributedError(f"exchange_results: job ids {dup[:5]} were reported by more than one process "
                               "(each rollout row must have exactly one owner: see row_owners)")
    return gathered


def check_agreement(value: Any, what: str = "value") -> None:
    """Raise :class:`DistributedError` unless every process passes the same ``value`` (e.g. the coordinator
    version or a state digest); cheap insurance against replicas drifting apart."""
    import hashlib
    import json

    digest = hashlib.blake2b(json.dumps(value, sort_keys=True, default=str).encode(), digest_size=8).digest()
    words = np.frombuffer(digest, np.int32)
    everything = allgather_rows(words)
    if not np.all(everything == everything[0]):
        raise DistributedError(f"processes disagree on {what} (replicated coordinator drifted): digests "
                               f"{[bytes(w.tobytes()).hex() for w in everything]}")


# ---------------------------------------------------------------------------------------------------------
# Row ownership
# ---------------------------------------------------------------------------------------------------------


def row_owners(mesh: Any, rows: int) -> np.ndarray:
    """``[rows]`` process index that owns each population row of a ``rows``-row batch sharded over ``data``.

    A row lives on every device of its data slice (replicated over ``model``); its owner — the one process
    that runs that row's episodes and env sessions and reports its fitness — is the lowest process index
    among those devices. ``rows`` must divide the data axis (pad with ``sharded.pad_rows_to``).
    """
    from jax.sharding import NamedSharding, PartitionSpec

    from esjax.model.sharding import DATA

    if rows % int(mesh.shape[DATA]):
        raise ValueError(f"row_owners: {rows} rows do not split over data={mesh.shape[DATA]}; pad them first")
    sharding = NamedSharding(mesh, PartitionSpec(DATA))
    owners = np.full((rows,), np.iinfo(np.int32).max, np.int64)
    for device, index in sharding.devices_indices_map((rows,)).items():
        sl = index[0]
        owners[sl] = np.minimum(owners[sl], device.process_index)
    return owners


def owned_rows(mesh: Any, rows: int, process_index: int | None = None) -> np.ndarray:
    """Sorted row indices this process (or ``process_index``) owns — its rollout slots."""
    import jax

    me = jax.process_index() if process_index is None else process_index
    return np.flatnonzero(row_owners(mesh, rows) == me)


def local_rows(array: Any, rows: Sequence[int] | np.ndarray | None = None) -> dict[int, np.ndarray]:
    """``{row: value}`` of a row-sharded global array, read from this process's addressable shards only
    (no communication). ``rows`` restricts to those rows (e.g. :func:`owned_rows`)."""
    wanted = None if rows is None else {int(r) for r in rows}
    out: dict[int, np.ndarray] = {}
    for shard in array.addressable_shards:
        start = (shard.index[0].start or 0) if shard.index else 0
        data = np.asarray(shard.data)
        for offset in range(data.shape[0]):
            row = start + offset
            if (wanted is None or row in wanted) and row not in out:
                out[row] = data[offset]
    return out
