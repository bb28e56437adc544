"""Finished runs read back: one run's numbers (``read_run``), a grid's runs per cell with everything left out
(``scan_grid``), and each cell compared with sync, paired by seed (``compare_with_sync``).

Per run: final score (100 × mean reward of the greedy unperturbed θ on the held-out goals at the last version),
success rate (share of goals with reward 1), AUC = area under the held-out eval curve (trapezoid over versions,
divided by the number of updates: the mean score along the run, in points of score), and the stale share
(accepted fitnesses with lag > 0 over all accepted, from the update records' lag histograms; ``cohort_stale``
keeps each update's count of such members). Runs that failed (``failed.json``), are unfinished (no ``summary.md``),
or whose records are inconsistent (``run_problems``) are left out of a grid's runs and listed in its ``GridScan``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

from esjax.rundir.metrics import read_metrics
from esjax.rundir.metrics_schema import cohort_lags
from esjax.rundir.stats import holm, mean_interval, paired_test, verdict
from experiments.lib.grid import all_cells

#: The defaults of a comparison (the grid report's --margin and --alpha; the pre-registered study fixes its own).
DEFAULT_MARGIN = 3.0
DEFAULT_ALPHA = 0.05
#: The two endpoints of a comparison, both in points of score (so one margin serves both).
ENDPOINTS = {"final": "final score", "auc": "AUC (mean score along the run)"}


def auc(versions: list[int], scores: list[float]) -> float:
    """Trapezoid area under score(version), divided by the version span (the mean score along the run)."""
    if len(versions) < 2:
        return float(scores[0]) if scores else math.nan
    v = np.asarray(versions, np.float64)
    s = np.asarray(scores, np.float64)
    return float(np.sum((s[1:] + s[:-1]) / 2 * np.diff(v)) / (v[-1] - v[0]))


def run_problems(config: dict, update_versions: list[int], eval_versions: list[int]) -> list[str]:
    """Inconsistencies that make a run's numbers untrustworthy (empty if none): every update must be its own
    version 1, 2, …, U with U = run.updates, and the last version must have been evaluated."""
    problems = []
    want = int(config["run"]["updates"])
    dup = sorted({v for v in update_versions if update_versions.count(v) > 1})
    if dup:
        problems.append(f"update records repeat version(s) {', '.join(map(str, dup))}")
    if sorted(set(update_versions)) != list(range(1, len(set(update_versions)) + 1)):
        problems.append("update versions are not 1, 2, … without gaps")
    if len(update_versions) != want:
        problems.append(f"{len(update_versions)} update records for run.updates = {want}")
    last = max(update_versions) if update_versions else 0
    if not eval_versions or max(eval_versions) != last:
        problems.append(f"last evaluation at version {max(eval_versions) if eval_versions else '—'}, last update "
                        f"at version {last}")
    return problems


def read_run(run_dir: Path) -> dict | None:
    """One finished run's numbers, or None if it is unfinished / has no evaluation. ``problems`` lists
    inconsistent records (see ``run_problems``)."""
    if not (run_dir / "summary.md").is_file() or not (run_dir / "metrics.jsonl").is_file():
        return None
    records = read_metrics(run_dir / "metrics.jsonl")
    evals = sorted((r for r in records if r.get("kind") == "eval"), key=lambda r: r["version"])
    updates = sorted((r for r in records if r.get("kind") == "update"), key=lambda r: r["version"])
    if not evals or not updates:
        return None
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    lags: dict[int, int] = defaultdict(int)
    cohort_stale = []  # per update (version order): members of its cohort with lag > 0
    for r in updates:
        cohort = cohort_lags(r)
        cohort_stale.append(sum(count for lag, count in cohort.items() if lag > 0))
        for lag, count in cohort.items():
            lags[lag] += count
    accepted = sum(lags.values()) or 1
    durations = [d for r in updates for d in (r.get("durations") or [])]
    last = updates[-1]
    return {
        "dir": run_dir, "seed": int(config["run"]["seed"]), "config": config,
        "eval_versions": [r["version"] for r in evals], "eval_scores": [r["score"] for r in evals],
        "eval_walls": [r["wall_time"] for r in evals],
        "initial": evals[0]["score"], "final": evals[-1]["score"], "final_version": evals[-1]["version"],
        "success": 100 * evals[-1]["success_rate"], "goals": evals[-1].get("goals"),
        "auc": auc([r["version"] for r in evals], [r["score"] for r in evals]),
        "update_versions": [r["version"] for r in updates], "update_ticks": [r.get("tick") for r in updates],
        "update_walls": [r["wall_time"] for r in updates],
        "update_seconds": [r.get("seconds", math.nan) for r in updates],
        "stale_fraction": sum(c for lag, c in lags.items() if lag > 0) / accepted,
        "mean_lag": sum(lag * c for lag, c in lags.items()) / accepted, "lag_hist": dict(sorted(lags.items())),
        "cohort_stale": cohort_stale,
        "discarded": last.get("discarded"), "accepted": last.get("accepted"),
        "ticks": last.get("tick"), "wall": last["wall_time"],
        "utilization": float(np.mean([r.get("slot_utilization", math.nan) for r in updates])),
        "durations": durations,
        "problems": run_problems(config, [r["version"] for r in updates], [r["version"] for r in evals]),
    }


def machines_of(info: dict) -> list[str]:
    """The machines a run.json names, its start's and then each resume's, as "AMD EPYC, 2 cores" (a part that names
    no CPU is skipped): where README and the results get a machine's name."""
    out = []
    for part in [info, *(info.get("resumes") or [])]:
        machine = part.get("machine") or {}
        if machine.get("cpu"):
            out.append(f"{machine['cpu']}, {machine.get('cores', '?')} cores")
    return out


def _seed_of(seed_dir: Path) -> int | None:
    try:
        return int(seed_dir.name.removeprefix("seed"))
    except ValueError:
        return None


@dataclasses.dataclass
class GridScan:
    """What the runs root holds for one dataset: the usable runs per cell and everything left out."""

    grid: dict[str, list[dict]]  # cell -> usable finished runs, sorted by seed
    expected_seeds: list[int]  # --seeds S, else every seed directory seen in any cell
    failed: list[tuple[str, int, str]]  # (cell, seed, error)
    unfinished: list[tuple[str, int]]  # a directory without summary.md or without evaluations, not failed
    excluded: list[tuple[str, int, list[str]]]  # finished, but inconsistent records
    started: dict[str, list[int]]  # cell -> seeds that have a directory

    def missing(self) -> dict[str, list[int]]:
        """cell -> expected seeds without a usable run, for every cell with at least one directory."""
        out = {}
        for cell in self.started:
            have = {r["seed"] for r in self.grid.get(cell, [])}
            lack = [s for s in self.expected_seeds if s not in have]
            if lack:
                out[cell] = lack
        return out

    def not_run(self) -> list[str]:
        return [c.name for c in all_cells() if c.name not in self.started]


def scan_grid(runs_root: Path, data: str, seeds: int | None = None) -> GridScan:
    root = runs_root / data
    grid: dict[str, list[dict]] = {}
    failed, unfinished, excluded = [], [], []
    started: dict[str, list[int]] = {}
    for cell in all_cells():
        cell_dir = root / cell.name
        if not cell_dir.is_dir():
            continue
        runs = []
        for seed_dir in sorted(cell_dir.glob("seed*")):
            seed = _seed_of(seed_dir)
            if seed is None or not seed_dir.is_dir():
                continue
            started.setdefault(cell.name, []).append(seed)
            run = read_run(seed_dir)
            if run is None:
                if (seed_dir / "failed.json").is_file():
                    try:
                        error = str(json.loads((seed_dir / "failed.json").read_text()).get("error", "?"))
                    except ValueError:
                        error = "failed.json unreadable"
                    failed.append((cell.name, seed, error))
                else:
                    unfinished.append((cell.name, seed))
            elif run["problems"]:
                excluded.append((cell.name, run["seed"], run["problems"]))
            else:
                runs.append(run)
        if runs:
            grid[cell.name] = sorted(runs, key=lambda r: r["seed"])
    expected = list(range(seeds)) if seeds else sorted({s for v in started.values() for s in v})
    return GridScan(grid, expected, failed, unfinished, excluded, {k: sorted(v) for k, v in started.items()})


def read_grid(runs_root: Path, data: str) -> dict[str, list[dict]]:
    """cell name -> its usable finished runs (sorted by seed); see ``scan_grid`` for what is left out."""
    return scan_grid(runs_root, data).grid


def paired_delta(cell_runs: list[dict], sync_runs: list[dict], key: str = "final") -> dict:
    """Δ = cell − sync on the seeds both have: mean, 95% t CI, seeds used, the differences."""
    sync_by_seed = {r["seed"]: r[key] for r in sync_runs}
    pairs = [(r["seed"], r[key] - sync_by_seed[r["seed"]]) for r in cell_runs if r["seed"] in sync_by_seed]
    mean, low, high = mean_interval([d for _, d in pairs])
    return {"mean": mean, "low": low, "high": high, "seeds": [s for s, _ in pairs], "diffs": [d for _, d in pairs]}


def compare_with_sync(grid: dict[str, list[dict]], key: str, margin: float = DEFAULT_MARGIN,
                      alpha: float = DEFAULT_ALPHA) -> dict[str, dict]:
    """cell -> ``paired_test`` of Δ (``key`` = "final" or "auc") vs sync, plus ``seeds``, Holm-adjusted
    ``p_diff_holm`` / ``p_tost_holm`` (family: every cell with ≥ 2 paired seeds, this endpoint), ``family``
    (its size) and ``verdict``. Cells without a paired seed are absent."""
    sync = grid.get("sync", [])
    out: dict[str, dict] = {}
    for cell in all_cells():
        if cell.name == "sync" or cell.name not in grid or not sync:
            continue
        d = paired_delta(grid[cell.name], sync, key)
        if not d["seeds"]:
            continue
        out[cell.name] = {**paired_test(d["diffs"], margin, alpha), "seeds": d["seeds"], "diffs": d["diffs"]}
    names = list(out)
    adj_diff = holm([out[n]["p_diff"] for n in names])
    adj_tost = holm([out[n]["p_tost"] for n in names])
    family = sum(math.isfinite(out[n]["p_diff"]) for n in names)
    for name, pd, pt in zip(names, adj_diff, adj_tost):
        out[name].update(p_diff_holm=pd, p_tost_holm=pt, family=family,
                         verdict=verdict(out[name]["mean"], pd, pt, alpha))
    return out
