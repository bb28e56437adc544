"""The ``('data', 'model')`` mesh and the logical axis rules: the one place where esjax's meshes and shardings
are declared.

Meshes: :func:`make_mesh` (axis sizes given), :func:`mesh_from_config` (a run's ``mesh`` section, ``data=0``
meaning every device not on ``model``), :func:`parse_mesh` (``'data=2,model=4'`` text), :func:`mesh_shape`
(resolves and checks the sizes, :class:`MeshError` otherwise).

Shardings: every parameter leaf carries a tuple of logical axis names (``esjax.model.params.param_logical_axes``);
activations and the KV cache name theirs at the call site (``constrain``). ``LOGICAL_RULES`` maps names
onto the two mesh axes: batch rows (members × episodes) over ``data``; attention heads, MLP width and
vocabulary over ``model``. A dimension that does not divide evenly by its mesh axis is replicated instead
(e.g. Qwen2.5's 2 KV heads on a 4-way ``model`` axis), so any mesh works for any model. Host batches go onto
a mesh with :func:`put_batch` (rows over ``data``; pad them with :func:`pad_rows_to` first).

Meshes use ``AxisType.Auto`` (classic propagation): parameters and inputs are placed with
``NamedSharding`` and XLA propagates through the jitted forward; ``constrain`` pins activations when a mesh
is active via ``jax.set_mesh`` and is a no-op otherwise, so nothing assumes one device or a mesh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from esjax.errors import EsjaxError
from esjax.model.config import ModelConfig
from esjax.model.params import param_logical_axes, param_shapes

DATA = "data"
MODEL = "model"
MESH_AXES = (DATA, MODEL)

#: logical axis name → mesh axis (None: replicated). The only sharding declaration in esjax.model.
LOGICAL_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA),
    ("vocab", MODEL),
    ("heads", MODEL),
    ("kv_heads", MODEL),
    ("mlp", MODEL),
    ("embed", None),
    ("norm", None),
    ("layers", None),
    ("seq", None),
    ("cache_seq", None),
    ("head_dim", None),
)

#: Logical axes of activations and the KV cache (used with ``constrain``).
ACTIVATION_AXES = ("batch", "seq", "embed")
CACHE_AXES = ("layers", "batch", "cache_seq", "kv_heads", "head_dim")


class MeshError(EsjaxError, ValueError):
    """A mesh that cannot be built on the available devices (names the axis sizes and device counts)."""


def make_mesh(data: int = 1, model: int | None = None, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``('data', 'model')`` mesh with Auto axis types; ``model`` defaults to all remaining devices."""
    devices = list(devices if devices is not None else jax.devices())
    if model is None:
        model = len(devices) // data
    if data * model != len(devices):
        raise MeshError(f"mesh ({data}, {model}) needs {data * model} devices, have {len(devices)}")
    return jax.make_mesh((data, model), MESH_AXES, axis_types=(AxisType.Auto,) * 2, devices=devices)


def parse_mesh(text: str) -> dict[str, int]:
    """``'data=2,model=4'`` → ``{'data': 2, 'model': 4}`` (missing axes: data=0 = all devices, model=1)."""
    out = {DATA: 0, MODEL: 1}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in out or not value.strip().isdigit():
            raise MeshError(f"mesh {text!r}: expected 'data=D,model=M' with non-negative integers, got {part!r}")
        out[key.strip()] = int(value)
    if out[MODEL] < 1:
        raise MeshError(f"mesh {text!r}: model must be >= 1")
    return out


def mesh_shape(data: int, model: int, n_devices: int) -> tuple[int, int]:
    """Resolve ``data=0`` (all devices not used by ``model``) and check the product matches the devices."""
    if model < 1 or data < 0:
        raise MeshError(f"mesh: model must be >= 1 and data >= 0, got data={data}, model={model}")
    if data == 0:
        if n_devices % model:
            raise MeshError(f"mesh: model={model} does not divide the {n_devices} devices")
        data = n_devices // model
    if data * model != n_devices:
        raise MeshError(f"mesh: data={data} x model={model} = {data * model} devices, but {n_devices} are "
                        "available (set mesh.data=0 to use all of them on the data axis)")
    return data, model


def mesh_from_config(mesh_config: Any = None, devices: list[Any] | None = None) -> Mesh:
    """The run's mesh from a ``mesh`` config section (``.data``, ``.model``; a mapping works too).

    ``data=0`` puts every device not used by ``model`` on the data axis. Devices are taken in
    ``jax.devices()`` order (grouped by process), so with ``model`` ≤ local devices the model axis stays
    inside one host (fast links) and ``data`` spans hosts.
    """
    if mesh_config is None:
        data, model = 0, 1
    elif isinstance(mesh_config, Mapping):
        data, model = int(mesh_config.get(DATA, 0)), int(mesh_config.get(MODEL, 1))
    else:
        data, model = int(getattr(mesh_config, DATA, 0)), int(getattr(mesh_config, MODEL, 1))
    return mesh_of(data, model, devices)


def mesh_of(data: int, model: int, devices: list[Any] | None = None) -> Mesh:
    """The mesh of ``data`` × ``model`` devices (``data=0``: every device not used by ``model``), devices in
    ``jax.devices()`` order (see :func:`mesh_from_config`)."""
    devices = list(devices if devices is not None else jax.devices())
    data, model = mesh_shape(data, model, len(devices))
    return make_mesh(data, model, devices)


def pad_rows_to(rows: int, mesh: Mesh, multiple: int = 1) -> int:
    """Smallest row count ≥ ``rows`` that splits evenly over ``data`` (and is a multiple of ``multiple``).

    Rows that do not divide the data axis would be *replicated* by the sharding rules, so drivers pad."""
    step = int(np.lcm(int(mesh.shape[DATA]), max(1, multiple)))
    return max(step, -(-rows // step) * step)


def _rule(name: str | None, rules) -> str | None:
    if name is None:
        return None
    for logical, mesh_axis in rules:
        if logical == name:
            return mesh_axis
    raise KeyError(f"no sharding rule for logical axis {name!r}; add it to esjax.model.sharding.LOGICAL_RULES")


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh_shape: dict[str, int] | None = None, rules=LOGICAL_RULES) -> PartitionSpec:
    """PartitionSpec for logical ``axes``; dims not divisible by their mesh axis size are replicated."""
    used: set[str] = set()
    out = []
    for i, name in enumerate(axes):
        mesh_axis = _rule(name, rules)
        if mesh_axis is not None and mesh_shape is not None:
            size = mesh_shape.get(mesh_axis, 1)
            if mesh_axis in used or (shape is not None and shape[i] % size):
                mesh_axis = None
        if mesh_axis is not None:
            used.add(mesh_axis)
        out.append(mesh_axis)
    return PartitionSpec(*out)


def named_sharding(mesh: Mesh, axes: Sequence[str | None], shape: Sequence[int]) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, shape, dict(mesh.shape)))


def param_shardings(config: ModelConfig, mesh: Mesh) -> Any:
    """Tree of ``NamedSharding`` matching the parameter tree of ``config``."""
    shapes = param_shapes(config)
    axes = param_logical_axes(config)
    return jax.tree.map(lambda s, a: named_sharding(mesh, a, s.shape), shapes, axes,
                        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def batch_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
    """Rows over ``data``, everything else replicated (inputs such as tokens, positions, masks)."""
    return named_sharding(mesh, ("batch",) + (None,) * (len(shape) - 1), shape)


def put_batch(x: Any, mesh: Mesh | None = None) -> jax.Array:
    """``device_put`` a host batch (leading axis = rows) onto ``mesh`` (or the active mesh), rows over ``data``.

    Without a mesh the batch is returned as it is: every caller passes it straight to a jitted program, which
    copies a host array to the device in a few µs, against ~20-30 µs for an eager ``jnp.asarray``.
    """
    mesh = mesh if mesh is not None else _concrete_mesh()
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    if mesh is None:
        return x
    return jax.device_put(x, batch_sharding(mesh, x.shape))


def put_global(tree: Any, shardings: Any) -> Any:
    """``jax.device_put(tree, shardings)`` that also works in a multi-process job. There a process-local array
    cannot be sent to other processes' devices, so each process fills its own devices' shards from its host copy
    (every process holds the same values: the same checkpoint, seed or state); leaves already spread over the
    job are resharded by ``device_put``."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def put(x: Any, sharding: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree, shardings)


def to_host(array: Any) -> np.ndarray:
    """A jitted program's output as one host array: a process-local or fully replicated array is read directly;
    one sharded over other processes' devices (a multi-process job) is gathered first (one collective, so every
    process must ask for it)."""
    if getattr(array, "is_fully_addressable", True) or array.is_fully_replicated:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def _concrete_mesh() -> Mesh | None:
    mesh = jax.sharding.get_mesh()
    if mesh is None or getattr(mesh, "empty", True) or not isinstance(mesh, Mesh):
        return None
    return mesh


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """``with_sharding_constraint`` by logical axes under the active mesh (``jax.set_mesh``); else identity."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = logical_to_spec(axes, x.shape, dict(mesh.shape))
    return jax.lax.with_sharding_constraint(x, spec)
