"""Wall-clock speedup of bounded-staleness async ES over synchronous ES, on the latency simulator.

Every row runs the same coordinator under each schedule for the same number of updates, with the same
episode-duration distribution and seed, and reports the ratio ``sync wall-clock / schedule wall-clock``
(virtual seconds, measured in this run), slot utilization (busy slots / slots) and the stale fraction.

    python benchmarks/async_vs_sync.py                # full grid (~30 s on 2 cores)
    python benchmarks/async_vs_sync.py --quick        # a smoke run
    python benchmarks/async_vs_sync.py --durations-file times.txt   # add measured episode times

The simulated speedup is an upper bound for the real loop: it ignores update time and policy-forward
batching effects. ``real_loop_speedup`` below runs the real continuous-batching
loop on the embedded setup (sync vs async, same seed, same process) beside the simulation; ``--no-real``
skips it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from esjax.loop.coordinator import Coordinator, CoordinatorConfig
from esjax.loop.simulate import Durations, Empirical, LogNormal, Pareto, simulate
from esjax.loop.staleness import Async, Controlled, Sync
from esjax.rundir.machine import cpu_model

SCHEDULES = [  # (label, schedule, K)
    ("async K=1", Async(), 1),
    ("async K=4", Async(), 4),
    ("controlled k=4 p=0.1", Controlled(4, 0.1), 4),
]


def run_one(schedule, k: int, n: int, workers: int, durations: Durations, updates: int, seed: int):
    coord = Coordinator(CoordinatorConfig(n, k, seed=seed), schedule)
    return simulate(coord, workers=workers, durations=durations, updates=updates, seed=seed, keep_records=False)


def real_loop_speedup(updates: int = 8, config_path: str = "configs/default.yaml") -> str:
    """Sync vs async wall-clock of the real continuous-batching loop on the embedded setup (same seed).

    Both runs happen in this process after a warm-up run, so neither pays for compilation; evaluation is
    pushed past the end so only training rollouts and updates are timed.
    """
    import tempfile

    from esjax.agent.policy import EMBEDDED_POLICY_DIR
    from esjax.config import load_config
    from esjax.train.session import train

    base = [f"run.updates={updates}", f"run.eval_every={10 * updates}", "env.eval_goals=1", "run.progress=false",
            f"run.checkpoint_every={10 * updates}"]
    if not (EMBEDDED_POLICY_DIR / "config.json").is_file():
        base.append("model.source=random")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        train(load_config(config_path, [*base, "run.updates=1"]), run_dir=f"{tmp}/warmup")
        for kind, max_lag in (("sync", 0), ("async", 1)):
            config = load_config(config_path, [*base, f"schedule.kind={kind}", f"schedule.max_lag={max_lag}"])
            started = time.perf_counter()
            result = train(config, run_dir=f"{tmp}/{kind}")
            seconds = time.perf_counter() - started
            last = [r for r in result.records if r["kind"] == "update"][-1]
            ticks = last["tick"]
            util = sum(r["slot_utilization"] for r in result.records if r["kind"] == "update") / updates
            results[kind] = (seconds, ticks, util, config)
    (s_sec, s_ticks, s_util, cfg), (a_sec, a_ticks, a_util, _) = results["sync"], results["async"]
    return (f"real loop ({config_path}, N={cfg.es.population}, slots={cfg.schedule.slots}, "
            f"{cfg.env.tasks_per_member} tasks/member, {updates} updates, model={cfg.model.source}): "
            f"sync {s_sec:.1f} s / {s_ticks} ticks (slot util {s_util:.2f}), async K=1 {a_sec:.1f} s / {a_ticks} "
            f"ticks (slot util {a_util:.2f}); async speedup {s_sec / a_sec:.2f}x wall-clock, "
            f"{s_ticks / a_ticks:.2f}x in ticks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--workers", type=str, default="8,32,64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="100 updates, G=32 only")
    parser.add_argument("--no-real", action="store_true", help="skip the real-loop measurement")
    parser.add_argument("--real-updates", type=int, default=8, help="updates per real-loop run")
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
    if not args.no_real:
        print(real_loop_speedup(args.real_updates))


if __name__ == "__main__":
    main()
