"""Per-device memory plan of a run: what lives on one accelerator during rollouts and during an update.

Why: whether a (model, mesh, population, lag, batch, context) combination fits is otherwise found out by an
out-of-memory error after minutes of loading. Shapes come from the model's own parameter spec (``param_shapes``,
what ``init_params`` and the HF loader fill) and ``jax.eval_shape`` of ``init_cache`` and the optimizer's
``init`` (nothing allocated), and per-device shard sizes
from the model's sharding rules (``esjax.model.sharding.logical_to_spec``), so the parameter and KV-cache lines
are exact; activations and the update's scratch are estimates (labelled so).

What is counted, per device:

* θ of the K + 1 live versions (members dispatched at t − K … t are still running on their own θ);
* optimizer state (SGD: none; momentum: 1 × θ; Adam: 2 × θ, in θ's dtype as optax keeps them) and θ_0;
* the KV cache of ``batch`` sequences × ``context`` slots (rows padded to a multiple of ``data``: rows that
  do not split over ``data`` would be replicated by the sharding rules);
* rollout extras: low-rank factors per member, or, in full mode, one materialized θ per member in the batch;
  prefill activations of one layer (attention scores are materialized: ``rows × heads × prefill × context``);
* update extras: the new θ (and new optimizer state, when there is one), and the scratch of one group of leaves.

The update (:func:`esjax.es.step.update`) forms the gradient and steps the optimizer one group of leaves at a
time: consecutive leaves (flatten order) whose float32 gradients fit ``ESExecution.update_chunk_bytes``
(256 MiB by default; a larger leaf is a group alone), each group after the previous one is done. Its scratch
is planned as the largest over the groups ``g`` of ::

    2 · G_g + noise_g          G_g = Σ_{leaves in g} per-device float32 bytes of the leaf
    noise_g = 12 · chunk · D_g     (low-rank: a chunk of draws, their threefry bits and A·c, 4 bytes each)
    noise_g = 3 · chunk · G_g                                    (full: a chunk of dense draws, and their bits)

(``2 · G_g``: the float32 accumulator and the chunk's sum added to it; ``chunk``: the update's draws per chunk,
:func:`esjax.es.gradient.auto_chunk_size`; ``D_g``: one member's draw elements for the perturbed leaves of
``g`` (``Scope('matrices')``: the matrices, :func:`esjax.es.noise.is_matrix`), factors ``lead·(m + n)·r``
of each, the draws of at most 8,192 elements padded to the largest of them, as
:func:`esjax.es.noise.batched_pair_noise` draws them).
Before, the update held ``2 · Σ_g G_g``: the float32 gradient of every leaf at once.
``tests/plan/test_scale_plan.py``
checks the formula against XLA's memory analysis of the compiled update of a small Qwen2-shaped model and
``benchmarks/update_memory.py`` measures a 72.6M-parameter one (BENCHMARKS.md, "ES update").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from esjax.agent.scoring import LOGITS_CHUNK_BYTES  # the cap on float32 logits materialized at once
from esjax.es.gradient import auto_chunk_size
from esjax.es.grouped import UPDATE_CHUNK_BYTES, leaf_groups
from esjax.es.noise import SMALL_DRAW, NoiseSpec, Scope, is_matrix, path_str
from esjax.model.config import ModelConfig
from esjax.model.decoder import init_cache
from esjax.model.params import param_logical_axes, param_shapes
from esjax.model.sharding import CACHE_AXES, DATA, MODEL, logical_to_spec

GiB = 1 << 30
Optimizer = Literal["sgd", "momentum", "adam"]


def parse_bytes(text: str | int | float) -> int:
    """``'80GB'`` (decimal) / ``'80GiB'`` (binary) / ``'141e9'`` → bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    s = text.strip().upper().replace(" ", "")
    units = {"TIB": 1 << 40, "GIB": GiB, "MIB": 1 << 20, "KIB": 1 << 10, "TB": 10**12, "GB": 10**9, "MB": 10**6,
             "KB": 10**3, "T": 10**12, "G": 10**9, "M": 10**6, "K": 10**3, "B": 1}
    for unit, scale in units.items():
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * scale)
    return int(float(s))


def _itemsize(dtype: Any) -> int:
    return jnp.dtype(dtype).itemsize


def shard_shape(shape: tuple[int, ...], axes: tuple[str | None, ...], mesh_shape: dict[str, int]) -> tuple[int, ...]:
    """Per-device shape of an array with logical ``axes`` under the model's sharding rules."""
    spec = logical_to_spec(axes, shape, mesh_shape)
    return tuple(dim // (mesh_shape[ax] if ax is not None else 1) for dim, ax in zip(shape, tuple(spec)))


def shard_bytes(shape: tuple[int, ...], dtype: Any, axes: tuple[str | None, ...], mesh_shape: dict[str, int]) -> int:
    return int(np.prod(shard_shape(shape, axes, mesh_shape), dtype=np.int64)) * _itemsize(dtype)


@dataclasses.dataclass(frozen=True)
class Line:
    """One row of the plan: per-device bytes, and in which phases it is live."""

    name: str
    bytes: int
    rollout: bool = True
    update: bool = True
    estimate: bool = False
    note: str = ""


@dataclasses.dataclass
class MemoryPlan:
    """A plan's inputs, lines and verdict (all byte counts per device)."""

    label: str
    settings: dict[str, Any]
    lines: list[Line]
    device_memory: int
    headroom: float

    @property
    def rollout_peak(self) -> int:
        return sum(line.bytes for line in self.lines if line.rollout)

    @property
    def update_peak(self) -> int:
        return sum(line.bytes for line in self.lines if line.update)

    @property
    def peak(self) -> int:
        return max(self.rollout_peak, self.update_peak)

    @property
    def usable(self) -> int:
        return int(self.device_memory * self.headroom)

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable

    def line(self, name: str) -> Line:
        for line in self.lines:
            if line.name == name:
                return line
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.label, **self.settings, "lines": [dataclasses.asdict(x) for x in self.lines],
                "rollout_peak": self.rollout_peak, "update_peak": self.update_peak, "peak": self.peak,
                "device_memory": self.device_memory, "usable": self.usable, "fits": self.fits}

    def to_text(self) -> str:
        s = self.settings
        head = (f"{self.label}: mesh data={s['data']} x model={s['model']}, population {s['population']}, "
                f"max lag {s['max_lag']}, batch {s['batch']} (rows/device {s['rows_per_device']}), context "
                f"{s['context']}, prefill {s['prefill']}, {s['dtype']}, {s['mode']}"
                + (f" rank {s['rank']}" if s["mode"] == "lowrank" else "") + f", optimizer {s['optimizer']}")
        names = [line.name + (" (est.)" if line.estimate else "") for line in self.lines]
        width = max(44, *map(len, names))  # the label column fits the longest label, so numbers stay aligned
        out = [head, f"  parameters: {s['param_count'] / 1e9:.3f} B ({s['param_bytes_total'] / GiB:.2f} GiB total)",
               f"  {'per device':<{width}} {'GiB':>9}  phase"]
        for line, name in zip(self.lines, names):
            phase = "rollout+update" if line.rollout and line.update else ("rollout" if line.rollout else "update")
            note = f"  [{line.note}]" if line.note else ""
            out.append(f"  {name:<{width}} {line.bytes / GiB:>9.3f}  {phase}{note}")
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        out.append(f"  {'rollout peak':<{width}} {self.rollout_peak / GiB:>9.3f}")
        out.append(f"  {'update peak':<{width}} {self.update_peak / GiB:>9.3f}")
        out.append(f"  {verdict}: peak {self.peak / GiB:.2f} GiB vs {self.usable / GiB:.2f} GiB usable "
                   f"({self.headroom:.0%} of {self.device_memory / GiB:.2f} GiB)")
        return "\n".join(out)


def _optimizer(name: Optimizer):
    import optax

    if name == "sgd":
        return optax.sgd(1e-3)
    if name == "momentum":
        return optax.sgd(1e-3, momentum=0.9)
    if name == "adam":
        return optax.adam(1e-3)
    raise ValueError(f"optimizer must be 'sgd', 'momentum' or 'adam', got {name!r}")


def param_plan(config: ModelConfig, mesh_shape: dict[str, int], dtype: Any) -> list[tuple[str, Any, tuple, int]]:
    """``[(path, ShapeDtypeStruct, logical axes, per-device bytes)]`` of θ, exact: the model's own parameter
    spec (``param_shapes``, which ``init_params`` and the HF loader fill), nothing allocated."""
    shapes = param_shapes(config, dtype)
    flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
    axes = jax.tree.leaves(param_logical_axes(config), is_leaf=lambda x: isinstance(x, tuple))
    return [(path_str(kp), s, ax, shard_bytes(s.shape, s.dtype, ax, mesh_shape)) for (kp, s), ax in zip(flat, axes)]


def _like_params_bytes(tree: Any, params: list[tuple[str, Any, tuple, int]], mesh_shape: dict[str, int]) -> int:
    """Per-device bytes of an optimizer-state-like tree (params-like leaves sharded like θ, rest replicated)."""
    total = 0
    for kp, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        path, shape = path_str(kp), tuple(leaf.shape)
        axes = next((ax for p, s, ax, _ in params if tuple(s.shape) == shape and (path == p or path.endswith("/" + p))),
                    (None,) * len(shape))
        total += shard_bytes(shape, leaf.dtype, axes, mesh_shape)
    return total


def cache_bytes(config: ModelConfig, rows: int, context: int, dtype: Any, mesh_shape: dict[str, int]) -> int:
    """Per-device bytes of ``init_cache(config, rows, context)`` (k, v over CACHE_AXES; valid over batch)."""
    cache = jax.eval_shape(lambda: init_cache(config, rows, context, dtype))
    axes = {"k": CACHE_AXES, "v": CACHE_AXES, "valid": ("batch", "cache_seq"), "index": ()}
    return sum(shard_bytes(cache[k].shape, cache[k].dtype, axes[k], mesh_shape) for k in cache)


def plan_memory(config: ModelConfig, *, data: int = 1, model: int = 1, population: int = 30, max_lag: int = 1,
                batch: int | None = None, context: int = 2048, prefill: int | None = None,
                dtype: str = "bfloat16", device_memory: int | str = "80GB", mode: str = "lowrank", rank: int = 1,
                optimizer: Optimizer = "sgd", anchor: bool = False, episodes_per_member: int = 1,
                headroom: float = 0.9, label: str = "model",
                update_chunk_bytes: int | None = UPDATE_CHUNK_BYTES) -> MemoryPlan:
    """The per-device memory plan (see the module docstring for what each line counts).

    Args:
      batch: sequences held in the KV cache at once (members × concurrent episodes × candidates); default N.
      context: KV-cache slots per sequence (prompt + generated tokens).
      prefill: tokens per prefill call (prompt chunk); default ``min(context, 512)``.
      episodes_per_member: rows sharing one member (full mode materializes θ once per member, not per row).
      headroom: fraction of device memory the plan may use (XLA workspace, fragmentation).
      update_chunk_bytes: the update's ``ESExecution.update_chunk_bytes`` (``None``: all leaves at once).
    """
    if mode not in ("lowrank", "full"):
        raise ValueError(f"mode must be 'lowrank' or 'full', got {mode!r}")
    for name, value in (("data", data), ("model", model), ("population", population), ("context", context),
                        ("rank", rank), ("episodes_per_member", episodes_per_member)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if max_lag < 0:
        raise ValueError(f"max_lag must be >= 0, got {max_lag}")
    mesh = {DATA: data, MODEL: model}
    dtype = jnp.dtype(dtype).name
    batch = population if batch is None else batch
    rows = -(-batch // data) * data
    rows_dev = rows // data
    prefill = min(context, 512) if prefill is None else min(prefill, context)
    bsz = _itemsize(dtype)

    params = param_plan(config, mesh, dtype)
    theta = sum(b for *_, b in params)
    theta32 = sum(shard_bytes(s.shape, jnp.float32, ax, mesh) for _, s, ax, _ in params)
    count = sum(int(np.prod(s.shape)) for _, s, _, _ in params)
    opt_tree = jax.eval_shape(_optimizer(optimizer).init, _nested(params))
    opt = _like_params_bytes(opt_tree, params, mesh)

    def per_dev(n: int, axis: str) -> int:  # a dimension as the rules shard it
        return n // mesh[MODEL] if axis == MODEL and n % mesh[MODEL] == 0 else n

    heads_dev = config.num_heads // mesh[MODEL] if config.q_dim % mesh[MODEL] == 0 else config.num_heads
    q_dev, kv_dev = per_dev(config.q_dim, MODEL), per_dev(config.kv_dim, MODEL)
    inter_dev, vocab_dev = per_dev(config.intermediate_size, MODEL), per_dev(config.vocab_size, MODEL)
    tokens = rows_dev * prefill
    scores = rows_dev * heads_dev * prefill * context * (4 + 4 + bsz)  # f32 scores, masked copy, probs
    layer_acts = tokens * (4 * config.hidden_size + q_dev + 2 * kv_dev + 3 * inter_dev) * bsz
    logits = min(tokens * vocab_dev * 4, LOGITS_CHUNK_BYTES)
    members = -(-rows // episodes_per_member)
    members_dev = -(-members // data)

    factor_elems = sum(_factor_elems(s.shape, ax, mesh, rank) for p, s, ax, _ in params if is_matrix(p, s.shape))
    group = update_group_scratch(params, mesh, mode=mode, rank=rank, population=population,
                                 update_chunk_bytes=update_chunk_bytes)

    lines = [
        Line("θ_t", theta),
        Line(f"older live versions θ_t-1..θ_t-K (K={max_lag})", max_lag * theta),
        Line(f"optimizer state ({optimizer})", opt),
    ]
    if anchor:
        lines.append(Line("anchor θ_0", theta))
    lines.append(Line(f"KV cache ({rows} rows x {context} slots)", cache_bytes(config, rows, context, dtype, mesh)))
    if mode == "full":
        lines.append(Line(f"full-rank member θ ({members_dev} members/device)", members_dev * theta, update=False))
    else:
        lines.append(Line(f"low-rank factors ({members_dev} members/device, r={rank})",
                          members_dev * factor_elems * 4, update=False))
    lines.append(Line(f"prefill activations ({prefill} tokens, one layer)", scores + layer_acts + logits,
                      update=False, estimate=True, note=f"attention scores {scores / GiB:.2f} GiB"))
    lines.append(Line("new θ_t+1 (update output)", theta, rollout=False))
    if opt:
        lines.append(Line(f"new optimizer state ({optimizer}, update output)", opt, rollout=False))
    lines.append(Line(f"f32 gradient of one leaf group + its temporary ({group['leaves']} leaves)",
                      2 * group["gradient"], rollout=False, estimate=True,
                      note=f"all leaves at once: {2 * theta32 / GiB:.2f} GiB"))
    lines.append(Line("noise chunk of that group", group["noise"], rollout=False, estimate=True))

    settings = dict(data=data, model=model, population=population, max_lag=max_lag, batch=batch, rows=rows,
                    rows_per_device=rows_dev, context=context, prefill=prefill, dtype=dtype, mode=mode, rank=rank,
                    optimizer=optimizer, anchor=anchor, param_count=count,
                    param_bytes_total=sum(int(np.prod(s.shape)) * bsz for _, s, _, _ in params))
    return MemoryPlan(label, settings, lines, parse_bytes(device_memory), headroom)


def _factor_elems(shape: tuple[int, ...], axes: tuple, mesh_shape: dict[str, int], rank: int) -> int:
    """Per-device elements of one draw's low-rank factors ``A [*lead, m, r]``, ``B [*lead, n, r]`` of a matrix."""
    *lead, m, n = shard_shape(tuple(shape), axes, mesh_shape)
    return int(np.prod(lead or [1])) * (m + n) * rank


def _draw_elems(spec: NoiseSpec, leaves: list[tuple[str, tuple[int, ...], tuple]],
                mesh_shape: dict[str, int]) -> int:
    """Per-device elements one member's draws take in :func:`esjax.es.noise.batched_pair_noise` for these
    ``(path, shape, axes)`` leaves: draws of at most ``SMALL_DRAW`` elements are padded to the largest of them."""
    small, large = [], 0
    for path, shape, axes in leaves:
        if spec.is_lowrank_leaf(path, shape):
            *lead, m, n = shape
            sizes = [int(np.prod(lead or [1])) * m * spec.rank, int(np.prod(lead or [1])) * n * spec.rank]
            local = _factor_elems(shape, axes, mesh_shape, spec.rank)
        else:
            sizes = [int(np.prod(shape))]
            local = int(np.prod(shard_shape(tuple(shape), axes, mesh_shape)))
        if max(sizes) <= SMALL_DRAW:
            small += sizes
        else:
            large += local
    return large + len(small) * max(small, default=0)


def update_group_scratch(params: list[tuple[str, Any, tuple, int]], mesh_shape: dict[str, int], *, mode: str,
                         rank: int, population: int,
                         update_chunk_bytes: int | None = UPDATE_CHUNK_BYTES) -> dict[str, int]:
    """The update's scratch for its worst group of leaves (module docstring): ``{'gradient': G_g, 'noise':
    noise_g, 'leaves': count}``, per device. Groups are the update's own (:func:`esjax.es.grouped.leaf_groups`
    on global float32 sizes); the perturbed leaves are ``Scope('matrices')``'s (:func:`esjax.es.noise.is_matrix`)."""
    spec = NoiseSpec(mode=mode, rank=rank, scope=Scope("matrices"))
    scoped = [spec.scope.contains(p, s) for p, s, *_ in params]
    chunk = max(1, min(auto_chunk_size(spec, [(p, tuple(s.shape)) for (p, s, *_), x in zip(params, scoped) if x],
                                       population), population))
    best = {"gradient": 0, "noise": 0, "leaves": 0}
    for group in leaf_groups([4 * int(np.prod(s.shape)) for _, s, *_ in params], update_chunk_bytes):
        grad = sum(shard_bytes(params[i][1].shape, jnp.float32, params[i][2], mesh_shape) for i in group)
        if mode == "full":
            noise = 3 * chunk * grad
        else:
            noise = 12 * chunk * _draw_elems(spec, [(params[i][0], tuple(params[i][1].shape), params[i][2])
                                                    for i in group if scoped[i]], mesh_shape)
        if 2 * grad + noise > 2 * best["gradient"] + best["noise"]:
            best = {"gradient": grad, "noise": noise, "leaves": len(group)}
    return best


def _nested(params: list[tuple[str, Any, tuple, int]]) -> dict[str, Any]:
    """Rebuild a nested dict of ShapeDtypeStructs from ``param_plan`` rows (for ``optimizer.init``)."""
    root: dict[str, Any] = {}
    for path, s, _, _ in params:
        node = root
        *parents, last = path.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = s
    return root


def fmt_gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def markdown_table(plans: list[MemoryPlan]) -> str:
    """The BUILD.md table: one row per plan."""
    head = ("| model | mesh (data×model) | θ / version | K+1 versions | KV cache | rollout extras | update extras | "
            "peak | fits |\n|---|---|---|---|---|---|---|---|---|")
    rows = []
    for p in plans:
        s = p.settings
        theta = p.line("θ_t").bytes
        kv = next(x.bytes for x in p.lines if x.name.startswith("KV cache"))
        roll = sum(x.bytes for x in p.lines if x.rollout and not x.update)
        upd = sum(x.bytes for x in p.lines if x.update and not x.rollout)
        versions = fmt_gib((s["max_lag"] + 1) * theta)
        cells = [p.label, f"{s['data']}×{s['model']}", fmt_gib(theta), versions, fmt_gib(kv), fmt_gib(roll),
                 fmt_gib(upd), fmt_gib(p.peak), "yes" if p.fits else "no"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join([head, *rows])


def measure_update(config: ModelConfig, *, data: int = 1, model: int = 1, population: int = 30,
                   mode: str = "lowrank", rank: int = 1, optimizer: Optimizer = "sgd", dtype: str = "bfloat16",
                   devices: list[Any] | None = None) -> dict[str, Any]:
    """Compile the real mesh-sharded ES update on abstract inputs (nothing allocated) and return XLA's
    per-device memory analysis. Needs ``data × model`` devices (simulated CPU devices work)."""
    from esjax.es.noise import NoiseSpec, Scope
    from esjax.es.step import ESConfig
    from esjax.model.sharding import make_mesh
    from esjax.parallel.sharded import ShardedES, update_memory

    es_config = ESConfig(noise=NoiseSpec(seed=0, mode=mode, rank=rank, scope=Scope("matrices")),
                         sigma=1e-3, learning_rate=1e-3, scale="llm", optimizer=_optimizer(optimizer))
    devices = list(devices if devices is not None else jax.devices())[: data * model]
    sharded = ShardedES(es_config, config, make_mesh(data, model, devices), dtype=dtype)
    return update_memory(sharded, population)


__all__ = ["GiB", "Line", "MemoryPlan", "cache_bytes", "markdown_table", "measure_update", "param_plan", "parse_bytes",
           "plan_memory",
           "shard_bytes", "shard_shape"]
