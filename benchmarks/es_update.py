"""ES update cost: esjax vs evosax Open_ES, and esjax vs the cost of merely drawing the noise.

    python benchmarks/es_update.py [--dims 1000000] [--population 256] [--repeats 5]

Memory: every measurement is built, compiled and run in its own fresh subprocess, so its peak resident
memory (``ru_maxrss``) is its own; the baseline subprocess (import jax, build the parameters, run one tiny
jitted op) is subtracted to get the extra peak memory of the step (compilation included). XLA's own
estimate (compiled temp + output buffers) is printed next to it. Time: all steps are built in one more
process and run round-robin ``--repeats`` times after two warm-up runs; the median is reported, so load
changes on a shared machine affect every row alike.

Measured:
  evosax    Open_ES ask + tell (antithetic, centered ranks, SGD) on a flat D-vector: it materializes the
            N × D population.
  esjax     ``esjax.es.update`` full mode (default chunk): regenerates each distinct (version, pair) draw and
            accumulates, O(D) memory. Also through ``CounterOpenES`` (lazy ask + tell), and low-rank mode
            (r = 1) on the same D reshaped into a square matrix.
  floor     drawing the noise once and nothing else: N draws of D normals (scan, summed so they are not
            optimized away), the N/2 distinct draws antithetic sampling needs, and evosax's single
            ``normal((N/2, D))`` call.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import statistics
import subprocess
import sys
import time

from esjax.rundir.machine import cpu_model

# ---------------------------------------------------------------------------------------------------------
# Measurements (run inside a subprocess)
# ---------------------------------------------------------------------------------------------------------


def _build(kind: str, dims: int, population: int):
    """``(step, state, xla_bytes)`` for one measurement; ``step(state) -> state`` is one timed unit."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    n = population
    rng = np.random.default_rng(0)
    fitness = rng.normal(size=n).astype(np.float32)
    mean = jnp.zeros((dims,), jnp.float32)
    block = jax.block_until_ready

    compiled = []
    if kind == "baseline":
        step, state = jax.jit(lambda x: x + 1.0), mean

    elif kind == "evosax":
        from evosax.algorithms import Open_ES

        es = Open_ES(n, mean, optimizer=optax.sgd(1e-3), std_schedule=optax.constant_schedule(0.01))
        params = es.default_params
        key = jax.random.key(0)
        state = es.init(key, mean, params)
        fit = jnp.asarray(fitness)

        def step(state):
            population, state = es.ask(key, state, params)
            state, _ = es.tell(key, population, fit, state, params)
            return state

        population, _ = es.ask(key, state, params)
        compiled += [type(es).ask.lower(es, key, state, params).compile(),
                    type(es).tell.lower(es, key, population, fit, state, params).compile()]
        del population

    elif kind in ("esjax_full", "esjax_lowrank"):
        from esjax.es import ESConfig, NoiseSpec, Scope, init, update

        if kind == "esjax_full":
            params, noise = mean, NoiseSpec(seed=0, mode="full", scope=Scope("all"))
        else:
            side = int(math.isqrt(dims))
            params, noise = jnp.zeros((side, side)), NoiseSpec(seed=0, mode="lowrank", rank=1)
        config = ESConfig(noise=noise, sigma=0.01, learning_rate=1e-3, scale="nes")
        state = init(config, params)
        versions = np.zeros(n, np.int32)
        indices = np.arange(n, dtype=np.int32)

        def step(state):
            new, _ = update(config, state, versions, indices, fitness)
            return new._replace(version=state.version)  # same member ids every repeat

        compiled.append(update.lower(config, state, versions, indices, fitness).compile())

    elif kind == "esjax_counter_open_es":
        from esjax.es.evosax_compat import CounterOpenES

        es = CounterOpenES(n, mean, optimizer=optax.sgd(1e-3), std_schedule=optax.constant_schedule(0.01),
                           lazy_population=True)
        params = es.default_params
        key = jax.random.key(0)
        state = es.init(key, mean, params)
        fit = jnp.asarray(fitness)

        def step(state):
            members, state = es.ask(key, state, params)
            state, _ = es.tell(key, members, fit, state, params)
            return state

    elif kind in ("floor_n", "floor_unique"):
        from esjax.es.noise import NoiseSpec, pair_noise

        spec = NoiseSpec(seed=0, mode="full")
        draws = n if kind == "floor_n" else n // 2

        @jax.jit
        def generate(acc):
            def body(acc, pair):
                return acc + pair_noise(spec, "", (dims,), 0, pair), None

            return jax.lax.scan(body, acc, jnp.arange(draws))[0]

        state = mean
        step = generate

    elif kind == "floor_evosax_draw":
        key = jax.random.key(0)
        draw = jax.jit(lambda k: jax.random.normal(k, (n // 2, dims)))
        state = key
        step = lambda k: (block(draw(k)), k)[1]

    else:
        raise ValueError(kind)

    xla_bytes = None
    if compiled:
        analyses = [c.memory_analysis() for c in compiled]
        xla_bytes = sum(a.temp_size_in_bytes + a.output_size_in_bytes for a in analyses)
        del compiled
    for _ in range(2):  # warm-up: compile (twice: evosax's state changes weak types after its first tell)
        state = block(step(state))
    return step, state, xla_bytes


def _measure_memory(kind: str, dims: int, population: int) -> dict:
    """Peak RSS of a fresh process that builds, compiles and runs one measurement (twice)."""
    _, _, xla_bytes = _build(kind, dims, population)
    return {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
            "xla_bytes": xla_bytes}


def _measure_times(kinds: list[str], dims: int, population: int, repeats: int) -> dict:
    """All timed steps in one process, run round-robin so load changes on a shared machine hit all alike."""
    import jax

    built = {k: list(_build(k, dims, population)[:2]) for k in kinds}
    times = {k: [] for k in kinds}
    for _ in range(repeats):
        for k in kinds:
            step, state = built[k]
            t0 = time.perf_counter()
            built[k][1] = jax.block_until_ready(step(state))
            times[k].append(time.perf_counter() - t0)
    return times


def _child(kind: str, dims: int, population: int, repeats: int) -> None:
    if kind == "times":
        out = _measure_times(TIMED, dims, population, repeats)
    else:
        out = _measure_memory(kind, dims, population)
    print("RESULT " + json.dumps(out))


def _run_child(kind: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--dims", str(args.dims), "--population",
           str(args.population), "--repeats", str(args.repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"measurement {kind!r} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


TIMED = ["evosax", "esjax_full", "esjax_counter_open_es", "esjax_lowrank", "floor_n", "floor_unique",
         "floor_evosax_draw"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=int, default=1_000_000)
    parser.add_argument("--population", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.dims, args.population, args.repeats)
        return

    import jax

    results = {}
    for kind in ["baseline", *TIMED]:
        print(f"measuring peak memory: {kind} ...", file=sys.stderr, flush=True)
        results[kind] = _run_child(kind, args)
    print("measuring times (all in one process, round-robin) ...", file=sys.stderr, flush=True)
    all_times = _run_child("times", args)
    base_rss = results["baseline"]["peak_rss_bytes"]
    t = {k: statistics.median(v) for k, v in all_times.items()}
    mem = {k: max(r["peak_rss_bytes"] - base_rss, 0) for k, r in results.items()}
    mib = lambda b: b / 2**20

    import os

    print(f"# ES update benchmark: D = {args.dims:,}, N = {args.population}, time = median of {args.repeats} "
          "round-robin repeats in one process; memory = fresh process per row")
    print(f"# machine: {cpu_model()}, {os.cpu_count()} cores; jax {jax.__version__}, python "
          f"{platform.python_version()}; baseline process RSS {mib(base_rss):.0f} MiB")
    print(f"{'measurement':<36}{'time (s)':>10}{'extra peak RSS (MiB)':>22}{'XLA temp+out (MiB)':>20}")
    labels = {
        "evosax": "evosax Open_ES ask+tell",
        "esjax_full": "esjax update (full)",
        "esjax_counter_open_es": "esjax CounterOpenES ask+tell",
        "esjax_lowrank": f"esjax update (low-rank r=1, {int(math.isqrt(args.dims))}²)",
        "floor_n": "floor: N draws",
        "floor_unique": "floor: N/2 distinct draws",
        "floor_evosax_draw": "evosax normal((N/2, D))",
    }
    for kind, label in labels.items():
        xla = results[kind].get("xla_bytes")
        xla = f"{mib(xla):.0f}" if xla is not None else "-"
        print(f"{label:<36}{t[kind]:>10.3f}{mib(mem[kind]):>22.0f}{xla:>20}")
    print()
    print(f"time   esjax full / evosax Open_ES         = {t['esjax_full'] / t['evosax']:.3f}"
          f"  ({t['evosax'] / t['esjax_full']:.1f}x faster)")
    print(f"memory esjax full / evosax Open_ES         = {mem['esjax_full'] / max(mem['evosax'], 1):.3f}"
          f"  ({mem['evosax'] / max(mem['esjax_full'], 1):.1f}x less)")
    print(f"time   CounterOpenES / evosax Open_ES      = {t['esjax_counter_open_es'] / t['evosax']:.3f}")
    print(f"time   esjax full / floor (N draws)        = {t['esjax_full'] / t['floor_n']:.3f}")
    print(f"time   esjax full / floor (N/2 draws)      = {t['esjax_full'] / t['floor_unique']:.3f}")
    print(f"time   esjax low-rank / esjax full         = {t['esjax_lowrank'] / t['esjax_full']:.4f}")


if __name__ == "__main__":
    main()
