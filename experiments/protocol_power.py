"""The staleness study's margin and number of seeds, computed exactly as experiments/protocol.md fixes them.

From the frozen main job's eight Done-means runs on the test split (issue 31's seeds 0–7, records in
``experiments/results/main-job/``):

* G = mean gain (final − initial held-out score); margin m = 0.35 × G, rounded down to 0.1 point;
* σ_d = √2 × the one-sided 80% upper confidence bound of the SD of the final scores (7 df);
* n = ``report.seeds_needed(σ_d, m, α / 3, power 0.8)`` with α = 0.05 (exact TOST power, Holm's first step over
  the three primary cells), rounded up to an even number, at least 8; the study is not run if n > 40.

    python experiments/protocol_power.py            # prints G, m, σ_d, n and whether the study runs
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.report import read_run, seeds_needed  # noqa: E402

MAIN_JOB = REPO / "experiments" / "results" / "main-job"
SEEDS = tuple(range(8))
MARGIN_SHARE, ALPHA, FAMILY, POWER, SD_CONFIDENCE = 0.35, 0.05, 3, 0.8, 0.8
MIN_SEEDS, MAX_SEEDS = 8, 40


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
    from scipy import stats

    k = len(final)
    gain = sum(f - i for i, f in zip(initial, final)) / k
    mean = sum(final) / k
    sd = math.sqrt(sum((f - mean) ** 2 for f in final) / (k - 1))
    upper = sd * math.sqrt((k - 1) / stats.chi2.ppf(1 - SD_CONFIDENCE, k - 1))
    margin = math.floor(round(MARGIN_SHARE * gain * 10, 6)) / 10  # rounded down to 0.1 (round: float noise)
    sigma_d = math.sqrt(2) * upper
    needed = seeds_needed(sigma_d, margin, ALPHA / FAMILY, POWER) if margin > 0 else None
    n = None if needed is None else max(MIN_SEEDS, needed + needed % 2)
    return Power(gain, sd, upper, sigma_d, margin, n, n is not None and n <= MAX_SEEDS)


def protocol_power(root: Path = MAIN_JOB, seeds: tuple[int, ...] = SEEDS) -> Power:
    missing = [s for s in seeds if not (root / f"seed{s}" / "summary.md").is_file()]
    if missing:
        raise FileNotFoundError(f"{root}: no finished run for seed(s) {missing}")
    runs = [read_run(root / f"seed{s}") for s in seeds]
    unusable = [s for s, run in zip(seeds, runs) if run is None or run["problems"]]
    if unusable:
        raise ValueError(f"{root}: the run(s) of seed(s) {unusable} have no evaluation or inconsistent records")
    return power_from_scores([run["initial"] for run in runs], [run["final"] for run in runs])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=MAIN_JOB, help="the frozen main job's seed<s>/ run directories")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    power = protocol_power(args.runs)
    if args.json:
        print(json.dumps(asdict(power)))
        return 0
    print(f"gain G = {power.gain:.2f} (seeds {SEEDS[0]}–{SEEDS[-1]}); margin m = {power.margin:.1f}")
    print(f"SD of final scores {power.final_sd:.2f}, 80% upper bound {power.final_sd_upper:.2f}, "
          f"σ_d = {power.sigma_d:.2f}")
    if power.feasible:
        print(f"n = {power.n} seeds per cell (seeds 100–{100 + power.n - 1}): the study runs")
    else:
        print(f"n = {power.n} (more than {MAX_SEEDS}, or no margin): the study is not run on this setting")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
