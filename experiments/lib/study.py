"""The pre-registered staleness study (experiments/protocol.md): its fixed settings, and its rule for the margin and
the number of seeds.

The rule, on the frozen main job's eight Done-means runs on the test split (issue 31's seeds 0–7, records in
``experiments/results/main-job/``):

* G = mean gain (final − initial held-out score); margin m = 0.35 × G, rounded down to 0.1 point;
* σ_d = √2 × the one-sided 80% upper confidence bound of the SD of the final scores (7 df);
* n = ``seeds_needed(σ_d, m, α / 3, power 0.8)`` (:mod:`esjax.rundir.stats`; α = 0.05: exact TOST power, Holm's first
  step over the three primary cells), rounded up to an even number, at least 8; the study is not run if n > 40.

``experiments/protocol_power.py`` prints it; ``experiments/study_report.py`` writes the study's report with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from esjax.rundir.stats import sd_upper, seeds_needed
from experiments.lib import RESULTS
from experiments.lib.runs import read_run

#: The study's committed run records (``RECORDS/DATA/<cell>/seed<s>/``) and its reproducibility check's result.
RECORDS = RESULTS / "study"
DATA = "webshop_small"
REPRODUCIBILITY = RECORDS / "reproducibility.json"
#: The reproducibility re-runs' own records, compacted like the study's (``RERUNS/DATA/<cell>/seed<s>/``).
RERUNS = RECORDS / "reproducibility"
FIRST_SEED = 100
FAMILIES = {"primary": ("async-G4", "delay8", "all-stale-k1"), "secondary": ("delay4", "async-K1")}
ALPHA = 0.05
#: The one commit every run of the study is made at (a later session runs from a worktree checked out there).
STUDY_COMMIT = "62ddc0a"
#: The population protocol.md's setting names (N = 16, the main job's when it was written); the study runs the
#: frozen job's (deviation 1 of the report says what that changes).
PROTOCOL_POPULATION = 16

#: The power rule's inputs: the frozen main job's runs and seeds, and the protocol's constants.
MAIN_JOB = RESULTS / "main-job"
SEEDS = tuple(range(8))
MARGIN_SHARE, FAMILY, POWER, SD_CONFIDENCE = 0.35, 3, 0.8, 0.8
MIN_SEEDS, MAX_SEEDS = 8, 40


def expected_seeds(n: int) -> list[int]:
    """The study's n seeds: FIRST_SEED … FIRST_SEED + n − 1."""
    return list(range(FIRST_SEED, FIRST_SEED + n))


def family_complete(grid: dict[str, list[dict]], cells: tuple[str, ...], seeds: list[int]) -> bool:
    """Sync and every cell of the family hold a usable run for every seed."""
    return all({r["seed"] for r in grid.get(name, [])} >= set(seeds) for name in ("sync", *cells))


@dataclass(frozen=True)
class Power:
    gain: float  # G: mean final − initial over the seeds
    final_sd: float  # SD of the final scores
    final_sd_upper: float  # its one-sided 80% upper confidence bound
    sigma_d: float  # √2 × the bound: the SD of a paired difference of two independent runs
    margin: float  # m
    n: int | None  # seeds per cell (None: no margin, or no n reaches the power)
    feasible: bool  # n ≤ 40: the protocol runs the study


def power_from_scores(initial: list[float], final: list[float]) -> Power:
    """The protocol's rule on one set of runs (``initial[i]``, ``final[i]``: seed i's first and last scores)."""
    k = len(final)
    gain = sum(f - i for i, f in zip(initial, final)) / k
    mean = sum(final) / k
    sd = math.sqrt(sum((f - mean) ** 2 for f in final) / (k - 1))
    upper = sd_upper(sd, k - 1, SD_CONFIDENCE)
    margin = math.floor(round(MARGIN_SHARE * gain * 10, 6)) / 10  # rounded down to 0.1 (round: float noise)
    sigma_d = math.sqrt(2) * upper
    needed = seeds_needed(sigma_d, margin, ALPHA / FAMILY, POWER) if margin > 0 else None
    n = None if needed is None else max(MIN_SEEDS, needed + needed % 2)
    return Power(gain, sd, upper, sigma_d, margin, n, n is not None and n <= MAX_SEEDS)


def protocol_power(root: Path = MAIN_JOB, seeds: tuple[int, ...] = SEEDS) -> Power:
    """The protocol's rule on the frozen main job's committed runs (``root/seed<s>/``)."""
    missing = [s for s in seeds if not (root / f"seed{s}" / "summary.md").is_file()]
    if missing:
        raise FileNotFoundError(f"{root}: no finished run for seed(s) {missing}")
    runs = [read_run(root / f"seed{s}") for s in seeds]
    unusable = [s for s, run in zip(seeds, runs) if run is None or run["problems"]]
    if unusable:
        raise ValueError(f"{root}: the run(s) of seed(s) {unusable} have no evaluation or inconsistent records")
    return power_from_scores([run["initial"] for run in runs], [run["final"] for run in runs])
