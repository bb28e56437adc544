"""A deterministic bounded-staleness run on any mesh and process count — the scale-out self-check.

``python -m esjax.parallel.smoke --mesh data=2,model=4 [--updates 3]`` runs the real pieces end to end on a
tiny random decoder: the replicated :class:`~esjax.loop.coordinator.Coordinator` with the Async schedule,
:class:`~esjax.loop.es_update.ESUpdate` over the mesh-sharded update (:class:`~esjax.parallel.sharded.ShardedES`),
a population forward with rows over ``data`` whose per-row log-likelihood of fixed tokens is the fitness,
per-process row ownership and the per-tick :func:`~esjax.parallel.multihost.exchange_results`. Some results
are held back one tick, so cohorts mix lag-0 and lag-1 members. It prints a checksum of the final θ: the same
checksum on 1 device, on 8, and on several hosts means the multi-host setup is sound (launch it like the
trainer; see BUILD.md). Tests use :func:`deterministic_run` directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

import numpy as np

PyTree = Any


@dataclasses.dataclass
class SmokeResult:
    """Final ES state, the coordinator (its state and totals) and the per-update records."""

    state: Any
    coordinator: Any
    records: list[Any]
    ticks: int
    sharded: Any = None

    def params_numpy(self) -> dict[str, np.ndarray]:
        """θ gathered to host as ``{path: array}`` (collective when θ spans processes)."""
        return gather_params(self.state.params)


def gather_params(params: PyTree) -> dict[str, np.ndarray]:
    """``{path: host array}`` of a (possibly multi-process) sharded tree; every process gets all values."""
    import jax
    from jax.experimental import multihost_utils

    from esjax.es.noise import path_str

    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    if jax.process_count() > 1:
        values = multihost_utils.process_allgather([x for _, x in flat], tiled=True)
    else:
        values = [np.asarray(x) for _, x in flat]
    return {path_str(kp): np.asarray(v) for (kp, _), v in zip(flat, values)}


def checksum(params: dict[str, np.ndarray]) -> float:
    """A position-weighted sum of θ: equal to ~6 significant digits on every mesh and process count
    (sharded reductions may differ in the last bits, so an exact hash would not be)."""
    total = 0.0
    for n, path in enumerate(sorted(params)):
        x = params[path].astype(np.float64).reshape(-1)
        total += float(np.dot(x, np.cos(np.arange(x.size) + n)))
    return total


def _row_tokens(goals: tuple[int, ...], index: int, length: int, vocab: int) -> np.ndarray:
    """Fixed token ids of one row: a function of the version's task batch (common random numbers)."""
    base = sum(goals) + 7 * index
    return ((base + 13 * np.arange(length)) % vocab).astype(np.int32)


#: Perturbed leaves of the smoke run: one kernel sharded on its input axis (o_proj: heads), one on its output
#: axis (up_proj: mlp), the vocab-sharded embedding and a replicated vector (dense noise). A subset keeps the
#: compile short on small CPUs; every sharding case of the full model is still covered.
SMOKE_SCOPE = (r"attn/o_proj/kernel$", r"mlp/up_proj/kernel$", r"^embed/embedding$", r"^final_norm/scale$")


def smoke_es_config(mode: str = "lowrank", seed: int = 0) -> Any:
    """The ES settings of the smoke run (z-scores: continuous in fitness, so last-bit differences between
    meshes cannot flip a rank and change the update)."""
    from esjax.es.noise import NoiseSpec, Scope
    from esjax.es.step import ESConfig

    return ESConfig(
        noise=NoiseSpec(seed=seed + 1, mode=mode, rank=2, antithetic=True, scope=Scope("all", include=SMOKE_SCOPE)),
        sigma=0.05, learning_rate=0.02, scale="llm", shaping="z_score")


def deterministic_run(mesh: Any, *, updates: int = 3, population: int = 4, max_lag: int = 1, slots: int = 6,
                      seq_len: int = 8, mode: str = "lowrank", seed: int = 0, model_config: Any = None,
                      checkpoint_dir: str | None = None, capacity: int = 64) -> SmokeResult:
    """Run ``updates`` ES updates on ``mesh`` with a model-derived deterministic fitness (see module doc).

    Every process of a multi-process job must call this with the same arguments. With ``checkpoint_dir`` the
    final state and coordinator are written there collectively (orbax), restored, and checked equal.
    ``capacity``: results per exchange round (a small value forces multi-round exchanges).
    """
    import jax
    import jax.numpy as jnp

    from esjax.loop.coordinator import Coordinator, CoordinatorConfig, apply_cohorts
    from esjax.loop.es_update import ESUpdate
    from esjax.loop.staleness import Async
    from esjax.model.params import init_params
    from esjax.model.perturb import Perturbation
    from esjax.model.sharding import pad_rows_to
    from esjax.model.testing import tiny_config
    from esjax.parallel.multihost import exchange_results, local_rows, owned_rows
    from esjax.parallel.sharded import ShardedES, population_forward

    cfg = model_config if model_config is not None else tiny_config()
    es_config = smoke_es_config(mode, seed)
    sharded = ShardedES(es_config, cfg, mesh)
    params = init_params(cfg, jax.random.key(seed))
    engine = ESUpdate(es_config, state=sharded.init(params), keep=max_lag + 1, update_fn=sharded.update_fn)
    coord = Coordinator(CoordinatorConfig(population, max_lag, seed=seed, train_size=100, tasks_per_member=2),
                        Async())

    def score(logits, tokens, mask):
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return jnp.mean(picked, axis=-1)

    fwd = population_forward(cfg, mesh, head=score)
    rows = pad_rows_to(slots, mesh)
    mine = owned_rows(mesh, rows)
    pending: list[tuple[int, Any]] = []  # (due tick, Result) of rows this process owns
    records: list[Any] = []
    tick = 0
    while coord.version < updates:
        if tick > 50 * updates:
            raise RuntimeError("smoke run made no progress")
        jobs = coord.next_jobs(slots - coord.in_flight)
        if jobs:
            tokens = np.zeros((rows, seq_len), np.int32)
            for r, job in enumerate(jobs):
                tokens[r] = _row_tokens(job.tasks.goals, job.member.index, seq_len, cfg.vocab_size)
            versions = [j.member.version for j in jobs] + [0] * (rows - len(jobs))
            indices = [j.member.index for j in jobs] + [0] * (rows - len(jobs))
            active = [True] * len(jobs) + [False] * (rows - len(jobs))
            by_version = sorted({j.member.version for j in jobs})
            for v in by_version:  # one forward per live version, as the rollout loop does
                pert = Perturbation.create(es_config.noise, float(es_config.sigma_at(v)), versions, indices,
                                           [a and versions[r] == v for r, a in enumerate(active)])
                fitness = fwd(engine.params_at(v), tokens, np.ones(tokens.shape, bool), pert)
                values = local_rows(fitness, mine)
                for r, job in enumerate(jobs):
                    if job.member.version == v and r in values:
                        delay = 1 + (job.job_id % 3 == 0)  # every third result arrives a tick late
                        pending.append((tick + delay, job.result(float(values[r]), duration=float(delay))))
        due = [res for t, res in pending if t <= tick]
        pending = [(t, res) for t, res in pending if t > tick]
        for res in exchange_results(due, capacity):
            if coord.version >= updates:
                break
            coord.report(res)
            records.extend(apply_cohorts(coord, engine, until=updates))
        tick += 1

    if checkpoint_dir is not None:
        _checkpoint_roundtrip(checkpoint_dir, engine.state, coord)
    return SmokeResult(engine.state, coord, records, tick, sharded)


def _checkpoint_roundtrip(directory: str, state: Any, coord: Any) -> None:
    """Save collectively, restore into the same shardings, and insist nothing changed."""
    import jax

    from esjax.rundir.checkpoint import Checkpointer

    ckpt = Checkpointer(directory)
    ckpt.save(int(state.version), state, coord.state_dict())
    step, restored, loop_state = ckpt.restore_latest(lambda loop: state)
    ckpt.close()
    if step != int(state.version) or loop_state != json.loads(json.dumps(coord.state_dict())):
        raise RuntimeError(f"checkpoint round trip changed the loop state (step {step})")
    before, after = gather_params(state.params), gather_params(restored.params)
    for path in before:
        if not np.array_equal(before[path], after[path]):
            raise RuntimeError(f"checkpoint round trip changed {path}")
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(restored.params)):
        if a.sharding != b.sharding:
            raise RuntimeError(f"checkpoint restored with sharding {b.sharding}, expected {a.sharding}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m esjax.parallel.smoke", description=__doc__.split("\n")[0])
    parser.add_argument("--mesh", default="data=0,model=1", help="data=D,model=M (data=0: all devices)")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--mode", choices=("lowrank", "full"), default="lowrank")
    parser.add_argument("--distributed", action="store_true",
                        help="join a multi-process job from ESJAX_* / JAX_* environment variables first")
    parser.add_argument("--checkpoint-dir", help="also write and restore one shared orbax checkpoint here")
    parser.add_argument("--exchange-capacity", type=int, default=64, help="results per exchange round")
    parser.add_argument("--out", help="write the final θ as .npz here (process 0)")
    args = parser.parse_args(argv)

    from esjax.model.sharding import parse_mesh
    from esjax.parallel import multihost

    mesh, _ = multihost.setup({**parse_mesh(args.mesh), "distributed": args.distributed})
    import jax

    from esjax.model.sharding import pad_rows_to
    from esjax.parallel.multihost import owned_rows

    result = deterministic_run(mesh, updates=args.updates, mode=args.mode, checkpoint_dir=args.checkpoint_dir,
                               capacity=args.exchange_capacity)
    params = result.params_numpy()
    totals = result.coordinator.totals()
    line = {"process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
            "mesh": dict(mesh.shape), "version": int(result.state.version),
            "checksum": float(f"{checksum(params):.7g}"), "lag_hist": totals["lag_hist"], "ticks": result.ticks,
            "owned_rows": owned_rows(mesh, pad_rows_to(6, mesh)).tolist()}
    print(json.dumps(line), flush=True)
    if args.out and jax.process_index() == 0:
        np.savez(args.out, **{k.replace("/", "."): v for k, v in params.items()})
    multihost.barrier("esjax-smoke-end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
