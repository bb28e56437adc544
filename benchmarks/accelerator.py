"""Accelerator check and benchmark: one prepared command for a short GPU/TPU session (<= 8 minutes).

    python benchmarks/accelerator.py                        # Qwen2.5-0.5B-shaped random model, bf16
    python benchmarks/accelerator.py --update-md BENCHMARKS.md   # also rewrite BENCHMARKS.md's Accelerator section
    python benchmarks/accelerator.py --tiny                 # every section at tiny sizes on CPU (a test runs it)

Sections, in priority order (issue 33's device targets first; each runs in its own subprocess, so its peak
device memory is its own and a crash, an out-of-memory error or a hang costs that section only; a global time
budget skips what is left):

  device        backend, devices, memory limit, jax version
  smoke         core paths on the device at tiny sizes, compared with the CPU backend: ES noise (bit-exact),
                the ES update (full and low-rank), the population forward (plain, low-rank r=1/4, full; f32 and
                bf16) and candidate scoring (prefix-cached vs full-sequence)
  forward       population forward of M members x R rows x T tokens (plain / low-rank r=1 / r=4 / full) through
                ``esjax.model.decoder.forward`` + the output head on the last position; ratio = throughput /
                plain, interleaved rounds as in benchmarks/population_forward.py; XLA flops and memory per mode
  update        ``esjax.es.update`` full mode on a flat D-vector (D = the model's parameter count, N members)
                vs the noise-draw floors, built by benchmarks/es_update.py; peak device memory of each
  plan_*        ``esjax.plan.plan_memory``'s prediction vs the measured peak device memory of a rollout
                prefill (θ + KV cache + low-rank members) and of the update on the model's parameter tree
  generation    ``esjax.agent.batch_generate.generate`` new tokens/s with low-rank members (greedy, no stops) at
                each row count of the sweep (32 / 64 / 256), decode time apart from the prefill, against the
                bandwidth roofline (weights + live KV cache per decode step at the device copy bandwidth measured
                in the same section)
  paper         the published study's config (configs/qwen2.5-7b-generate.yaml: a Qwen2.5-7B shape, random
                weights, bf16, generate mode, N = 30 rank-1 members) through the trainer for one update on
                real WebShop goals, with its seconds and peak device memory (few goals and turns: it shows the
                config runs and what an update costs, not the study's episode budget)
  rollout       benchmarks/rollout.py (the trainer's loop vs its bare-program floor) on a Qwen2.5-0.5B-shaped
                random model in score mode

The result is a JSON record (``--json``); ``--markdown`` prints the BENCHMARKS.md section and
``--update-md FILE`` replaces that file's "## Accelerator" section with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import hashlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for p in (ROOT, BENCH):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

SECTIONS = ["device", "smoke", "generation", "paper", "rollout", "forward", "update_full", "update_floor",
            "plan_rollout", "plan_update_full", "plan_update_lowrank"]
#: --tiny leaves out the rollout section: it is benchmarks/rollout.py --quick, which has its own test
#: (tests/benchmark_scripts/test_benchmark_rollout.py) and would double the tiny run's time.
TINY_SECTIONS = [s for s in SECTIONS if s != "rollout"]
MD_HEADING = "## Accelerator"


@dataclasses.dataclass(frozen=True)
class Sizes:
    model: str                 # a built-in name of esjax.plan.models, or "tiny"
    dtype: str
    members: int               # population members in the forward batch
    rows_per_member: int       # episodes per member (rows sharing one member's noise)
    seq: int                   # tokens per row (prefill length)
    rounds: int                # interleaved timing rounds of the forward
    population: int            # N of the ES update
    repeats: int               # timed repeats of the update / floors
    gen_rows: tuple[int, ...]  # the generation section's row counts
    gen_prompt: int
    gen_new: int
    paper_config: str          # the paper section's config (a path under the repository)
    paper_model: str           # its random model's shape (a built-in name of esjax.plan.models, or "tiny")
    budget_s: float            # global wall-clock budget (sections past it are skipped)
    caps: dict[str, float]     # per-section timeout (capped by what is left of the budget)


#: The full run fits one device call of 10 minutes (budget 560 s; run it with a 600 s limit).
FULL = Sizes(model="Qwen2.5-0.5B", dtype="bfloat16", members=32, rows_per_member=4, seq=512, rounds=5,
             population=32, repeats=5, gen_rows=(32, 64, 256), gen_prompt=256, gen_new=64,
             paper_config="configs/qwen2.5-7b-generate.yaml", paper_model="Qwen2.5-7B", budget_s=560.0,
             caps={"device": 60, "smoke": 120, "generation": 120, "paper": 240, "rollout": 240, "forward": 240,
                   "update_full": 90, "update_floor": 90, "plan_rollout": 90, "plan_update_full": 90,
                   "plan_update_lowrank": 90})
TINY = Sizes(model="tiny", dtype="bfloat16", members=4, rows_per_member=2, seq=16, rounds=2, population=8,
             repeats=2, gen_rows=(2, 4), gen_prompt=8, gen_new=8, paper_config="configs/generate-tiny.yaml",
             paper_model="tiny", budget_s=300.0,
             caps={"device": 60, "smoke": 90, "generation": 60, "paper": 120, "rollout": 120, "forward": 90,
                   "update_full": 60, "update_floor": 60, "plan_rollout": 60, "plan_update_full": 60,
                   "plan_update_lowrank": 60})


# ---------------------------------------------------------------------------------------------------------
# Helpers used inside a section's subprocess
# ---------------------------------------------------------------------------------------------------------
def _model_config(sizes: Sizes):
    if sizes.model == "tiny":
        from esjax.model.testing import tiny_config

        return tiny_config(vocab_size=256, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                           intermediate_size=128, tie_word_embeddings=True, dtype=sizes.dtype)
    from esjax.plan.models import BUILTIN

    return dataclasses.replace(BUILTIN[sizes.model], dtype=sizes.dtype)


def _device():
    import jax

    return jax.devices()[0]


def _memory(device=None) -> dict[str, Any]:
    """The device allocator's counters (``memory_stats()``; None on CPU) and this process's peak RSS."""
    device = device or _device()
    out: dict[str, Any] = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        stats = device.memory_stats()
    except Exception:  # some backends raise instead of returning None
        stats = None
    out["memory_stats"] = bool(stats)
    if stats:
        for key in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "largest_alloc_size"):
            if key in stats:
                out[key] = int(stats[key])
    return out


def _peak(mem: dict[str, Any]) -> int | None:
    return mem.get("peak_bytes_in_use")


def _xla_memory(compiled) -> dict[str, int] | None:
    try:
        m = compiled.memory_analysis()
    except Exception:
        return None
    if m is None:
        return None
    return {k: int(getattr(m, f"{k}_size_in_bytes", 0)) for k in ("argument", "output", "temp", "alias")}


def _xla_flops(compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def _model_flops(config, params: int, rows: int, seq: int) -> float:
    """Matmul FLOPs of one plain forward with the head on the last position, counted from the shapes.

    XLA's cost analysis is no substitute on a GPU: it leaves out the matmuls it hands to cuBLAS (it counted
    0.10 TFLOP for the ~50 TFLOP forward of Qwen2.5-0.5B on 128 x 512 tokens).
    """
    embed = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    linear = 2 * (params - embed) * rows * seq  # every kernel of every layer (norm scales are negligible)
    attention = 4 * config.num_layers * rows * seq * seq * config.num_heads * config.head_dim  # QK^T and PV, unmasked
    head = 2 * config.hidden_size * config.vocab_size * rows
    return float(linear + attention + head)


def _random_params(config, dtype: str):
    """``esjax.model.params.init_params`` on the device. The first section that needs them saves the host
    arrays in the run's scratch folder (``ESJAX_ACCEL_SCRATCH``) and later sections load them: drawing 0.5B
    normals on the host takes seconds, loading them back a fraction of that."""
    import jax
    import numpy as np

    from esjax.es.noise import path_str
    from esjax.model.params import init_params, param_shapes

    shapes = param_shapes(config, dtype)
    flat, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    keys = [path_str(kp).replace("/", "|") for kp, _ in flat]
    scratch = os.environ.get("ESJAX_ACCEL_SCRATCH")
    tag = hashlib.sha1(repr((config, dtype)).encode()).hexdigest()[:16]
    file = Path(scratch) / f"params-{tag}.npz" if scratch else None
    if file is not None and file.exists():
        with np.load(file) as z:
            leaves = [z[k].view(s.dtype) for k, (_, s) in zip(keys, flat)]
        return jax.device_put(jax.tree_util.tree_unflatten(treedef, leaves), _device())
    params = init_params(config, jax.random.key(0), dtype=dtype)
    if file is not None:
        host = [np.asarray(x) for x in jax.tree.leaves(params)]
        as_bits = {k: x.view(f"u{x.dtype.itemsize}") for k, x in zip(keys, host)}
        np.savez(file.with_suffix(".tmp.npz"), **as_bits)
        os.replace(file.with_suffix(".tmp.npz"), file)
    return jax.device_put(params, _device())


def _members(members: int, rows_per_member: int):
    import numpy as np

    rows = members * rows_per_member
    versions = np.full(rows, 3, np.int32)
    indices = np.repeat(np.arange(members, dtype=np.int32), rows_per_member)
    return versions, indices


def _perturbation(mode: str, rank: int, versions, indices, group_size: int, sigma: float = 1e-3):
    from esjax.es.noise import NoiseSpec
    from esjax.model.perturb import Perturbation

    return Perturbation.create(NoiseSpec(seed=0, mode=mode, rank=rank), sigma, versions, indices,
                               group_size=group_size)


@functools.cache
def _forward_last():
    """jit: the decoder over every token, then the output head on the last position (float32 [B, vocab])."""
    import jax

    from esjax.model.decoder import forward, logits_from_hidden
    from esjax.model.perturb import prepare

    def fn(config, params, tokens, perturbation):
        prepared = prepare(perturbation, params)  # one noise draw shared by the layers and the head
        hidden, _ = forward(config, params, tokens, perturbation=prepared, return_hidden=True)
        return logits_from_hidden(config, params, hidden[:, -1:], prepared)[:, 0]

    return jax.jit(fn, static_argnames=("config",))


# ---------------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------------
def section_device(sizes: Sizes) -> dict[str, Any]:
    import jax
    import jaxlib

    from esjax.rundir.machine import machine_info

    devices = jax.devices()
    d = devices[0]
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": jax.default_backend(),
            "device_kind": getattr(d, "device_kind", str(d)), "platform": d.platform, "device_count": len(devices),
            "devices": [str(x) for x in devices[:16]], "memory": _memory(d), "host": machine_info(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "default")}


def _cpu_device():
    import jax

    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return None


def _max_diff(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def section_smoke(sizes: Sizes) -> dict[str, Any]:
    """Tiny-size runs of every core path on the device; each compared with the CPU backend when it exists
    (float32 at the highest matmul precision, so a GPU's TF32 does not count as a mismatch)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from esjax.agent.scoring import score_candidates
    from esjax.es import ESConfig, NoiseSpec, init, update
    from esjax.es.noise import pair_noise
    from esjax.model.decoder import forward_jit
    from esjax.model.params import init_params
    from esjax.model.testing import tiny_config

    jax.config.update("jax_default_matmul_precision", "highest")  # f32 comparisons: no TF32 on GPUs
    dev, cpu = _device(), _cpu_device()
    on_cpu = cpu is None or dev == cpu  # nothing to compare with
    checks: dict[str, dict[str, Any]] = {}

    def both(fn, *args):
        """fn(*args) on the device and on the CPU backend (None when this run is on CPU already)."""
        here = jax.block_until_ready(fn(*jax.device_put(args, dev)))
        if on_cpu:
            return here, None
        with jax.default_device(cpu):  # helpers that create arrays (jnp.asarray) put them on the CPU too
            there = jax.block_until_ready(fn(*jax.device_put(args, cpu)))
        return here, there

    def check(name, ok, **info):
        checks[name] = {"ok": bool(ok), **info}

    # ES noise: threefry is a function of (key, element index), so every backend draws the same bits; the
    # normals go through erf_inv, whose last ulp may differ between backends
    spec = NoiseSpec(seed=7, mode="full")
    path, shape = "layers/mlp/up/kernel", (2, 64, 48)
    here, there = both(jax.jit(lambda v: jax.random.bits(spec.draw_key(path, v, 5), shape)), jnp.int32(3))
    check("noise_bits_bit_exact", there is None or np.array_equal(here, there), compared_with_cpu=there is not None)
    here, there = both(jax.jit(lambda v: pair_noise(spec, path, shape, v, 5)), jnp.int32(3))
    diff = 0.0 if there is None else _max_diff(here, there)
    check("noise_normals", bool(np.all(np.isfinite(here))) and diff <= 1e-5, max_abs_diff_vs_cpu=diff,
          bit_exact=there is None or np.array_equal(here, there))

    config = tiny_config(tie_word_embeddings=True, dtype="float32")
    params32 = init_params(config, jax.random.key(1), dtype="float32")
    n = 8
    versions, indices = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    fitness = np.random.default_rng(0).normal(size=n).astype(np.float32)
    for mode in ("full", "lowrank"):
        es = ESConfig(noise=NoiseSpec(seed=0, mode=mode, rank=2), sigma=0.01, learning_rate=0.1, scale="nes")
        fn = lambda p, v, i, f, es=es: update(es, init(es, p), v, i, f)[0].params
        here, there = both(fn, params32, versions, indices, fitness)
        finite = all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(here))
        diff = 0.0 if there is None else max(_max_diff(a, b) for a, b in zip(jax.tree.leaves(here),
                                                                              jax.tree.leaves(there)))
        moved = max(_max_diff(a, b) for a, b in zip(jax.tree.leaves(here), jax.tree.leaves(params32)))
        check(f"update_{mode}", finite and moved > 0 and diff <= 1e-4, max_abs_diff_vs_cpu=diff, moved=moved,
              tolerance=1e-4)

    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (8, 12)).astype(np.int32)
    v8, i8 = _members(4, 2)
    every = (("plain", 0), ("lowrank", 1), ("full", 0))  # rank 4 runs on the device in the forward section
    for dtype, tol, modes in (("float32", 2e-3, every), ("bfloat16", 0.25, every[:2])):
        params = params32 if dtype == "float32" else init_params(config, jax.random.key(1), dtype=dtype)
        plain = None
        for mode, rank in modes:
            pert = None if mode == "plain" else _perturbation(mode, max(rank, 1), v8, i8, 2, sigma=0.01)
            fn = lambda p, t, q, config=config: forward_jit(config, p, t, perturbation=q)[0]
            here, there = both(fn, params, tokens, pert)
            plain = here if mode == "plain" else plain
            diff = 0.0 if there is None else _max_diff(here, there)
            differs = mode == "plain" or _max_diff(here, plain) > 0  # a perturbation must change the logits
            name = f"forward_{mode}{rank if mode == 'lowrank' else ''}_{dtype}"
            check(name, bool(np.all(np.isfinite(here))) and diff <= tol and differs, max_abs_diff_vs_cpu=diff,
                  tolerance=tol)
        zero = _perturbation("lowrank", 1, v8, i8, 2, sigma=0.0)
        same = forward_jit(config, jax.device_put(params, dev), tokens, perturbation=zero)[0]
        check(f"forward_sigma0_equals_plain_{dtype}", _max_diff(same, plain) <= (1e-5 if dtype == "float32" else 0.05),
              max_abs_diff=_max_diff(same, plain))

    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, config.vocab_size, int(rng.integers(4, 10))).tolist() for _ in range(4)]
    cands = [[rng.integers(0, config.vocab_size, int(rng.integers(1, 4))).tolist() for _ in range(3)] for _ in range(4)]
    spert = _perturbation("lowrank", 1, np.full(4, 3), np.arange(4), 1)
    p_dev = jax.device_put(params32, dev)
    cached = score_candidates(config, p_dev, prompts, cands, spert)
    naive = score_candidates(config, p_dev, prompts, cands, spert, prefix_cache=False)
    diff = _max_diff(cached, naive)
    cpu_diff = None
    if not on_cpu:
        with jax.default_device(cpu):
            cpu_scores = score_candidates(config, jax.device_put(params32, cpu), prompts, cands,
                                          jax.device_put(spert, cpu))
        cpu_diff = _max_diff(cached, cpu_scores)
    check("scoring_prefix_cache_equals_full_sequence", bool(np.all(np.isfinite(cached))) and diff <= 1e-3
          and (cpu_diff is None or cpu_diff <= 1e-2), max_abs_diff=diff, max_abs_diff_vs_cpu=cpu_diff)

    failed = [k for k, v in checks.items() if not v["ok"]]
    out = {"checks": checks, "passed": len(checks) - len(failed), "total": len(checks),
           "compared_with_cpu": not on_cpu, "memory": _memory(dev)}
    if failed:
        out["error"] = f"smoke checks failed: {', '.join(failed)}"
    return out


def section_forward(sizes: Sizes) -> dict[str, Any]:
    import jax
    import numpy as np
    from population_forward import _time  # benchmarks/population_forward.py's timer (wall + process CPU)

    from esjax.model.params import param_count

    config = _model_config(sizes)
    params = _random_params(config, sizes.dtype)
    rows = sizes.members * sizes.rows_per_member
    tokens = jax.device_put(np.random.RandomState(0).randint(0, config.vocab_size, (rows, sizes.seq)).astype(np.int32))
    versions, indices = _members(sizes.members, sizes.rows_per_member)
    modes = {"plain": None,
             "lowrank r=1": _perturbation("lowrank", 1, versions, indices, sizes.rows_per_member),
             "lowrank r=4": _perturbation("lowrank", 4, versions, indices, sizes.rows_per_member),
             "full": _perturbation("full", 1, versions, indices, sizes.rows_per_member)}
    fn = _forward_last()
    compiled, info = {}, {}
    for name, pert in modes.items():
        t0 = time.perf_counter()
        compiled[name] = fn.lower(config, params, tokens, pert).compile()
        info[name] = {"compile_s": time.perf_counter() - t0, "xla_memory": _xla_memory(compiled[name]),
                      "xla_flops": _xla_flops(compiled[name])}
        logits = compiled[name](params, tokens, pert)
        info[name]["finite"] = bool(np.all(np.isfinite(np.asarray(logits, np.float32))))
        info[name]["first_call_s"] = _time(lambda name=name, pert=pert: compiled[name](params, tokens, pert))
    times: dict[str, list[float]] = {name: [] for name in modes}
    names = list(modes)
    for r in range(sizes.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotated order, as population_forward
            call = lambda name=name: compiled[name](params, tokens, modes[name])
            _time(call)  # untimed: the previous mode's buffers drain first
            times[name].append(_time(call))
    out_modes = {}
    for name in modes:
        med = statistics.median(times[name])
        ratios = [p / t for p, t in zip(times["plain"], times[name])]
        flops = info[name]["xla_flops"]
        out_modes[name] = {**info[name], "median_s": med, "times_s": times[name],
                           "tokens_per_s": rows * sizes.seq / med, "ratio_vs_plain": statistics.median(ratios),
                           "tflops_per_s": None if flops is None else flops / med / 1e12}
    out = {"model": sizes.model, "params": param_count(params), "dtype": sizes.dtype, "members": sizes.members,
           "rows_per_member": sizes.rows_per_member, "rows": rows, "seq": sizes.seq, "rounds": sizes.rounds,
           "modes": out_modes, "memory": _memory(),
           "model_flops": _model_flops(config, param_count(params), rows, sizes.seq)}
    bad = [name for name, m in out_modes.items() if not m["finite"]]
    if bad:
        out["error"] = f"non-finite logits: {', '.join(bad)}"
    return out


def _update_section(kind: str, sizes: Sizes) -> dict[str, Any]:
    import jax
    from es_update import _build  # benchmarks/es_update.py: the same builds its CPU table uses

    from esjax.model.params import param_count, param_shapes

    dims = param_count(param_shapes(_model_config(sizes)))
    t0 = time.perf_counter()
    step, state, xla_bytes = _build(kind, dims, sizes.population)  # compiles and runs twice (warm-up)
    build_s = time.perf_counter() - t0
    times = []
    for _ in range(sizes.repeats):
        t = time.perf_counter()
        state = jax.block_until_ready(step(state))
        times.append(time.perf_counter() - t)
    return {"kind": kind, "dims": dims, "population": sizes.population, "build_and_warmup_s": build_s,
            "median_s": statistics.median(times), "times_s": times, "xla_temp_plus_output_bytes": xla_bytes,
            "memory": _memory()}


def section_update_full(sizes: Sizes) -> dict[str, Any]:
    return _update_section("esjax_full", sizes)


def section_update_floor(sizes: Sizes) -> dict[str, Any]:
    return _update_section("floor_unique", sizes)


def _plan(sizes: Sizes, mode: str, context: int, bytes_limit: int | None):
    from esjax.plan import plan_memory

    config = _model_config(sizes)
    return plan_memory(config, population=sizes.members, max_lag=0, batch=sizes.members * sizes.rows_per_member,
                       context=context, prefill=sizes.seq, dtype=sizes.dtype, mode=mode, rank=1,
                       episodes_per_member=sizes.rows_per_member, device_memory=bytes_limit or "80GB",
                       label=sizes.model)


def _compare(plan_bytes: int, mem: dict[str, Any]) -> dict[str, Any]:
    measured = _peak(mem)
    return {"planned_bytes": plan_bytes, "measured_peak_bytes": measured,
            "measured_over_planned": None if measured is None else measured / plan_bytes}


def section_plan_rollout(sizes: Sizes) -> dict[str, Any]:
    """θ + the KV cache of every row + one prefill of T tokens with low-rank r=1 members."""
    import jax
    import numpy as np

    from esjax.model.decoder import forward, init_cache, logits_from_hidden
    from esjax.model.perturb import prepare

    config = _model_config(sizes)
    params = _random_params(config, sizes.dtype)
    rows, context = sizes.members * sizes.rows_per_member, sizes.seq + sizes.gen_new
    cache = jax.jit(lambda: init_cache(config, rows, context, sizes.dtype))()
    tokens = jax.device_put(np.random.RandomState(0).randint(0, config.vocab_size, (rows, sizes.seq)).astype(np.int32))
    pert = _perturbation("lowrank", 1, *_members(sizes.members, sizes.rows_per_member), sizes.rows_per_member)

    @functools.partial(jax.jit, donate_argnums=(1,))
    def prefill(params, cache, tokens, pert):
        prepared = prepare(pert, params)
        hidden, cache = forward(config, params, tokens, cache=cache, perturbation=prepared, return_hidden=True)
        return logits_from_hidden(config, params, hidden[:, -1:], prepared), cache

    logits, cache = jax.block_until_ready(prefill(params, cache, tokens, pert))
    mem = _memory()
    plan = _plan(sizes, "lowrank", context, mem.get("bytes_limit"))
    return {"rows": rows, "context": context, "prefill": sizes.seq, "plan_lines": plan.to_dict()["lines"],
            **_compare(plan.rollout_peak, mem), "memory": mem}


def _plan_update(sizes: Sizes, mode: str) -> dict[str, Any]:
    """θ + the KV cache (held through the update, as the plan counts it) + one ES update of N members."""
    import jax
    import numpy as np

    from esjax.es import ESConfig, NoiseSpec, Scope, init, update
    from esjax.model.decoder import init_cache

    config = _model_config(sizes)
    params = _random_params(config, sizes.dtype)
    rows, context = sizes.members * sizes.rows_per_member, sizes.seq + sizes.gen_new
    cache = jax.jit(lambda: init_cache(config, rows, context, sizes.dtype))()
    es = ESConfig(noise=NoiseSpec(seed=0, mode=mode, rank=1, scope=Scope("matrices")), sigma=1e-3,
                  learning_rate=1e-3, scale="llm")
    n = sizes.members  # the plan's population
    state = init(es, params)
    versions, indices = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    fitness = np.random.default_rng(0).normal(size=n).astype(np.float32)
    t0 = time.perf_counter()
    jax.block_until_ready(update(es, state, versions, indices, fitness))  # its output freed before the next call
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(update(es, state, versions, indices, fitness))
    second_s = time.perf_counter() - t0
    del cache
    mem = _memory()
    plan = _plan(sizes, mode, context, mem.get("bytes_limit"))
    return {"mode": mode, "population": n, "first_call_s": first_s, "update_s": second_s,
            "plan_lines": plan.to_dict()["lines"], **_compare(plan.update_peak, mem), "memory": mem}


def section_plan_update_full(sizes: Sizes) -> dict[str, Any]:
    return _plan_update(sizes, "full")


def section_plan_update_lowrank(sizes: Sizes) -> dict[str, Any]:
    return _plan_update(sizes, "lowrank")


def _copy_bandwidth(megabytes: int) -> float:
    """Bytes per second of a device copy (read + write) of a ``megabytes`` array: the memory bandwidth a
    bandwidth-bound decode step can use."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
    copy = jax.jit(lambda a: a + 1.0)
    jax.block_until_ready(copy(x))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(copy(x))
        times.append(time.perf_counter() - t0)
    return 2 * x.nbytes / statistics.median(times)


def _timed(fn, repeats: int = 2) -> tuple[Any, float, float]:
    """(last output, first call's seconds incl. compile, median seconds of ``repeats`` more calls)."""
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, first, statistics.median(times)


def section_generation(sizes: Sizes) -> dict[str, Any]:
    """New tokens/s at each row count, the decode steps timed apart from the prefill (a call of one new token),
    against the bandwidth roofline: per decode step the weights plus every row's live KV cache (prompt and half the
    new tokens on average) read once at the measured copy bandwidth."""
    import jax
    import numpy as np

    from esjax.agent.batch_generate import generate

    config = _model_config(sizes)
    params = _random_params(config, sizes.dtype)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    bandwidth = _copy_bandwidth(16 if sizes.model == "tiny" else 2048)
    itemsize = np.dtype(sizes.dtype).itemsize if sizes.dtype != "bfloat16" else 2
    kv_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize
    rng = np.random.default_rng(0)
    runs = []
    for rows in sizes.gen_rows:
        prompts = [rng.integers(0, config.vocab_size, sizes.gen_prompt).tolist() for _ in range(rows)]
        pert = _perturbation("lowrank", 1, *_members(rows, 1), 1)
        call = functools.partial(generate, config, params, prompts, pert, stop_token_ids=[])
        out, first_s, total_s = _timed(functools.partial(call, max_new_tokens=sizes.gen_new))
        _, _, prefill_s = _timed(functools.partial(call, max_new_tokens=1))
        new_tokens = sum(len(x) for x in out)
        assert new_tokens == rows * sizes.gen_new, new_tokens
        steps = sizes.gen_new - 1  # the first new token comes from the prefill
        decode_s = max(total_s - prefill_s, 1e-9)
        step_bytes = param_bytes + rows * kv_per_token * (sizes.gen_prompt + sizes.gen_new / 2)
        roofline = rows / (step_bytes / bandwidth)  # new tokens/s if a decode step only read what it must
        runs.append({"rows": rows, "first_call_s": first_s, "median_s": total_s, "prefill_s": prefill_s,
                     "new_tokens_per_s": new_tokens / total_s, "decode_tokens_per_s": rows * steps / decode_s,
                     "decode_step_ms": 1e3 * decode_s / steps, "roofline_step_ms": 1e3 * step_bytes / bandwidth,
                     "roofline_tokens_per_s": roofline, "of_roofline": rows * steps / decode_s / roofline})
    return {"prompt": sizes.gen_prompt, "new_tokens_per_row": sizes.gen_new, "param_bytes": param_bytes,
            "copy_bandwidth_bytes_per_s": bandwidth, "runs": runs, "memory": _memory()}


def section_paper(sizes: Sizes) -> dict[str, Any]:
    """One ES update of the paper's config on a random model of its shape, through the trainer, in this process
    (so the device's peak memory is the run's)."""
    import json as _json

    from esjax.config import load_config
    from esjax.model.config import to_hf_dict
    from esjax.rundir.metrics import read_metrics
    from esjax.train.session import train

    overrides = ["model.source=random", "env.data=webshop_small", "run.updates=1", "run.eval_every=1000",
                 "run.checkpoint_every=1000", "run.progress=false", "run.plots=false", "env.tasks_per_member=1",
                 "env.eval_goals=1", "env.max_steps=4"]
    if sizes.paper_model != "tiny":
        config = _model_config(dataclasses.replace(sizes, model=sizes.paper_model))
        overrides.append(f"model.random_config={_json.dumps(to_hf_dict(config))}")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = train(load_config(ROOT / sizes.paper_config, overrides), Path(tmp) / "run")
        seconds = time.perf_counter() - t0
        records = read_metrics(Path(tmp) / "run" / "metrics.jsonl")
    update = next(r for r in records if r["kind"] == "update")
    return {"config": sizes.paper_config, "model": sizes.paper_model, "overrides": overrides[:-1]
            if sizes.paper_model != "tiny" else overrides, "updates": result.version, "run_seconds": seconds,
            "update_seconds": update["seconds"], "episodes_per_s": update["episodes_per_s"],
            "tokens_per_s": update["tokens_per_s"], "memory": _memory()}


def section_rollout(sizes: Sizes) -> dict[str, Any]:
    """benchmarks/rollout.py in a subprocess of its own (the trainer on a random model)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rollout.json"
        cmd = [sys.executable, str(BENCH / "rollout.py"), "--json", str(out)]
        cmd += (["--quick", "--config", str(ROOT / "configs" / "synthetic.yaml")] if sizes.model == "tiny"
                else ["--model", "0.5b", "--updates", "1", "--repeats", "3", "--set", "env.eval_goals=50"])
        # its progress lines pass through to this section's stderr (kept when the section times out)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"benchmarks/rollout.py exited {proc.returncode} (its stderr: the section's)")
        r = json.loads(out.read_text())
    keep = ("updates", "ticks", "env_steps", "calls", "loop_seconds", "loop_cpu_seconds", "env_steps_per_s",
            "env_steps_per_cpu_s", "job_seconds", "job_env_steps_per_s", "tokens_per_s",
            "floor_seconds", "loop_vs_floor", "padding_efficiency", "breakdown_s", "programs")
    shown = [str(Path(x).relative_to(ROOT)) if x.startswith(str(ROOT)) else x for x in cmd[1:] if x != str(out)]
    return {"command": " ".join(x for x in shown if x != "--json"), **{k: r.get(k) for k in keep}}


SECTION_FNS = {name: globals()[f"section_{name}"] for name in SECTIONS}


# ---------------------------------------------------------------------------------------------------------
# The parent: runs each section in a subprocess under the time budget
# ---------------------------------------------------------------------------------------------------------
def _child_main(name: str, sizes: Sizes, fail: str | None) -> int:
    start = time.perf_counter()
    try:
        if name == fail:
            raise RuntimeError(f"--fail-section {name}: injected failure (tests)")
        result = SECTION_FNS[name](sizes)
        code = 0 if "error" not in result else 1
    except BaseException as err:  # noqa: BLE001 - a section's failure is recorded, never fatal to the run
        result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
        code = 1
    result["seconds"] = time.perf_counter() - start
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return code


def _run_section(name: str, sizes: Sizes, timeout: float, tiny: bool, fail: str | None,
                 scratch: str) -> dict[str, Any]:
    env = dict(os.environ, ESJAX_ACCEL_SCRATCH=scratch)
    if tiny:  # CPU, XLA's quick compile and a persistent compilation cache: tiny programs are compile-bound
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(tempfile.gettempdir()) / "esjax-accelerator-xla-cache"))
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--sizes",
           json.dumps(dataclasses.asdict(sizes))]
    if fail:
        cmd += ["--fail-section", fail]
    start = time.perf_counter()
    # A session of its own, so a timeout kills the section's subprocesses too (the rollout section's benchmark
    # would otherwise go on holding the device); what they printed so far says where the time went.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return {"status": "error", "error": f"timeout after {timeout:.0f} s", "stderr_tail": stderr[-2000:],
                "seconds": time.perf_counter() - start}
    line = next((x for x in reversed(stdout.splitlines()) if x.startswith("RESULT ")), None)
    if line is None:
        return {"status": "error", "error": f"section process exited {proc.returncode} without a result",
                "stderr_tail": stderr[-3000:], "seconds": time.perf_counter() - start}
    result = json.loads(line[len("RESULT "):])
    result["status"] = "error" if "error" in result else "ok"
    if result["status"] == "error":
        result["stderr_tail"] = stderr[-2000:]
    result["wall_s"] = time.perf_counter() - start
    return result


def run(sizes: Sizes, sections: list[str], tiny: bool, fail: str | None = None) -> dict[str, Any]:
    from esjax.rundir.machine import machine_info

    start = time.perf_counter()
    record: dict[str, Any] = {"tiny": tiny, "sizes": dataclasses.asdict(sizes), "started": _now(),
                              "commit": _commit(), "host": machine_info(), "sections": {}}
    scratch = tempfile.TemporaryDirectory(prefix="esjax-accelerator-")
    for name in sections:
        left = sizes.budget_s - (time.perf_counter() - start)
        if left <= 5:
            record["sections"][name] = {"status": "skipped", "error": f"time budget of {sizes.budget_s:.0f} s spent"}
            print(f"[accelerator] {name}: skipped (budget spent)", file=sys.stderr, flush=True)
            continue
        print(f"[accelerator] {name} ...", file=sys.stderr, flush=True)
        result = _run_section(name, sizes, min(left, sizes.caps.get(name, left)), tiny, fail, scratch.name)
        record["sections"][name] = result
        print(f"[accelerator] {name}: {result['status']} in {result.get('wall_s', result.get('seconds', 0)):.1f} s"
              + (f" ({result['error']})" if result["status"] != "ok" else ""), file=sys.stderr, flush=True)
    scratch.cleanup()
    record["total_s"] = time.perf_counter() - start
    record["device"] = _device_name(record)
    record["ok"] = all(s["status"] == "ok" for s in record["sections"].values())
    return record


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _device_name(record: dict[str, Any]) -> str:
    d = record["sections"].get("device", {})
    if d.get("status") != "ok":
        return "unknown (device section did not run)"
    return f"{d['device_count']} x {d['device_kind']} ({d['backend']}, jax {d['jax']})"


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------
def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f}"


def markdown(record: dict[str, Any]) -> str:
    """The BENCHMARKS.md section of one run."""
    s, sz = record["sections"], record["sizes"]
    head = "tiny sizes on CPU: a smoke check of the script, not a measurement" if record["tiny"] else "measured"
    lines = [MD_HEADING, "",
             "`python benchmarks/accelerator.py` (one command; `--tiny` runs every section at tiny sizes on CPU and "
             "is run by tests/benchmark_scripts/test_accelerator_benchmark.py). Each section runs in its own "
             "subprocess; a failed section is recorded without losing the rest; sections past the time budget are "
             "skipped.", "",
             f"Run: {record['started']}, commit {record['commit']}, device **{record['device']}**, host "
             f"{record['host']['cpu']} ({record['host']['cores']} cores, load {record['host']['loadavg']}); "
             f"{head}; total {record['total_s']:.0f} s of a {sz['budget_s']:.0f} s budget; "
             f"{'all sections ok' if record['ok'] else 'NOT all sections ok'}.", ""]
    lines += ["| section | status | seconds |", "|---|---|---|"]
    for name, r in s.items():
        status = r["status"] + (f": {r['error'][:100]}" if r["status"] != "ok" else "")
        lines.append(f"| {name} | {status} | {r.get('wall_s', r.get('seconds', 0)):.1f} |")
    sm = s.get("smoke", {})
    if sm.get("status") in ("ok", "error") and "checks" in sm:
        lines += ["", f"Smoke: {sm['passed']}/{sm['total']} checks passed"
                  + (" (each compared with the CPU backend)" if sm.get("compared_with_cpu") else " (CPU run: no "
                     "cross-backend comparison)") + "."]
    fw = s.get("forward", {})
    if fw.get("status") == "ok":
        lines += ["", f"Population forward: {fw['model']}-shaped random model ({fw['params'] / 1e6:.3g}M params, "
                  f"{fw['dtype']}), {fw['members']} members x {fw['rows_per_member']} rows x {fw['seq']} tokens, "
                  f"head on the last position; median of {fw['rounds']} interleaved rounds. Model TFLOP/s: the "
                  f"plain forward's matmul FLOPs ({fw['model_flops'] / 1e12:.1f} TFLOP, counted from the shapes; "
                  "a perturbation's own FLOPs are not counted) per second of the mode.", "",
                  "| mode | rows·tokens/s | ratio vs plain | model TFLOP/s | compile s | XLA temp GiB |",
                  "|---|---|---|---|---|---|"]
        for name, m in fw["modes"].items():
            tf = f"{fw['model_flops'] / m['median_s'] / 1e12:.3g}"
            temp = None if not m["xla_memory"] else m["xla_memory"]["temp"]
            lines.append(f"| {name} | {m['tokens_per_s']:,.0f} | {m['ratio_vs_plain']:.3f} | {tf} | "
                         f"{m['compile_s']:.1f} | {_gib(temp)} |")
        lines.append(f"\nPeak device memory of the section: {_gib(fw['memory'].get('peak_bytes_in_use'))} GiB.")
    uf, fl = s.get("update_full", {}), s.get("update_floor", {})
    if uf.get("status") == "ok":
        line = (f"\nES update, full mode, D = {uf['dims']:,} (flat f32), N = {uf['population']}: "
                f"{uf['median_s'] * 1e3:.1f} ms, peak device memory {_gib(uf['memory'].get('peak_bytes_in_use'))} GiB")
        if fl.get("status") == "ok":
            line += (f"; floor (the N/2 distinct noise draws only) {fl['median_s'] * 1e3:.1f} ms, peak "
                     f"{_gib(fl['memory'].get('peak_bytes_in_use'))} GiB: **update / floor = "
                     f"{uf['median_s'] / fl['median_s']:.2f}**")
        lines.append(line + ".")
    plans = [(n, s[n]) for n in ("plan_rollout", "plan_update_full", "plan_update_lowrank")
             if s.get(n, {}).get("status") == "ok"]
    if plans:
        lines += ["", "Planner (`esjax.plan.plan_memory`, max lag 0) vs measured peak device memory:", "",
                  "| phase | planned GiB | measured peak GiB | measured / planned |", "|---|---|---|---|"]
        for name, r in plans:
            ratio = r["measured_over_planned"]
            ratio = "n/a (no memory_stats)" if ratio is None else f"{ratio:.2f}"
            lines.append(f"| {name} | {_gib(r['planned_bytes'])} | {_gib(r['measured_peak_bytes'])} | {ratio} |")
    g = s.get("generation", {})
    if g.get("status") == "ok":
        lines += ["", f"Generation (greedy, low-rank r=1 members, {g['prompt']}-token prompts, "
                  f"{g['new_tokens_per_row']} new tokens each; device copy bandwidth "
                  f"{g['copy_bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s; roofline: the weights "
                  f"({_gib(g['param_bytes'])} GiB) and each row's live KV cache read once per decode step):", "",
                  "| rows | new tokens/s (incl. prefill) | decode tokens/s | decode step ms | roofline step ms | "
                  "of roofline | first call s |", "|---|---|---|---|---|---|---|"]
        for r in g["runs"]:
            lines.append(f"| {r['rows']} | {r['new_tokens_per_s']:,.0f} | {r['decode_tokens_per_s']:,.0f} | "
                         f"{r['decode_step_ms']:.2f} | {r['roofline_step_ms']:.2f} | **{r['of_roofline']:.2f}** | "
                         f"{r['first_call_s']:.1f} |")
    pa = s.get("paper", {})
    if pa.get("status") == "ok":
        lines.append(f"\nThe paper's config (`{pa['config']}`, a random {pa['model']}-shaped model; "
                     f"{' '.join(pa['overrides'])}): {pa['updates']} update in {pa['run_seconds']:.0f} s (the "
                     f"update's own record: {pa['update_seconds']:.0f} s, {pa['episodes_per_s']:.2f} episodes/s, "
                     f"{pa['tokens_per_s']:,.0f} tokens/s); peak device memory "
                     f"{_gib(pa['memory'].get('peak_bytes_in_use'))} GiB.")
    ro = s.get("rollout", {})
    if ro.get("status") == "ok":
        lines.append(f"\nRollout loop (`{ro['command']}`): {ro['env_steps_per_s']:.0f} env steps/s, "
                     f"loop vs bare-program floor {ro['loop_vs_floor']:.2f}, padding efficiency "
                     f"{ro['padding_efficiency']:.2f}; of the loop's {ro['loop_seconds']:.1f} s: "
                     + ", ".join(f"{k} {v / ro['loop_seconds']:.0%}" for k, v in ro["breakdown_s"].items())
                     + f" ({ro['programs']} scoring programs).")
    return "\n".join(lines) + "\n"


def update_markdown(path: Path, section: str) -> None:
    """Replace ``path``'s "## Accelerator" section (up to the next "## " heading) with ``section``, or append it."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, x in enumerate(lines) if x.rstrip() == MD_HEADING), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny sizes, CPU backend (well under a minute)")
    ap.add_argument("--sections", default=None,
                    help=f"comma-separated subset of {SECTIONS} (default: all; --tiny: all but rollout)")
    ap.add_argument("--budget-s", type=float, default=None, help="global wall-clock budget in seconds")
    ap.add_argument("--members", type=int, default=None)
    ap.add_argument("--rows-per-member", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None,
                    help="where to write the JSON record (default benchmarks/accelerator_result.json; "
                         "--tiny: not written unless given)")
    ap.add_argument("--markdown", action="store_true", help="print the BENCHMARKS.md section")
    ap.add_argument("--update-md", type=Path, default=None, help="replace this file's '## Accelerator' section")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fail-section", default=None, help=argparse.SUPPRESS)  # tests: one section raises
    args = ap.parse_args(argv)
    if args.child:
        sizes = Sizes(**json.loads(args.sizes))
        return _child_main(args.child, sizes, args.fail_section)

    sizes = TINY if args.tiny else FULL
    changes = {k: v for k, v in (("budget_s", args.budget_s), ("members", args.members),
                                 ("rows_per_member", args.rows_per_member), ("seq", args.seq)) if v is not None}
    sizes = dataclasses.replace(sizes, **changes)
    default = TINY_SECTIONS if args.tiny else SECTIONS
    sections = [x.strip() for x in args.sections.split(",") if x.strip()] if args.sections else default
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown sections {unknown}; choose from {SECTIONS}")
    record = run(sizes, sections, args.tiny, args.fail_section)
    out = args.json if args.json or args.tiny else BENCH / "accelerator_result.json"
    if out:
        out.write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"[accelerator] wrote {out}", file=sys.stderr)
    section = markdown(record)
    if args.markdown:
        print(section)
    if args.update_md:
        update_markdown(args.update_md, section)
        print(f"[accelerator] updated the Accelerator section of {args.update_md}", file=sys.stderr)
    print(f"[accelerator] {record['device']}: {sum(s['status'] == 'ok' for s in record['sections'].values())}/"
          f"{len(record['sections'])} sections ok in {record['total_s']:.0f} s", file=sys.stderr)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
