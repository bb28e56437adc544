"""The staleness grid's definitions: the paper's named cells, our lag k × stale fraction p grid, the presets (budget, ES
step, environment pins) and where each (cell, seed) run goes; ``experiments/staleness_grid.py`` runs it.

Cells (each over several seeds). The **paper** cells restate the definitions of the asynchronous-ES study
(arXiv 2610.04196: N = 30, G = 4 workers; stress tests 27 fresh + 3 delayed by exactly 4 or 8 updates, and a
case where every fitness is stale):

* ``sync``: the synchronous barrier — also the k = 0 row and the p = 0 column of our grid;
* ``async-G4``: natural asynchrony in the paper's regime, G = 4 rollout slots (``schedule.slots=4``) for a cohort
  of N, lag bound K = 1. With G < N about G − 1 results per cohort arrive one update late: (G − 1)/N ≈ 10% in the
  paper (3 of 30), 3/32 ≈ 9% at the real preset's N = 32 (the study's), 3/16 ≈ 19% at N = 16 (3/8 at the quick
  preset's N = 8) — the report prints the measured share;
* ``async-K1``: natural asynchrony saturated, G = N slots (the preset's ``schedule.slots``), K = 1: most accepted
  results are one update stale (measured 0.61–0.74 on the synthetic shop) — a different regime from the paper's;
* ``delay4``, ``delay8``: controlled stress, after k warm-up cohorts every cohort holds exactly round(0.1·N)
  members measured exactly k = 4 / 8 updates late, the rest fresh. The paper has 3 of 30; with the real preset's
  N = 32 that is round(3.2) = **3 of 32** (9.4%), with N = 16 round(1.6) = 2 of 16 (12.5%), with N = 8 1 of 8;
  the first k cohorts are all fresh, so the share over a run is lower (delay8 over 30 updates: 22/30 of 9.4%);
* ``all-stale-k1``: every fitness in every cohort after the first is exactly 1 update old (p = 1, k = 1).

Every other cell is **ours** (our own definitions, not the paper's):

* ``k{k}-p{p}`` for k ∈ {1, 2, 4, 8} and p ∈ {0.1, 0.25, 0.5}: controlled staleness with round(p·N) members
  exactly k late (``k4-p0.1``, ``k8-p0.1`` are the same schedule as ``delay4``, ``delay8``);
* ``k{k}-p1``: all-stale with lag k (``k1-p1`` is the same schedule as ``all-stale-k1``);
* ``async-K2``: saturated natural asynchrony with lag bound K = 2;
* ``extreme-lag``: a quarter of the members held back by a lag drawn in 1 … max_lag.

The three "ours" cells that coincide with a paper cell are left out of ``select_cells(None)`` (the grid's default
when ``--cells`` is not given: they would repeat the paper cell's runs exactly); name them to run them anyway.

Every (cell, seed) is one trainer run in ``OUT/<data>/<cell>/seed<s>/`` (``run_dir_of``); a run is finished when its
directory has ``summary.md``. The settings of each preset are in ``PRESETS``; a run's exact resolved config is in
its ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import time
from pathlib import Path

from experiments.lib import REPO, RESULTS

#: Runs go where they are committed (compacted once finished: experiments/lib/records.py), so the study can span
#: sessions and machines and every verdict can be re-checked from the repository.
DEFAULT_OUT = RESULTS / "study"
LAGS = (1, 2, 4, 8)
FRACTIONS = (0.1, 0.25, 0.5)
DATASETS = {  # name -> base config
    "synthetic": REPO / "configs" / "synthetic.yaml",
    "webshop_small": REPO / "configs" / "hasty.yaml",  # the main job the study was declared on
}

# Budgets. full: configs/default.yaml's budget (30 updates of N = 16, 8 train goals per member, the whole 211-goal
# held-out split every 10 updates), 3 seeds -- the setting whose sync/async runs measurably learn (+7.6 ... +9.2
# points, experiments/results/default_policy.md). quick: the whole cell list with 3 seeds in about 15 minutes of a
# 2-core CPU (--jobs 2): half the population, 2 train goals per member, 12 updates so that even k = 8 has 4 stale
# cohorts, a 40-goal held-out set evaluated at versions 0 and 12 only. real: the paper cells on WebShop's real
# 1,000-product set (configs/hasty.yaml, episodes of <= 15 steps).
#
# Keys of every preset: seeds, extreme_max_lag, overrides (the budget, applied after the ES step), data (None: the
# --data option chooses; a name: the preset's dataset, --data must agree), cells (the default --cells pattern;
# None: every cell but the repeats of paper cells), env (environment pins applied before the budget).
PRESETS: dict[str, dict] = {
    "full": {"seeds": (0, 1, 2), "extreme_max_lag": 16, "data": None, "cells": None, "overrides": [
        "run.updates=30", "run.eval_every=10", "run.checkpoint_every=10", "env.eval_goals=211",
        "es.population=16", "schedule.slots=16", "env.tasks_per_member=8"]},
    "quick": {"seeds": (0, 1, 2), "extreme_max_lag": 8, "data": None, "cells": None, "overrides": [
        "run.updates=12", "run.eval_every=12", "run.checkpoint_every=100", "env.eval_goals=40",
        "es.population=8", "schedule.slots=8", "env.tasks_per_member=2"]},
    # real: configs/hasty.yaml's budget, the main job as frozen by issue 31 (30 updates of N = 32 x 16 train goals,
    # all 500 test goals), evaluated every 5 updates as experiments/protocol.md asks (7 points for the AUC), so the
    # async-K1 cell is that main job itself up to its evaluation schedule and the sync cell is its barrier twin.
    "real": {"seeds": (0, 1, 2), "extreme_max_lag": 16, "data": "webshop_small", "cells": "paper", "overrides": [
        "run.updates=30", "run.eval_every=5", "run.checkpoint_every=15", "env.eval_goals=500",
        "es.population=32", "schedule.slots=32", "env.tasks_per_member=16"]},
}
# ES step of the synthetic presets (full, quick): low-rank ES on the 320 RMSNorm scales, sigma 0.2, lr 0.25, sampling
# temperature 0.5 (configs/default.yaml's step until issue 31). The earlier pin -- every kernel at sigma 0.02, lr
# 0.001 -- did not move the held-out score of sync ES in 12 updates (54.4 -> 52.1), so no schedule could be told
# from another. Pinned here so that edits of configs/default.yaml cannot change the study between runs.
STEP = ["es.sigma=0.2", "es.learning_rate=0.25", "es.scope=all", "es.include=['norm/scale$']", "es.exclude=[]",
        "agent.temperature=0.5", "es.mode=lowrank", "es.rank=2", "es.scale=nes", "es.shaping=centered_ranks",
        "es.optimizer=sgd"]
# ES step of the real preset: the main job as frozen by issue 31 (every kernel, rank 1 inside the matmuls, sigma 0.05,
# lr 0.02 on the NES scale; N and slots are in the preset's budget above).
STEP_REAL = ["es.sigma=0.05", "es.learning_rate=0.02", "es.scope=matrices", "es.include=['/kernel$']",
             "es.exclude=[]", "agent.temperature=0.5", "es.mode=lowrank", "es.rank=1", "es.scale=nes",
             "es.shaping=centered_ranks", "es.optimizer=sgd"]
STEPS = {"full": STEP, "quick": STEP, "real": STEP_REAL}
# Environment pins. full / quick: 10-step episodes and the 500-product synthetic catalog (as run so far, on either
# dataset). real: WebShop's real small set with its 15-step episodes (configs/hasty.yaml, the baselines table).
ENV_PINS = {
    "full": ["env.max_steps=10", "env.num_products=500"],
    "quick": ["env.max_steps=10", "env.num_products=500"],
    "real": ["env.data=webshop_small", "env.max_steps=15"],
}
for _name, _preset in PRESETS.items():
    _preset["env"] = ENV_PINS[_name]
    _preset["overrides"] = [*STEPS[_name], *ENV_PINS[_name], *_preset["overrides"]]
COMMON = ["run.progress=false"]


@dataclasses.dataclass(frozen=True)
class Cell:
    """One schedule setting of the study.

    ``origin`` is "paper" for the cells that restate a definition of arXiv 2610.04196 and "ours" for every other;
    ``slots`` overrides the preset's ``schedule.slots`` (G) when set; ``same_as`` names the paper cell whose
    schedule an "ours" cell repeats exactly (such cells are left out of the default cell list)."""

    name: str
    family: str  # sync | controlled | all_stale | async | extreme_lag
    k: int | None  # lag (controlled / all_stale) or lag bound K (async)
    p: float | None  # stale fraction (controlled / all_stale)
    origin: str = "ours"  # paper | ours
    slots: int | None = None  # G for this cell (None: the preset's schedule.slots)
    same_as: str | None = None  # the paper cell this one repeats

    def overrides(self, extreme_max_lag: int) -> list[str]:
        extra = [f"schedule.slots={self.slots}"] if self.slots is not None else []
        if self.family == "sync":
            return ["schedule.kind=sync", "schedule.max_lag=0", *extra]
        if self.family == "controlled":
            return ["schedule.kind=controlled", f"schedule.lag={self.k}", f"schedule.max_lag={self.k}",
                    f"schedule.stale_fraction={self.p}", *extra]
        if self.family == "all_stale":
            return ["schedule.kind=all_stale", f"schedule.lag={self.k}", f"schedule.max_lag={self.k}", *extra]
        if self.family == "async":
            return ["schedule.kind=async", f"schedule.max_lag={self.k}", *extra]
        if self.family == "extreme_lag":
            return ["schedule.kind=extreme_lag", "schedule.stale_fraction=0.25",
                    f"schedule.max_lag={extreme_max_lag}", *extra]
        raise ValueError(self.family)


# The paper's delayed share (3 of 30); round(0.1·N) half up as schedules.stale_count: 3 of 32, 2 of 16, 1 of 8.
PAPER_DELAYED_SHARE = 0.1
PAPER_WORKERS = 4  # G of the paper's natural-async runs


def paper_cells() -> list[Cell]:
    """The cells that restate the paper's definitions (see the module docstring)."""
    return [Cell("sync", "sync", 0, 0.0, "paper"),
            Cell("async-G4", "async", 1, None, "paper", slots=PAPER_WORKERS),
            Cell("async-K1", "async", 1, None, "paper"),
            Cell("delay4", "controlled", 4, PAPER_DELAYED_SHARE, "paper"),
            Cell("delay8", "controlled", 8, PAPER_DELAYED_SHARE, "paper"),
            Cell("all-stale-k1", "all_stale", 1, 1.0, "paper")]


def all_cells() -> list[Cell]:
    """Paper cells first, then ours."""
    cells = paper_cells()
    repeats = {(c.family, c.k, c.p): c.name for c in cells if c.family in ("controlled", "all_stale")}
    cells.append(Cell("async-K2", "async", 2, None))
    for k in LAGS:
        for p in FRACTIONS:
            cells.append(Cell(f"k{k}-p{p:g}", "controlled", k, p, same_as=repeats.get(("controlled", k, p))))
        cells.append(Cell(f"k{k}-p1", "all_stale", k, 1.0, same_as=repeats.get(("all_stale", k, 1.0))))
    cells.append(Cell("extreme-lag", "extreme_lag", None, 0.25))
    return cells


def select_cells(pattern: str | None) -> list[Cell]:
    """``--cells``: comma-separated names or shell patterns (``k4-*``, ``sync,async-*``), or the words ``paper``
    (the paper cells) and ``ours`` (every other cell). Without a pattern: every cell except the "ours" cells that
    repeat a paper cell's schedule."""
    cells = all_cells()
    if not pattern:
        return [c for c in cells if c.same_as is None]
    wanted = [w.strip() for w in pattern.split(",") if w.strip()]

    def matches(cell: Cell, word: str) -> bool:
        return cell.origin == word if word in ("paper", "ours") else fnmatch.fnmatchcase(cell.name, word)

    picked = [c for c in cells if any(matches(c, w) for w in wanted)]
    unknown = [w for w in wanted if not any(matches(c, w) for c in cells)]
    if unknown:
        raise SystemExit(f"--cells: no cell matches {', '.join(unknown)} (cells: {', '.join(c.name for c in cells)}; "
                         f"or 'paper' / 'ours')")
    return picked


def run_dir_of(out: Path, data: str, cell: Cell, seed: int) -> Path:
    return out / data / cell.name / f"seed{seed}"


def is_finished(run_dir: Path) -> bool:
    return (run_dir / "summary.md").is_file()


def preset_of(run_dir: Path) -> str | None:
    """The preset a finished run was made with (its ``grid.json``), or None if not recorded."""
    try:
        return json.loads((run_dir / "grid.json").read_text()).get("preset")
    except (OSError, ValueError):
        return None


def run_cell(cell: Cell, seed: int, run_dir: Path, base: Path, overrides: list[str]) -> dict:
    """Train one (cell, seed); resumes an interrupted run directory. Returns a small status dict."""
    from esjax.config import load_config
    from esjax.train.session import train

    config = load_config(base, [*overrides, f"run.seed={seed}", f"run.name={cell.name}-seed{seed}"])
    resume = (run_dir / "config.yaml").is_file()
    started = time.perf_counter()
    result = train(config, run_dir=run_dir, resume=resume)
    evals = [r for r in result.records if r.get("kind") == "eval"]
    return {"cell": cell.name, "seed": seed, "version": result.version, "seconds": time.perf_counter() - started,
            "score": evals[-1]["score"] if evals else None, "resumed": resume}


def results_dir(data: str) -> Path:
    """Where a dataset's study results go: experiments/results/ for real WebShop, results/<data>/ for others."""
    return RESULTS if data == "webshop_small" else RESULTS / data
