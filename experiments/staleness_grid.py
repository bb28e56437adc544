"""The asynchronous-ES staleness study on WebShop: lag k × stale fraction p, natural async, stress tests.

Cells (each over several seeds, on the embedded default policy unless ``--set model.source=...``):

* ``sync``: the synchronous barrier — also the k = 0 row and the p = 0 column of the grid;
* ``k{k}-p{p}`` for k ∈ {1, 2, 4, 8} and p ∈ {0.1, 0.25, 0.5}: controlled staleness (after k warm-up cohorts
  every cohort holds exactly round(p·N) members measured exactly k updates late, the rest fresh);
* ``k{k}-p1``: all-stale stress test (p = 1: every fitness in every cohort after warm-up is k updates old);
* ``async-K1``, ``async-K2``: natural asynchrony with lag bound K (never wait; accept lag ≤ K);
* ``extreme-lag``: stress test, a quarter of the members held back by a lag drawn in 1 … max_lag.

Every (cell, seed) is one trainer run in ``OUT/<data>/<cell>/seed<s>/`` (config.yaml, metrics.jsonl,
summary.md, plots/). A run is finished when its directory has ``summary.md``; finished runs are skipped, an
interrupted one resumes from its last checkpoint. All runs of one process share its jit caches (identical
shapes compile once), and ``--shard i/n`` splits the runs across processes::

    python experiments/staleness_grid.py                    # the whole grid, full budget (~3.5 h on 2 cores)
    python experiments/staleness_grid.py --quick            # small budget, 3 seeds (~15 min on 2 cores)
    python experiments/staleness_grid.py --quick --jobs 2   # as two shard processes, one per core
    python experiments/staleness_grid.py --quick --shard 0/2 & python experiments/staleness_grid.py --quick --shard 1/2
    python experiments/staleness_grid.py --cells sync,async-K1 --seeds 1 --set model.source=random
    python experiments/report.py                            # tables + figures into experiments/results/

The settings of each preset are in ``PRESETS``; a run's exact resolved config is in its ``config.yaml``
and the report reads them from there.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/staleness_grid.py` from anywhere
    sys.path.insert(0, str(REPO))

from esjax.machine import machine_info  # noqa: E402

DEFAULT_OUT = REPO / "experiments" / "runs"
LAGS = (1, 2, 4, 8)
FRACTIONS = (0.1, 0.25, 0.5)
DATASETS = {  # name -> base config
    "synthetic": REPO / "configs" / "synthetic.yaml",
    "webshop_small": REPO / "configs" / "default.yaml",
}

# Budgets. full: configs/default.yaml's budget (30 updates of N = 16, 8 train goals per member, the whole 211-goal
# held-out split every 10 updates), 3 seeds -- the setting whose sync/async runs measurably learn (+7.6 ... +9.2
# points, experiments/results/default_policy.md). quick: the whole cell list with 3 seeds in about 15 minutes of a
# 2-core CPU (--jobs 2): half the population, 2 train goals per member, 12 updates so that even k = 8 has 4 stale
# cohorts, a 40-goal held-out set evaluated at versions 0 and 12 only.
PRESETS: dict[str, dict] = {
    "full": {"seeds": (0, 1, 2), "extreme_max_lag": 16, "overrides": [
        "run.updates=30", "run.eval_every=10", "run.checkpoint_every=10", "env.eval_goals=211",
        "es.population=16", "schedule.slots=16", "env.tasks_per_member=8"]},
    "quick": {"seeds": (0, 1, 2), "extreme_max_lag": 8, "overrides": [
        "run.updates=12", "run.eval_every=12", "run.checkpoint_every=100", "env.eval_goals=40",
        "es.population=8", "schedule.slots=8", "env.tasks_per_member=2"]},
}
# ES step of the study, for both presets: configs/default.yaml's (low-rank ES on the 320 RMSNorm scales, sigma 0.2,
# lr 0.25, sampling temperature 0.5). The earlier pin -- every kernel at sigma 0.02, lr 0.001 -- did not move the
# held-out score of sync ES in 12 updates (54.4 -> 52.1), so no schedule could be told from another.
# Pinned here so that edits of configs/default.yaml cannot change the study between runs.
STEP = ["es.sigma=0.2", "es.learning_rate=0.25", "es.scope=all", "es.include=['norm/scale$']", "es.exclude=[]",
        "agent.temperature=0.5", "es.mode=lowrank", "es.rank=2", "es.scale=nes", "es.shaping=centered_ranks",
        "es.optimizer=sgd", "env.max_steps=10", "env.num_products=500"]
for _preset in PRESETS.values():
    _preset["overrides"] = [*STEP, *_preset["overrides"]]
COMMON = ["run.progress=false"]


@dataclasses.dataclass(frozen=True)
class Cell:
    """One schedule setting of the study."""

    name: str
    family: str  # sync | controlled | all_stale | async | extreme_lag
    k: int | None  # lag (controlled / all_stale) or lag bound K (async)
    p: float | None  # stale fraction (controlled / all_stale)

    def overrides(self, extreme_max_lag: int) -> list[str]:
        if self.family == "sync":
            return ["schedule.kind=sync", "schedule.max_lag=0"]
        if self.family == "controlled":
            return ["schedule.kind=controlled", f"schedule.lag={self.k}", f"schedule.max_lag={self.k}",
                    f"schedule.stale_fraction={self.p}"]
        if self.family == "all_stale":
            return ["schedule.kind=all_stale", f"schedule.lag={self.k}", f"schedule.max_lag={self.k}"]
        if self.family == "async":
            return ["schedule.kind=async", f"schedule.max_lag={self.k}"]
        if self.family == "extreme_lag":
            return ["schedule.kind=extreme_lag", "schedule.stale_fraction=0.25",
                    f"schedule.max_lag={extreme_max_lag}"]
        raise ValueError(self.family)


def all_cells() -> list[Cell]:
    cells = [Cell("sync", "sync", 0, 0.0), Cell("async-K1", "async", 1, None), Cell("async-K2", "async", 2, None)]
    for k in LAGS:
        for p in FRACTIONS:
            cells.append(Cell(f"k{k}-p{p:g}", "controlled", k, p))
        cells.append(Cell(f"k{k}-p1", "all_stale", k, 1.0))
    cells.append(Cell("extreme-lag", "extreme_lag", None, 0.25))
    return cells


def select_cells(pattern: str | None) -> list[Cell]:
    """``--cells``: comma-separated names or shell patterns (``k4-*``, ``sync,async-*``)."""
    cells = all_cells()
    if not pattern:
        return cells
    wanted = [w.strip() for w in pattern.split(",") if w.strip()]
    picked = [c for c in cells if any(fnmatch.fnmatchcase(c.name, w) for w in wanted)]
    unknown = [w for w in wanted if not any(fnmatch.fnmatchcase(c.name, w) for c in cells)]
    if unknown:
        raise SystemExit(f"--cells: no cell matches {', '.join(unknown)} (cells: {', '.join(c.name for c in cells)})")
    return picked


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SystemExit(f"--shard: expected i/n, got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise SystemExit(f"--shard: need 0 <= i < n, got {text!r}")
    return i, n


# Run first (every seed) so that a grid cut short by the clock still answers the published questions with
# all its seeds: sync, natural async, the published delay-4 / delay-8 cases, the stress tests and a k × p
# slice at p ∈ {0.5, 1}; the remaining cells follow.
PRIORITY = ("sync", "async-K1", "async-K2", "k4-p0.1", "k8-p0.1", "k2-p1", "extreme-lag", "k1-p0.5", "k4-p0.5",
            "k8-p0.5", "k1-p1", "k4-p1", "k8-p1")


def plan(cells: list[Cell], seeds: tuple[int, ...], shard: tuple[int, int]) -> list[tuple[Cell, int]]:
    """This shard's runs, round-robin over the ordered list: the ``PRIORITY`` cells seed-major (each at the first
    seed, then each at the next, ...), then the other cells seed-major."""
    first = [c for c in cells if c.name in PRIORITY]
    first.sort(key=lambda c: PRIORITY.index(c.name))
    rest = [c for c in cells if c.name not in PRIORITY]
    runs = [(cell, seed) for tier in (first, rest) for seed in seeds for cell in tier]
    i, n = shard
    return runs[i::n]


def run_dir_of(out: Path, data: str, cell: Cell, seed: int) -> Path:
    return out / data / cell.name / f"seed{seed}"


def is_finished(run_dir: Path) -> bool:
    return (run_dir / "summary.md").is_file()


def run_cell(cell: Cell, seed: int, run_dir: Path, base: Path, overrides: list[str]) -> dict:
    """Train one (cell, seed); resumes an interrupted run directory. Returns a small status dict."""
    from esjax.config import load_config
    from esjax.trainer import train

    config = load_config(base, [*overrides, f"run.seed={seed}", f"run.name={cell.name}-seed{seed}"])
    resume = (run_dir / "config.yaml").is_file()
    started = time.perf_counter()
    result = train(config, run_dir=run_dir, resume=resume)
    evals = [r for r in result.records if r.get("kind") == "eval"]
    return {"cell": cell.name, "seed": seed, "version": result.version, "seconds": time.perf_counter() - started,
            "score": evals[-1]["score"] if evals else None, "resumed": resume}


def run_shards(argv: list[str], jobs: int) -> int:
    """``--jobs J``: this script once per shard ``i/J`` in parallel processes; non-zero if any shard failed."""
    import subprocess

    rest = [a for i, a in enumerate(argv) if not (a.startswith("--jobs") or (i > 0 and argv[i - 1] == "--jobs"))]
    procs = [subprocess.Popen([sys.executable, __file__, *rest, "--shard", f"{i}/{jobs}"]) for i in range(jobs)]
    codes = [proc.wait() for proc in procs]
    failed = [f"{i}/{jobs}" for i, code in enumerate(codes) if code != 0]
    if failed:
        print(f"staleness grid: shard(s) {', '.join(failed)} exited non-zero", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small budget (PRESETS['quick'])")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="runs root (default experiments/runs/)")
    parser.add_argument("--cells", help="comma-separated cell names or patterns (default: all)")
    parser.add_argument("--seeds", type=int, help="number of seeds 0..S-1 (default: the preset's)")
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th run starting at i")
    parser.add_argument("--jobs", type=int, default=1,
                        help="run the grid as this many shard processes side by side (one per core)")
    parser.add_argument("--data", choices=sorted(DATASETS), default="synthetic",
                        help="synthetic: the built-in shop (configs/synthetic.yaml); webshop_small: WebShop's real "
                             "1,000-product set (configs/default.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config override for every run (applied last), e.g. model.source=random")
    parser.add_argument("--list", action="store_true", help="print this shard's runs and their state, then exit")
    args = parser.parse_args(argv)

    if args.jobs > 1:
        if args.shard != "0/1":
            raise SystemExit("--jobs and --shard exclude each other (--jobs starts the shards itself)")
        return run_shards(argv if argv is not None else sys.argv[1:], args.jobs)
    preset = PRESETS["quick" if args.quick else "full"]
    seeds = tuple(range(args.seeds)) if args.seeds else preset["seeds"]
    cells = select_cells(args.cells)
    runs = plan(cells, seeds, parse_shard(args.shard))
    base = DATASETS[args.data]
    out = args.out.resolve()
    if args.list:
        for cell, seed in runs:
            state = "done" if is_finished(run_dir_of(out, args.data, cell, seed)) else "todo"
            print(f"{state}  {cell.name}  seed{seed}")
        return 0
    (out / args.data).mkdir(parents=True, exist_ok=True)
    todo = [(c, s) for c, s in runs if not is_finished(run_dir_of(out, args.data, c, s))]
    print(f"staleness grid ({'quick' if args.quick else 'full'}, {args.data}): {len(runs)} runs in this shard, "
          f"{len(runs) - len(todo)} finished, {len(todo)} to run", flush=True)
    started = time.perf_counter()
    for n, (cell, seed) in enumerate(todo, 1):
        overrides = [*preset["overrides"], *COMMON, *cell.overrides(preset["extreme_max_lag"]), *args.overrides]
        run_dir = run_dir_of(out, args.data, cell, seed)
        try:
            status = run_cell(cell, seed, run_dir, base, overrides)
        except Exception as err:  # one broken run must not stop the grid: record it and go on
            (run_dir / "failed.json").write_text(json.dumps({"cell": cell.name, "seed": seed, "error": repr(err),
                                                             "overrides": overrides}, indent=2))
            print(f"[{n}/{len(todo)}] {cell.name} seed{seed}: FAILED {err!r} (see {run_dir}/failed.json)", flush=True)
            continue
        status["preset"] = "quick" if args.quick else "full"
        status["machine"], status["shard"] = machine_info(), args.shard
        (run_dir / "grid.json").write_text(json.dumps({**status, "overrides": overrides}, indent=2))
        elapsed = time.perf_counter() - started
        score = "n/a" if status["score"] is None else f"{status['score']:.1f}"
        print(f"[{n}/{len(todo)}] {cell.name} seed{seed}: final score {score} in {status['seconds']:.0f} s "
              f"(elapsed {elapsed:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
