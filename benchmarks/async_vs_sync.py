"""Wall-clock speedup of bounded-staleness async ES over synchronous ES, on the latency simulator.

Every row runs the same coordinator under each schedule for the same number of updates, with the same
episode-duration distribution and seed, and reports the ratio ``sync wall-clock / schedule wall-clock``
(virtual seconds, measured in this run), slot utilization (busy slots / slots) and the stale fraction.

    python benchmarks/async_vs_sync.py                # full grid (~30 s on 2 cores)
    python benchmarks/async_vs_sync.py --quick        # a smoke run
    python benchmarks/async_vs_sync.py --durations-file times.txt   # add measured episode times

The simulated speedup is an upper bound for the real loop: it ignores update time and policy-forward
batching effects. TODO(issue 5, rollout loop): ``real_loop_speedup`` below must run the real
continuous-batching loop on the embedded setup (sync vs async, same seed) once ``esjax/loop/rollout.py``,
the embedded policy and the WebShop bridge land.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time
from pathlib import Path

from esjax.loop.coordinator import Coordinator, CoordinatorConfig
from esjax.loop.schedules import Async, Controlled, Sync
from esjax.loop.simulate import Durations, Empirical, LogNormal, Pareto, simulate

SCHEDULES = [  # (label, schedule, K)
    ("async K=1", Async(), 1),
    ("async K=4", Async(), 4),
    ("controlled k=4 p=0.1", Controlled(4, 0.1), 4),
]


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def run_one(schedule, k: int, n: int, workers: int, durations: Durations, updates: int, seed: int):
    coord = Coordinator(CoordinatorConfig(n, k, seed=seed), schedule)
    return simulate(coord, workers=workers, durations=durations, updates=updates, seed=seed, keep_records=False)


def real_loop_speedup() -> str:
    """TODO(issue 5, rollout loop): sync vs async wall-clock of the real loop on the embedded setup."""
    try:
        from esjax.loop import rollout  # noqa: F401
    except ImportError:
        return "real-loop speedup on the embedded setup: not measured yet (esjax/loop/rollout.py has not landed)"
    return "real-loop speedup on the embedded setup: TODO — wire esjax.loop.rollout here"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--workers", type=str, default="8,32,64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="100 updates, G=32 only")
    parser.add_argument("--durations-file", type=Path, help="measured episode durations, one per line")
    args = parser.parse_args()
    updates = 100 if args.quick else args.updates
    workers = [32] if args.quick else [int(g) for g in args.workers.split(",")]
    dists: list[tuple[str, Durations]] = [
        ("lognormal s=0.5", LogNormal(0.5)), ("lognormal s=1", LogNormal(1.0)),
        ("lognormal s=1.5", LogNormal(1.5)), ("pareto a=1.5", Pareto(1.5)),
    ]
    if args.quick:
        dists = dists[1:2]
    if args.durations_file:
        values = tuple(float(x) for x in args.durations_file.read_text().split())
        dists.append((f"empirical ({args.durations_file.name})", Empirical(values)))

    n = args.population
    print(f"machine: {cpu_model()}; N={n}, {updates} updates per run, seed {args.seed}; "
          f"speedup = sync wall-clock / schedule wall-clock (virtual time, same run)\n")
    print("cells: speedup over sync (slot utilization, stale fraction of accepted, wasted share of busy time)\n")
    header = ["durations", "G", "sync util"] + [label for label, _, _ in SCHEDULES]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    started = time.perf_counter()
    jobs = 0
    for name, dist in dists:
        for g in workers:
            sync = run_one(Sync(), 0, n, g, dist, updates, args.seed)
            jobs += sync.totals["dispatched"]
            cells = [name, str(g), f"{sync.utilization:.2f}"]
            for _, schedule, k in SCHEDULES:
                rep = run_one(schedule, k, n, g, dist, updates, args.seed)
                jobs += rep.totals["dispatched"]
                waste = rep.wasted_time / rep.busy_time if rep.busy_time else 0.0
                cells.append(f"{sync.wall_clock / rep.wall_clock:.2f}x ({rep.utilization:.2f}, "
                             f"{rep.totals['stale_fraction']:.2f}, {waste:.2f})")
            print("| " + " | ".join(cells) + " |", flush=True)
    elapsed = time.perf_counter() - started
    print(f"\nsimulated {jobs} rollouts in {elapsed:.1f} s ({jobs / elapsed:,.0f} rollouts/s of simulator time)")

    # The published setup: G = 4 workers, N = 30, K = 1 (it reports ~9.5% of accepted results 1 update stale).
    paper = run_one(Async(), 1, 30, 4, LogNormal(1.0), updates, args.seed)
    paper_sync = run_one(Sync(), 0, 30, 4, LogNormal(1.0), updates, args.seed)
    print(f"published setup (G=4, N=30, K=1, lognormal s=1): async stale fraction "
          f"{paper.totals['stale_fraction']:.3f}, speedup {paper_sync.wall_clock / paper.wall_clock:.2f}x")
    print(real_loop_speedup())


if __name__ == "__main__":
    main()
