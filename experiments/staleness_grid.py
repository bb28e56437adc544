"""The staleness grid: every (cell, seed) of the asynchronous-ES staleness study as one trainer run.

The cells (the paper's named cells and our lag k × stale fraction p grid) and the presets are defined in
``experiments/lib/grid.py``. Every (cell, seed) is one trainer run in ``OUT/<data>/<cell>/seed<s>/``
(config.yaml, metrics.jsonl, summary.md, plots/). A run is finished when its directory has ``summary.md``; finished
runs are skipped, an interrupted one resumes from its last checkpoint; a finished run made by another preset is an
error (use another ``--out``). All runs of one process share its jit caches (identical shapes compile once), and
``--shard i/n`` splits the seeds across processes (every cell of a seed runs in the same one)::

    python -m experiments.staleness_grid                    # the whole grid, full budget (~3.5 h on 2 cores)
    python -m experiments.staleness_grid --quick            # small budget, 3 seeds (~15 min on 2 cores)
    python -m experiments.staleness_grid --quick --jobs 2   # as two shard processes, one per core
    python -m experiments.staleness_grid --quick --shard 0/2 & python -m experiments.staleness_grid --quick --shard 1/2
    python -m experiments.staleness_grid --cells sync,async-K1 --seeds 1 --set model.source=random
    # the pre-registered study's primary family (experiments/protocol.md; n from experiments/protocol_power.py)
    python -m experiments.staleness_grid --preset real --cells sync,async-G4,delay8,all-stale-k1 \
        --first-seed 100 --seeds 24 --jobs 2
    python -m experiments.staleness_grid --preset real --jobs 2   # the paper cells on real WebShop (budget: PRESETS)
    python -m experiments.report                            # synthetic runs: experiments/results/synthetic/
    python -m experiments.report --data webshop_small --margin 3  # real-WebShop runs: experiments/results/

A run's exact resolved config is in its ``config.yaml``, and the report reads the settings from there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from esjax.rundir.machine import machine_info
from experiments.lib.grid import (
    COMMON,
    DATASETS,
    DEFAULT_OUT,
    PRESETS,
    Cell,
    is_finished,
    preset_of,
    run_cell,
    run_dir_of,
    select_cells,
)
from experiments.lib.records import compact_run


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SystemExit(f"--shard: expected i/n, got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise SystemExit(f"--shard: need 0 <= i < n, got {text!r}")
    return i, n


# Run first (every seed) so that a grid cut short by the clock still answers the published questions with
# all its seeds: the paper cells, then the other stress tests and a k × p slice at p ∈ {0.5, 1}; the remaining
# cells follow.
PRIORITY = ("sync", "async-G4", "async-K1", "delay4", "delay8", "all-stale-k1", "async-K2", "extreme-lag", "k2-p1",
            "k1-p0.5", "k4-p0.5", "k8-p0.5", "k4-p1", "k8-p1")


def plan(cells: list[Cell], seeds: tuple[int, ...], shard: tuple[int, int]) -> list[tuple[Cell, int]]:
    """This shard's runs: every n-th seed starting at the i-th (all cells of a seed in one process, so no cell of
    a seed sees another process or load pattern than its sync twin: experiments/protocol.md), the ``PRIORITY``
    cells seed-major (each at the first seed, then each at the next, ...), then the other cells seed-major."""
    first = [c for c in cells if c.name in PRIORITY]
    first.sort(key=lambda c: PRIORITY.index(c.name))
    rest = [c for c in cells if c.name not in PRIORITY]
    i, n = shard
    mine = seeds[i::n]
    return [(cell, seed) for tier in (first, rest) for seed in mine for cell in tier]


def run_shards(argv: list[str], jobs: int) -> int:
    """``--jobs J``: this script once per shard ``i/J`` in parallel processes, started as this one was (``-m`` or
    the file's path, from the same directory); non-zero if any shard failed."""
    import subprocess

    rest = [a for i, a in enumerate(argv) if not (a.startswith("--jobs") or (i > 0 and argv[i - 1] == "--jobs"))]
    script = ["-m", __spec__.name] if __spec__ else [__file__]
    procs = [subprocess.Popen([sys.executable, *script, *rest, "--shard", f"{i}/{jobs}"]) for i in range(jobs)]
    codes = [proc.wait() for proc in procs]
    failed = [f"{i}/{jobs}" for i, code in enumerate(codes) if code != 0]
    if failed:
        print(f"staleness grid: shard(s) {', '.join(failed)} exited non-zero", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="budget and environment pins (PRESETS): full (default), quick, or real (the paper "
                             "cells on real WebShop, configs/hasty.yaml, 15-step episodes)")
    parser.add_argument("--quick", action="store_true", help="the small budget (same as --preset quick)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="runs root (default experiments/results/study/, committed)")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep a finished run's checkpoints and plots (default: compact it for committing)")
    parser.add_argument("--cells", help="comma-separated cell names or patterns, or 'paper' / 'ours' (default: the "
                                        "preset's; full / quick: every cell but the repeats of paper cells)")
    parser.add_argument("--seeds", type=int, help="number of seeds F..F+S-1 (default: the preset's)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="F, the first seed of --seeds (the pre-registered study: 100, experiments/protocol.md)")
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th seed starting at the i-th (all its cells)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="run the grid as this many shard processes side by side (one per core)")
    parser.add_argument("--data", choices=sorted(DATASETS), default=None,
                        help="synthetic (default): the built-in shop (configs/synthetic.yaml); webshop_small: "
                             "WebShop's real 1,000-product set (configs/hasty.yaml); --preset real implies it")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config override for every run (applied last), e.g. model.source=random")
    parser.add_argument("--list", action="store_true", help="print this shard's runs and their state, then exit")
    args = parser.parse_args(argv)

    if args.jobs > 1:
        if args.shard != "0/1":
            raise SystemExit("--jobs and --shard exclude each other (--jobs starts the shards itself)")
        return run_shards(argv if argv is not None else sys.argv[1:], args.jobs)
    if args.quick and args.preset not in (None, "quick"):
        raise SystemExit(f"--quick and --preset {args.preset} exclude each other")
    name = args.preset or ("quick" if args.quick else "full")
    preset = PRESETS[name]
    if preset["data"] is not None and args.data not in (None, preset["data"]):
        raise SystemExit(f"--preset {name} runs on {preset['data']}, not --data {args.data}")
    data = args.data or preset["data"] or "synthetic"
    if args.first_seed and not args.seeds:
        raise SystemExit("--first-seed needs --seeds (how many seeds from it)")
    seeds = tuple(range(args.first_seed, args.first_seed + args.seeds)) if args.seeds else preset["seeds"]
    cells = select_cells(args.cells or preset["cells"])
    runs = plan(cells, seeds, parse_shard(args.shard))
    base = DATASETS[data]
    out = args.out.resolve()
    # A finished run of another preset would be skipped as if it were this preset's: refuse instead.
    clash = [f"{c.name}/seed{s} ({preset_of(run_dir_of(out, data, c, s))})" for c, s in runs
             if is_finished(run_dir_of(out, data, c, s))
             and preset_of(run_dir_of(out, data, c, s)) not in (None, name)]
    if clash:
        raise SystemExit(f"{out / data} holds finished runs of another preset: {', '.join(clash[:5])}"
                         f"{' …' if len(clash) > 5 else ''}; give this preset its own --out")
    if args.list:
        for cell, seed in runs:
            state = "done" if is_finished(run_dir_of(out, data, cell, seed)) else "todo"
            print(f"{state}  {cell.name}  seed{seed}")
        return 0
    (out / data).mkdir(parents=True, exist_ok=True)
    todo = [(c, s) for c, s in runs if not is_finished(run_dir_of(out, data, c, s))]
    print(f"staleness grid ({name}, {data}): {len(runs)} runs in this shard, "
          f"{len(runs) - len(todo)} finished, {len(todo)} to run", flush=True)
    started = time.perf_counter()
    for n, (cell, seed) in enumerate(todo, 1):
        overrides = [*preset["overrides"], *COMMON, *cell.overrides(preset["extreme_max_lag"]), *args.overrides]
        run_dir = run_dir_of(out, data, cell, seed)
        try:
            status = run_cell(cell, seed, run_dir, base, overrides)
        except Exception as err:  # one broken run must not stop the grid: record it and go on
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "failed.json").write_text(json.dumps({"cell": cell.name, "seed": seed, "error": repr(err),
                                                             "overrides": overrides, "preset": name}, indent=2))
            print(f"[{n}/{len(todo)}] {cell.name} seed{seed}: FAILED {err!r} (see {run_dir}/failed.json)", flush=True)
            continue
        if not args.keep_checkpoints:
            compact_run(run_dir)
        status["preset"] = name
        status["machine"], status["shard"] = machine_info(), args.shard
        (run_dir / "grid.json").write_text(json.dumps({**status, "overrides": overrides}, indent=2))
        elapsed = time.perf_counter() - started
        score = "n/a" if status["score"] is None else f"{status['score']:.1f}"
        print(f"[{n}/{len(todo)}] {cell.name} seed{seed}: final score {score} in {status['seconds']:.0f} s "
              f"(elapsed {elapsed:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
