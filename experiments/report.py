"""Results of the staleness study: tables, equivalence tests, power analysis and figures from the grid's runs.

Reads every run directory under ``RUNS/<data>/<cell>/seed<s>/`` written by ``experiments/staleness_grid.py``
and writes ``OUT/staleness.md`` (default OUT: ``experiments/results/`` for the real WebShop runs,
``experiments/results/<data>/`` for others) with the figures next to it:

* ``staleness_curves.png``: held-out eval score vs ES updates per schedule (mean over seeds, band = ±1 std);
* ``staleness_heatmap.png``: Δ final eval score vs sync over lag k × stale fraction p (k = 0 / p = 0 is sync);
* ``staleness_wallclock.png``: eval score vs wall-clock seconds and updates vs loop ticks (sync vs async).

Per run: final score (100 × mean reward of the greedy unperturbed θ on the held-out goals at the last
version), success rate (share of goals with reward 1), AUC = area under the held-out eval curve (trapezoid over
versions, divided by the number of updates: the mean score along the run, in points of score), and the stale
share (accepted fitnesses with lag > 0 over all accepted, from the update records' lag histograms).

Statistics (per endpoint: the final score and the AUC; both in points of score, so one margin serves both):

* Δᵢ = cellᵢ − syncᵢ on every seed i that both have (paired: a seed fixes the task batches and noise of
  version 0, and every schedule is evaluated on the same held-out goals). Reported: n pairs, mean Δ, the paired
  SD (SD of the Δᵢ), the 95% t interval, and the 90% (1 − 2α) t interval used by the equivalence test.
* Difference: the two-sided paired t-test of Δ = 0. Equivalence: TOST at margin m (``--margin``, default 3
  points) — two one-sided t-tests, H₀: Δ ≤ −m (p_lower) and H₀: Δ ≥ +m (p_upper); p_TOST = max of the two,
  and p_TOST < α exactly when the 90% interval lies inside (−m, +m).
* Multiplicity: every cell with ≥ 2 paired seeds is one comparison with sync; Holm–Bonferroni over those
  cells, separately for the difference p-values and for the TOST p-values, and separately per endpoint.
* Verdict, exactly one per cell and endpoint, checked in this order (α = 0.05 unless ``--alpha``):
  1. **"equivalent within m"** if the Holm-adjusted p_TOST < α;
  2. **"worse"** if the Holm-adjusted difference p < α and mean Δ < 0;
  3. **"better"** if the Holm-adjusted difference p < α and mean Δ > 0;
  4. **"inconclusive"** otherwise, and always with fewer than 2 paired seeds.
  Equivalence is checked first: a Δ detectably different from 0 whose whole interval lies inside ±m is smaller
  than the stated margin of practical relevance (such cells are named in the findings, and the table shows the
  difference test next to it). A confidence interval that merely contains 0 is never a verdict: without
  equivalence it is "inconclusive".
* Power (true Δ = 0, α, power 0.8 unless ``--power``): the exact power of the paired TOST with n seeds at the
  measured paired SD σ — P(|Δ̄| < m − t₁₋α,ₙ₋₁·s/√n), integrated over the χ² distribution of the sample SD s
  (Owen's integral, by quadrature; not a normal approximation); seeds needed = the smallest n with power ≥
  0.8. Printed next to it, the normal formula n ≈ (z₁₋α + z₁₋β/₂)²σ²/m² (σ ≈ 6, m = 3 → 34.3, the exact
  t computation asks for 36), and the seeds needed when the TOST runs at α/k (Bonferroni, the first step of
  Holm over k cells: enough for every cell to pass). The SD measured on few seeds is itself uncertain: the
  overall row also gives the seeds needed at the pooled SD's one-sided 80% upper confidence bound.

Runs that failed (``failed.json``), are unfinished (no ``summary.md``), or whose records are inconsistent
(duplicate or missing update versions, more or fewer updates than configured, no evaluation at the last
version, as an update cascade leaves) are left out of every statistic and listed by cell and seed, as
are the seeds a cell lacks and the seeds that have no sync partner.

    python experiments/report.py --data webshop_small [--margin 3] [--runs experiments/results/study] [--out DIR]
                                 [--margin 3] [--alpha 0.05] [--power 0.8] [--seeds S]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from esjax.rundir.metrics_schema import cohort_lags  # noqa: E402
from experiments.staleness_grid import DEFAULT_OUT, FRACTIONS, LAGS, Cell, all_cells  # noqa: E402

DEFAULT_RESULTS = REPO / "experiments" / "results"

DEFAULT_MARGIN = 3.0
DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8
# Published numbers (arXiv 2610.04196, held-out success % on its public benchmark, Qwen2.5-7B-Instruct,
# full-parameter ES, N = 30, 120 updates) -- a side table only: not comparable to ours.
PUBLISHED = {"base": 9.3, "sync": 25.4, "async": 25.9, "delay4": 23.8, "delay8": 22.3, "grpo": 29.0}
PUBLISHED_LABEL = ("arXiv 2610.04196, held-out success on its public benchmark, Qwen2.5-7B-Instruct "
                   "full-parameter ES — not comparable to ours")
PUBLISHED_STALE_SHARE = 0.095  # natural async, G = 4 workers for N = 30
VERDICTS = ("equivalent within m", "worse", "better", "inconclusive")
ENDPOINTS = {"final": "final score", "auc": "AUC (mean score along the run)"}


def results_dir(data: str) -> Path:
    """Where a dataset's study results go: experiments/results/ for real WebShop, results/<data>/ for others."""
    return DEFAULT_RESULTS if data == "webshop_small" else DEFAULT_RESULTS / data


# ---------------------------------------------------------------------------------------------------------
# Reading runs
# ---------------------------------------------------------------------------------------------------------


def _records(run_dir: Path) -> list[dict]:
    out = []
    with (run_dir / "metrics.jsonl").open(encoding="utf-8") as file:
        for line in file:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


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
    records = _records(run_dir)
    evals = sorted((r for r in records if r.get("kind") == "eval"), key=lambda r: r["version"])
    updates = sorted((r for r in records if r.get("kind") == "update"), key=lambda r: r["version"])
    if not evals or not updates:
        return None
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    lags: dict[int, int] = defaultdict(int)
    for r in updates:
        for lag, count in cohort_lags(r).items():
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
        "discarded": last.get("discarded"), "accepted": last.get("accepted"),
        "ticks": last.get("tick"), "wall": last["wall_time"],
        "utilization": float(np.mean([r.get("slot_utilization", math.nan) for r in updates])),
        "durations": durations,
        "problems": run_problems(config, [r["version"] for r in updates], [r["version"] for r in evals]),
    }


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


# ---------------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------------


def t_ci(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of the mean (NaN bounds with fewer than two values)."""
    x = np.asarray(values, np.float64)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    from scipy import stats

    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def paired_delta(cell_runs: list[dict], sync_runs: list[dict], key: str = "final") -> dict:
    """Δ = cell − sync on the seeds both have: mean, 95% t CI, seeds used, the differences."""
    sync_by_seed = {r["seed"]: r[key] for r in sync_runs}
    pairs = [(r["seed"], r[key] - sync_by_seed[r["seed"]]) for r in cell_runs if r["seed"] in sync_by_seed]
    mean, low, high = t_ci([d for _, d in pairs])
    return {"mean": mean, "low": low, "high": high, "seeds": [s for s, _ in pairs], "diffs": [d for _, d in pairs]}


def paired_test(diffs: list[float], margin: float = DEFAULT_MARGIN, alpha: float = DEFAULT_ALPHA) -> dict:
    """Paired t statistics of the differences Δᵢ: n, mean, sd (paired SD), the 95% and (1 − 2α) t intervals,
    the two-sided p of Δ = 0 (``p_diff``) and the TOST p-values at margin m (``p_lower``: H₀ Δ ≤ −m,
    ``p_upper``: H₀ Δ ≥ +m, ``p_tost`` = their max). With fewer than 2 differences every test value is NaN; with
    a zero SD the tests are decided exactly (a constant Δ is different from 0 unless it is 0, equivalent iff
    |Δ| < m)."""
    from scipy import stats

    x = np.asarray(diffs, np.float64)
    n = len(x)
    nan = math.nan
    out = {"n": n, "mean": float(x.mean()) if n else nan, "sd": nan, "se": nan, "low95": nan, "high95": nan,
           "low90": nan, "high90": nan, "p_diff": nan, "p_lower": nan, "p_upper": nan, "p_tost": nan,
           "margin": float(margin), "alpha": float(alpha)}
    if n < 2:
        return out
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    se, df = sd / math.sqrt(n), n - 1
    q95, q90 = float(stats.t.ppf(0.975, df)), float(stats.t.ppf(1 - alpha, df))
    out.update(sd=sd, se=se, low95=mean - q95 * se, high95=mean + q95 * se, low90=mean - q90 * se,
               high90=mean + q90 * se)
    if se == 0.0:
        out["p_diff"] = 1.0 if mean == 0.0 else 0.0
        out["p_lower"] = 0.0 if mean > -margin else 1.0
        out["p_upper"] = 0.0 if mean < margin else 1.0
    else:
        out["p_diff"] = float(2 * stats.t.sf(abs(mean) / se, df))
        out["p_lower"] = float(stats.t.sf((mean + margin) / se, df))
        out["p_upper"] = float(stats.t.cdf((mean - margin) / se, df))
    out["p_tost"] = max(out["p_lower"], out["p_upper"])
    return out


def holm(pvalues: list[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (step-down, monotone, capped at 1), in the input order. NaN entries
    (tests that could not be run) stay NaN and do not count in the family size."""
    p = np.asarray(pvalues, np.float64)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def verdict(mean: float, p_diff_holm: float, p_tost_holm: float, alpha: float = DEFAULT_ALPHA) -> str:
    """The one label of a cell on one endpoint (the rule of the module docstring)."""
    if math.isfinite(p_tost_holm) and p_tost_holm < alpha:
        return "equivalent within m"
    if math.isfinite(p_diff_holm) and p_diff_holm < alpha and mean < 0:
        return "worse"
    if math.isfinite(p_diff_holm) and p_diff_holm < alpha and mean > 0:
        return "better"
    return "inconclusive"


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


@functools.lru_cache(maxsize=1)
def _gauss_legendre(points: int = 512) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(points)


def tost_power(n: int, sd: float, margin: float = DEFAULT_MARGIN, alpha: float = DEFAULT_ALPHA,
               delta: float = 0.0) -> float:
    """Exact power of the paired TOST with n pairs when the differences are N(delta, sd²):
    E_s[P(−m + t·s/√n < Δ̄ < m − t·s/√n)], t = t₁₋α,ₙ₋₁, over (n−1)s²/σ² = V ~ χ²ₙ₋₁ (Owen's integral).
    Evaluated by 512-point Gauss–Legendre quadrature in √V over the part of V's range that holds its mass
    (quantiles 1e-12 … 1 − 1e-12) and gives a non-empty acceptance interval."""
    from scipy import stats

    if n < 2 or not math.isfinite(sd) or margin <= 0:
        return math.nan
    if sd == 0.0:
        return 1.0 if abs(delta) < margin else 0.0
    df = n - 1
    q = float(stats.t.ppf(1 - alpha, df))
    root_n = math.sqrt(n)
    a_hi, a_lo = (margin - delta) * root_n / sd, (-margin - delta) * root_n / sd
    v_max = df * ((margin * root_n / sd) / q) ** 2  # beyond it the interval is wider than (−m, m)
    lo = math.sqrt(float(stats.chi2.ppf(1e-12, df)))  # in u = √V (dV = 2u du): smooth at 0 even for df = 1
    hi = math.sqrt(min(v_max, float(stats.chi2.isf(1e-12, df))))
    if hi <= lo:
        return 0.0
    nodes, weights = _gauss_legendre()
    u = lo + (hi - lo) * (nodes + 1) / 2
    w = q * u / math.sqrt(df)
    inner = np.clip(stats.norm.cdf(a_hi - w) - stats.norm.cdf(a_lo + w), 0.0, 1.0)
    value = float(np.sum(weights * inner * stats.chi2.pdf(u * u, df) * 2 * u) * (hi - lo) / 2)
    return float(min(1.0, max(0.0, value)))


def seeds_normal(sd: float, margin: float = DEFAULT_MARGIN, alpha: float = DEFAULT_ALPHA,
                 power: float = DEFAULT_POWER) -> float:
    """The normal formula for paired TOST at true Δ = 0: n ≈ (z₁₋α + z₁₋β/₂)²·σ²/m² (unrounded)."""
    from scipy import stats

    if not math.isfinite(sd):
        return math.nan
    z = float(stats.norm.ppf(1 - alpha) + stats.norm.ppf(1 - (1 - power) / 2))
    return z * z * sd * sd / (margin * margin)


def seeds_needed(sd: float, margin: float = DEFAULT_MARGIN, alpha: float = DEFAULT_ALPHA,
                 power: float = DEFAULT_POWER, cap: int = 10_000_000) -> int | None:
    """Smallest n ≥ 2 whose exact TOST power (``tost_power``, true Δ = 0) reaches ``power``; None if the SD is
    unknown or more than ``cap`` seeds would be needed. The search starts at the normal formula's n (the exact n is
    at or just above it) and gallops up, then bisects; power rises with n."""
    if not math.isfinite(sd):
        return None

    def enough(n: int) -> bool:
        return tost_power(n, sd, margin, alpha) >= power

    start = max(2, math.ceil(seeds_normal(sd, margin, alpha, power)))
    if enough(start):
        lo = start
        while lo > 2 and enough(lo - 1):  # rare: the formula overshoots
            lo -= 1
        return lo
    lo, step = start, 1
    while not enough(lo + step):
        lo += step
        step *= 2
        if lo > cap:
            return None
    hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


def pooled_sd(tests: list[dict]) -> tuple[float, int]:
    """(pooled paired SD, its degrees of freedom) over the tests with n ≥ 2: sqrt(Σ(nᵢ−1)sᵢ² / Σ(nᵢ−1))."""
    usable = [t for t in tests if t["n"] >= 2 and math.isfinite(t["sd"])]
    df = sum(t["n"] - 1 for t in usable)
    if df == 0:
        return math.nan, 0
    return math.sqrt(sum((t["n"] - 1) * t["sd"] ** 2 for t in usable) / df), df


def sd_upper(sd: float, df: int, level: float = 0.8) -> float:
    """One-sided ``level`` upper confidence bound of an SD estimated with df degrees of freedom."""
    from scipy import stats

    if df < 1 or not math.isfinite(sd):
        return math.nan
    return sd * math.sqrt(df / float(stats.chi2.ppf(1 - level, df)))


def power_rows(tests: dict[str, dict], margin: float = DEFAULT_MARGIN, alpha: float = DEFAULT_ALPHA,
               power: float = DEFAULT_POWER) -> list[dict]:
    """Per cell (and an overall row from the pooled SD): the measured paired SD, seeds now, the TOST power they
    give, seeds needed (exact t), the normal formula's n, and seeds needed at α/k (Bonferroni bound of Holm over
    the k cells of the family)."""
    family = max([t.get("family", 0) for t in tests.values()] + [1])
    rows = []
    for name, t in tests.items():
        rows.append({"cell": name, "sd": t["sd"], "df": max(t["n"] - 1, 0), "n": t["n"],
                     "power_now": tost_power(t["n"], t["sd"], margin, alpha),
                     "needed": seeds_needed(t["sd"], margin, alpha, power),
                     "normal": seeds_normal(t["sd"], margin, alpha, power),
                     "needed_holm": seeds_needed(t["sd"], margin, alpha / family, power)})
    sd, df = pooled_sd(list(tests.values()))
    if df:
        n_now = min(t["n"] for t in tests.values() if t["n"] >= 2)
        upper = sd_upper(sd, df)
        rows.append({"cell": "overall (pooled SD)", "sd": sd, "df": df, "n": n_now,
                     "power_now": tost_power(n_now, sd, margin, alpha),
                     "needed": seeds_needed(sd, margin, alpha, power), "normal": seeds_normal(sd, margin, alpha, power),
                     "needed_holm": seeds_needed(sd, margin, alpha / family, power), "sd_upper": upper,
                     "needed_upper": seeds_needed(upper, margin, alpha / family, power)})
    return rows


def _ms(values: list[float], digits: int = 1) -> str:
    x = np.asarray(values, np.float64)
    if len(x) == 0:
        return "—"
    if len(x) == 1:
        return f"{x[0]:.{digits}f}"
    return f"{x.mean():.{digits}f} ± {x.std(ddof=1):.{digits}f}"


def _ci(d: dict) -> str:
    if math.isnan(d["mean"]):
        return "—"
    if math.isnan(d["low"]):
        return f"{d['mean']:+.1f} (1 seed)"
    return f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"


def _p(p: float) -> str:
    if not math.isfinite(p):
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _iv(low: float, high: float) -> str:
    return "—" if not math.isfinite(low) else f"[{low:+.1f}, {high:+.1f}]"


def _n(value: int | None) -> str:
    return "> 10⁶" if value is None else str(value)


# ---------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------


def _runs_for(grid: dict[str, list[dict]], name: str) -> list[dict] | None:
    """The runs of a cell, or of the paper cell with the same schedule (``k4-p0.1`` ≡ ``delay4``, …)."""
    if name in grid:
        return grid[name]
    same = {c.name: c.same_as for c in all_cells()}.get(name)
    return grid.get(same) if same else None


def _mean_curve(runs: list[dict], xs_key: str, ys_key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    grid = sorted({x for r in runs for x in r[xs_key]})
    rows = [np.interp(grid, r[xs_key], r[ys_key]) for r in runs]
    arr = np.asarray(rows, np.float64)
    return np.asarray(grid), arr.mean(0), arr.std(0)


def write_figures(grid: dict[str, list[dict]], out: Path, prefix: str = "staleness") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    cells = {c.name: c for c in all_cells()}
    groups = [
        ("paper cells, async-K2, extreme lag", [c.name for c in all_cells() if c.origin == "paper"] +
         ["async-K2", "extreme-lag"]),
        ("ours: controlled staleness (p = 0.1, 0.5) and all stale", ["sync"] + [f"k{k}-p0.1" for k in LAGS] +
         [f"k{k}-p0.5" for k in LAGS] + [f"k{k}-p1" for k in LAGS if k > 1]),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, (title, names) in zip(axes, groups):
        for name in names:
            runs = grid.get(name) if ax is axes[0] else _runs_for(grid, name)
            if not runs:
                continue
            x, m, s = _mean_curve(runs, "eval_versions", "eval_scores")
            style = "k-" if name == "sync" else "-"
            line, = ax.plot(x, m, style, marker="o", ms=3, lw=2 if name == "sync" else 1.2,
                            label=f"{name} ({len(runs)} seeds)")
            ax.fill_between(x, m - s, m + s, color=line.get_color(), alpha=0.08)
        ax.set_title(title)
        ax.set_xlabel("ES updates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    axes[0].set_ylabel("held-out eval score (100 × mean reward)")
    fig.tight_layout()
    paths.append(out / f"{prefix}_curves.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    # Heatmap of Δ over k × p (k = 0 row and p = 0 column are sync itself: Δ = 0).
    ks = (0, *LAGS)
    ps = (0.0, *FRACTIONS, 1.0)
    delta = np.full((len(ks), len(ps)), np.nan)
    sync = grid.get("sync", [])
    for i, k in enumerate(ks):
        for j, p in enumerate(ps):
            if k == 0 or p == 0.0:
                delta[i, j] = 0.0 if sync else np.nan
                continue
            name = f"k{k}-p1" if p == 1.0 else f"k{k}-p{p:g}"
            runs = _runs_for(grid, name)
            if runs and sync:
                delta[i, j] = paired_delta(runs, sync)["mean"]
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    finite = delta[np.isfinite(delta)]
    lim = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    im = ax.imshow(delta, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    for i in range(len(ks)):
        for j in range(len(ps)):
            text = "—" if np.isnan(delta[i, j]) else f"{delta[i, j]:+.1f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(ps)), [f"{p:g}" for p in ps])
    ax.set_yticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel("stale fraction p")
    ax.set_ylabel("lag k (updates)")
    ax.set_title("Δ final eval score vs sync (mean over seeds)")
    fig.colorbar(im, ax=ax, label="Δ score")
    fig.tight_layout()
    paths.append(out / f"{prefix}_heatmap.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for name in ["sync", "async-G4", "async-K1", "delay4", "all-stale-k1", "extreme-lag"]:
        if name not in grid:
            continue
        runs = grid[name]
        x, m, _ = _mean_curve(runs, "eval_walls", "eval_scores")
        axes[0].plot(x, m, "-o", ms=3, label=name)
        for n, r in enumerate(runs):
            axes[1].plot(r["update_ticks"], r["update_versions"], "-", alpha=0.7,
                         color=f"C{list(cells).index(name) % 10}", label=name if n == 0 else None)
    axes[0].set_xlabel("wall-clock (s, includes evaluation)")
    axes[0].set_ylabel("held-out eval score (mean over seeds)")
    axes[1].set_xlabel("loop ticks (one env step of every live episode)")
    axes[1].set_ylabel("ES updates applied")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / f"{prefix}_wallclock.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


# ---------------------------------------------------------------------------------------------------------
# The markdown report
# ---------------------------------------------------------------------------------------------------------


def _cell_label(cell: Cell, config: dict | None = None) -> str:
    """What a cell's schedule is, with N and G from a run's config when there is one."""
    n = config["es"]["population"] if config else None
    g = config["schedule"]["slots"] if config else cell.slots
    if cell.family == "sync":
        return "sync barrier (k = 0 / p = 0)"
    if cell.family == "async":
        slots = f"G = {g}" if g else "G = preset's slots"
        regime = "paper-like, G < N" if g and n and g < n else "saturated, G = N" if g and n and g >= n else ""
        return f"natural async, {slots}{f' for N = {n}' if n else ''}, K = {cell.k}" + (f" ({regime})" if regime
                                                                                         else "")
    if cell.family == "extreme_lag":
        return "extreme lag: 25% of members delayed by 1…max_lag"
    if cell.family == "all_stale":
        return f"all stale: every fitness {cell.k} update{'s' if cell.k != 1 else ''} old"
    if n:
        m = _stale_members(cell.p, n)
        text = f"{m} of {n} members exactly {cell.k} updates late"
        return text + (" (paper: 3 of 30)" if cell.origin == "paper" else f" (k = {cell.k}, p = {cell.p:g})")
    return f"round({cell.p:g}·N) members exactly {cell.k} updates late"


def _stale_members(p: float, n: int) -> int:
    return int(math.floor(p * n + 0.5))


def _origin(cell: Cell) -> str:
    return "paper" if cell.origin == "paper" else (f"ours (= {cell.same_as})" if cell.same_as else "ours")


def _settings(grid: dict[str, list[dict]]) -> list[str]:
    configs = [r["config"] for runs in grid.values() for r in runs]
    keys = ["model.source", "env.data", "env.num_products", "run.updates", "run.eval_every", "es.population",
            "es.mode", "es.rank", "es.scope", "es.include", "es.sigma", "es.learning_rate", "es.scale", "es.shaping",
            "es.optimizer",
            "schedule.slots", "env.tasks_per_member", "env.max_steps", "env.eval_goals", "env.eval_split",
            "agent.temperature"]
    if all((c.get("env") or {}).get("data") != "synthetic" for c in configs):
        keys.remove("env.num_products")  # sizes the synthetic shop only: a WebShop set ignores it
    lines = []
    for name in keys:
        section, key = name.split(".")
        values = sorted({str((c.get(section) or {}).get(key, "—")) for c in configs})
        lines.append(f"| `{name}` | {', '.join(values)} |")
    return lines


def _provenance(grid: dict[str, list[dict]]) -> list[str]:
    """Which policy weights, how much compute, which presets."""
    import hashlib
    import subprocess

    lines = []
    sources = {r["config"]["model"]["source"] for runs in grid.values() for r in runs}
    weights = REPO / "esjax" / "assets" / "default_policy" / "model.safetensors"
    if "embedded" in sources and weights.is_file():
        digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
        try:
            commit = subprocess.run(["git", "log", "-1", "--format=%h %cI", "--", str(weights)], cwd=REPO,
                                    capture_output=True, text=True, timeout=10).stdout.strip() or "uncommitted"
        except (OSError, subprocess.SubprocessError):
            commit = "unknown"
        lines.append(f"- Policy: the embedded default (`esjax/assets/default_policy/model.safetensors`, sha256 "
                     f"`{digest}…`, last commit {commit}), the same initial weights for every run.")
    seconds, presets, machines, shards = [], set(), set(), set()
    for runs in grid.values():
        for r in runs:
            meta = r["dir"] / "grid.json"
            if meta.is_file():
                info = json.loads(meta.read_text())
                seconds.append(float(info.get("seconds", 0.0)))
                presets.add(info.get("preset", "?"))
                machine = info.get("machine") or {}
                machines.add(f"{machine['cpu']} ({machine['cores']} cores)" if machine else "a machine not recorded")
                shards.add(info.get("shard", "?").split("/")[-1])
    total = sum(len(v) for v in grid.values())
    median = float(np.median(seconds)) if seconds else 0.0
    lines.append(f"- {total} finished runs in {len(grid)} cells; grid preset(s): {', '.join(sorted(presets)) or '?'}; "
                 f"run time {sum(seconds) / 60:.1f} min summed over runs (median {median:.0f} s per run, including "
                 f"evaluation) in {' or '.join(sorted(shards))} parallel shard process(es) on "
                 f"{'; '.join(sorted(machines))}.")
    return lines


def _same_runs(a: list[dict], b: list[dict]) -> bool:
    """Two cells with the same seeds and the same eval curves and lag histograms (schedules that coincide)."""
    key = lambda r: (r["seed"], r["eval_scores"], r["lag_hist"], r["update_ticks"])  # noqa: E731
    return [key(r) for r in a] == [key(r) for r in b]


def _verdict_text(t: dict | None, margin: float) -> str:
    if t is None:
        return "no paired seed"
    label = t["verdict"].replace(" m", f" ±{margin:g}")
    extra = ""
    if t["verdict"] == "equivalent within m" and math.isfinite(t["p_diff_holm"]) and t["p_diff_holm"] < t["alpha"]:
        extra = ", though detectably different from 0"
    if t["n"] < 2:
        extra = f", {t['n']} paired seed"
    return f"**{label}**{extra} (Δ {t['mean']:+.1f}, 90% CI {_iv(t['low90'], t['high90'])}, n = {t['n']})"


def margin_caveat(sync: list[dict], margin: float) -> str | None:
    """A findings line when m is not small against sync's own gain (final score or AUC over version 0): there an
    equivalence verdict would also admit a schedule that learned nothing."""
    gains = (("final-score", float(np.mean([r["final"] - r["initial"] for r in sync]))),
             ("AUC", float(np.mean([r["auc"] - r["initial"] for r in sync]))))
    small = [f"{what} gain {gain:+.1f}" for what, gain in gains if gain <= margin]
    if not small:
        return None
    return (f"- **The margin is not small against what sync learns** ({', '.join(small)} vs m = ±{margin:g}): an "
            "\"equivalent within m\" verdict on such an endpoint would also hold for a schedule that learned nothing, "
            "so it shows that staleness does not *hurt* by more than m, not that async keeps the gain. A margin well "
            "below the gain (and the seeds the power table asks for at it) is what \"nearly free\" needs.")


def findings(grid: dict[str, list[dict]], margin: float = DEFAULT_MARGIN, alpha: float = DEFAULT_ALPHA) -> list[str]:
    """Plain statements, with the numbers, of how the published findings fare here. Every comparison with sync
    is stated through its verdict (equivalent within m / worse / better / inconclusive), never through whether a
    confidence interval contains 0."""
    sync = grid.get("sync")
    if not sync:
        return ["- No finished sync runs: no comparison possible."]
    tests = {key: compare_with_sync(grid, key, margin, alpha) for key in ENDPOINTS}
    lines = []
    learn = t_ci([r["final"] - r["initial"] for r in sync])
    init = np.mean([r["initial"] for r in sync])
    final = np.mean([r["final"] for r in sync])
    learned = not math.isnan(learn[1]) and learn[1] > 0
    ci = f"95% CI [{learn[1]:+.1f}, {learn[2]:+.1f}]" if not math.isnan(learn[1]) else "one seed, no CI"
    lines.append(f"- **Does ES learn at this budget?** Sync ES moves the held-out score from {init:.1f} to {final:.1f} "
                 f"(Δ {learn[0]:+.1f}, {ci}, {len(sync)} seeds). "
                 + ("The improvement is significant, so the staleness comparisons below measure something."
                    if learned else
                    "The improvement is **not significant** at this budget, so even an \"equivalent\" verdict below "
                    "says little: schedules that do not learn cannot differ much either."
                    + (" Sync *loses* score here, so a positive Δ below means a schedule lost less than sync, not "
                       "that it learned more." if learn[0] < 0 else "")))
    caveat = margin_caveat(sync, margin)
    if caveat:
        lines.append(caveat)

    def both(name: str) -> str:
        return (f"final score {_verdict_text(tests['final'].get(name), margin)}; AUC "
                f"{_verdict_text(tests['auc'].get(name), margin)}")

    for name, published in (("async-G4", "natural async 25.9 vs sync 25.4 success, ≈ 9.5% of results 1 update "
                                         "stale"),
                            ("async-K1", "the same claim, here in the saturated regime G = N")):
        if name not in grid:
            continue
        stale = np.mean([r["stale_fraction"] for r in grid[name]])
        lines.append(f"- **Natural async ≈ sync** ({name}; published: {published}): measured stale share "
                     f"{stale:.2f}; {both(name)}.")
    if "async-K2" in grid and "async-K1" in grid and _same_runs(grid["async-K1"], grid["async-K2"]):
        lines.append("- async-K2 ran exactly as async-K1 (identical records): with as many slots as members no "
                     "result is ever more than 1 update late, so the bound K = 2 never binds.")
    for name, text in (("delay4", f"published: delay-4 {PUBLISHED['delay4']} vs sync {PUBLISHED['sync']} success, "
                                  f"{PUBLISHED['delay4'] - PUBLISHED['sync']:+.1f}"),
                       ("delay8", f"published: delay-8 {PUBLISHED['delay8']} vs sync {PUBLISHED['sync']} success, "
                                  f"{PUBLISHED['delay8'] - PUBLISHED['sync']:+.1f}"),
                       ("all-stale-k1", "the abstract's all-stale case; no number published")):
        if name in grid:
            lines.append(f"- **Paper stress test {name}** ({text}): {both(name)}.")
    ours = [c.name for c in all_cells() if c.origin == "ours" and c.name in tests["final"]]
    if ours:
        counts = {v: [n for n in ours if tests["final"][n]["verdict"] == v] for v in VERDICTS}
        means = np.array([tests["final"][n]["mean"] for n in ours])
        worst = min(ours, key=lambda n: tests["final"][n]["mean"])
        summary = "; ".join(f"{v}: {len(c)}" + (f" ({', '.join(c)})" if c and v != "inconclusive" else "")
                            for v, c in counts.items())
        lines.append(f"- **Our cells** ({len(ours)} with a paired seed; our definitions, not the paper's), final "
                     f"score vs sync: {summary}. Mean Δ over them {means.mean():+.1f} (range {means.min():+.1f} … "
                     f"{means.max():+.1f}; lowest {worst} {_verdict_text(tests['final'][worst], margin)}).")
    every = [t for key in ENDPOINTS for t in tests[key].values()]
    if every and all(t["verdict"] == "inconclusive" for t in every):
        lines.append(f"- **No cell is equivalent, worse or better at this seed count**: the intervals are too "
                     f"wide for a margin of ±{margin:g}; the power table says how many seeds would decide.")
    async_runs = grid.get("async-G4") or grid.get("async-K1") or grid.get("async-K2")
    if async_runs:
        su = np.mean([r["utilization"] for r in sync])
        au = np.mean([r["utilization"] for r in async_runs])
        st = np.mean([r["ticks"] / max(r["update_versions"][-1], 1) for r in sync])
        at = np.mean([r["ticks"] / max(r["update_versions"][-1], 1) for r in async_runs])
        which = next(n for n in ("async-G4", "async-K1", "async-K2") if grid.get(n))
        lines.append(f"- **Straggler idle time** (real loop, {which}; a measurement, no test): slot utilization sync "
                     f"{su:.2f} vs async {au:.2f}; loop ticks per update sync {st:.1f} vs async {at:.1f} "
                     f"({st / at:.2f}× {'fewer' if at < st else 'as many'}). The simulator study at G ∈ {{4, 16, 64}} "
                     "is in [wallclock.md](wallclock.md).")
    return lines


def _comparison_table(tests: dict[str, dict], margin: float) -> list[str]:
    lines = [f"| cell | pairs (seeds) | mean Δ | paired SD | 95% CI | 90% CI (TOST) | p Δ≠0 | Holm p | "
             f"p TOST (Δ>−{margin:g}, Δ<+{margin:g}) | Holm p TOST | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, t in tests.items():
        sd = f"{t['sd']:.2f}" if math.isfinite(t["sd"]) else "—"
        lines.append(f"| {name} | {t['n']} ({','.join(map(str, t['seeds']))}) | {t['mean']:+.2f} | {sd} "
                     f"| {_iv(t['low95'], t['high95'])} | {_iv(t['low90'], t['high90'])} | {_p(t['p_diff'])} "
                     f"| {_p(t['p_diff_holm'])} | {_p(t['p_lower'])}, {_p(t['p_upper'])} | {_p(t['p_tost_holm'])} "
                     f"| {t['verdict'].replace(' m', f' ±{margin:g}')} |")
    return lines


def _power_table(rows: list[dict], family: int) -> list[str]:
    lines = ["| cell | paired SD | seeds now | TOST power now | seeds needed (exact t) | normal formula n | "
             f"seeds needed at α/{family} (Holm over {family}) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        known = math.isfinite(r["sd"])
        needed = _n(r["needed"]) if known else "—"
        holm_n = _n(r["needed_holm"]) if known else "—"
        normal = f"{r['normal']:.1f}" if known else "—"
        power = f"{r['power_now']:.2f}" if math.isfinite(r["power_now"]) else "—"
        lines.append(f"| {r['cell']} | {r['sd']:.2f} | {r['n']} | {power} | {needed} | {normal} | {holm_n} |"
                     if known else f"| {r['cell']} | — | {r['n']} | — | — | — | — |")
    return lines


def published_table() -> list[str]:
    sync = PUBLISHED["sync"]
    rows = [("base policy (no training)", PUBLISHED["base"], "version 0 of every run"),
            ("sync ES", sync, "sync"),
            (f"natural async (G = 4 workers, N = 30; ≈ {PUBLISHED_STALE_SHARE:.1%} of results 1 update stale)",
             PUBLISHED["async"], "async-G4 (G < N, the paper's regime); async-K1 is the saturated G = N variant"),
            ("delay-4 (27 fresh + 3 delayed by exactly 4)", PUBLISHED["delay4"], "delay4"),
            ("delay-8 (27 fresh + 3 delayed by exactly 8)", PUBLISHED["delay8"], "delay8"),
            ("GRPO", PUBLISHED["grpo"], "—")]
    lines = [f"**{PUBLISHED_LABEL}.** Success % is the share of solved tasks, not our score; N = 30, 120 updates. "
             "Shown for the direction and rough size of the published effects only.", "",
             "| published setting | held-out success % | Δ vs sync (points of success) | our cell of the same "
             "definition |", "|---|---|---|---|"]
    for label, value, ours in rows:
        delta = "—" if label.startswith(("base", "sync")) else f"{value - sync:+.1f}"
        lines.append(f"| {label} | {value} | {delta} | {ours} |")
    lines.append("| all fitness values stale (abstract) | not given | — | all-stale-k1 |")
    return lines


def _left_out(scan: GridScan | None, grid: dict[str, list[dict]]) -> list[str]:
    lines = []
    if scan is not None:
        if scan.failed:
            lines += ["Runs that failed (`failed.json` in the run directory has the error):", ""]
            lines += [f"- {cell} seed {seed}: `{error[:200]}`" for cell, seed, error in scan.failed] + [""]
        if scan.unfinished:
            lines += ["Runs started but not finished (no `summary.md`, or no evaluation/update records): "
                      + ", ".join(f"{c} seed {s}" for c, s in scan.unfinished) + ".", ""]
        if scan.excluded:
            lines += ["Finished runs left out of every statistic because their records are inconsistent:", ""]
            lines += [f"- {cell} seed {seed}: {'; '.join(problems)}" for cell, seed, problems in scan.excluded] + [""]
        missing = scan.missing()
        if missing:
            lines += [f"Seeds without a usable run (expected seeds {','.join(map(str, scan.expected_seeds))}): "
                      + "; ".join(f"{c}: {','.join(map(str, s))}" for c, s in missing.items()) + ".", ""]
        not_run = scan.not_run()
        if not_run:
            lines += [f"Cells not run: {', '.join(not_run)}.", ""]
    sync_seeds = {r["seed"] for r in grid.get("sync", [])}
    unpaired = {n: [r["seed"] for r in runs if r["seed"] not in sync_seeds] for n, runs in grid.items()
                if n != "sync"}
    unpaired = {n: s for n, s in unpaired.items() if s}
    if unpaired:
        lines += ["Seeds without a sync run of the same seed (not in any Δ): "
                  + "; ".join(f"{n}: {','.join(map(str, s))}" for n, s in unpaired.items()) + ".", ""]
    if not lines:
        lines = ["None: every started run finished with consistent records, every cell that ran has every seed, and "
                 "every seed has its sync partner.", ""]
    return lines


def write_report(grid: dict[str, list[dict]], out: Path, data: str, runs_root: Path, margin: float = DEFAULT_MARGIN,
                 alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER, scan: GridScan | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = "staleness"
    figures = write_figures(grid, out, stem) if grid else []
    sync = grid.get("sync", [])
    lines = ["# Staleness study: bounded-staleness asynchronous ES on WebShop", "",
             "Generated by `python experiments/report.py` from the run directories of "
             f"`experiments/staleness_grid.py` (`{runs_root.name}/{data}/`). Every number below comes from a "
             "finished trainer run; seeds are listed per row.", ""]
    lines += ["## Settings", "", "| key | value(s) across runs |", "|---|---|", *_settings(grid), ""]
    lines += [*_provenance(grid), ""]
    lines += ["Final score = 100 × mean reward of the greedy unperturbed θ on the held-out goals at the last "
              "version; success = share of goals with reward 1; AUC = mean eval score along the run (trapezoid "
              "over versions). Stale = share of accepted fitness with lag > 0; discarded = results that fit no "
              "cohort. Origin: *paper* cells restate a definition of arXiv 2610.04196, *ours* are our own.", ""]
    lines += ["## Results", "",
              "| cell | origin | schedule | seeds | final score | success % | AUC | stale share | mean lag | discarded "
              "| ticks/update |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cell in all_cells():
        runs = grid.get(cell.name)
        if not runs:
            if cell.same_as is None:
                lines.append(f"| {cell.name} | {_origin(cell)} | {_cell_label(cell)} | — | not run | | | | | | |")
            continue
        tpu = [r["ticks"] / max(r["update_versions"][-1], 1) for r in runs]
        lines.append(
            f"| {cell.name} | {_origin(cell)} | {_cell_label(cell, runs[0]['config'])} "
            f"| {','.join(str(r['seed']) for r in runs)} | {_ms([r['final'] for r in runs])} "
            f"| {_ms([r['success'] for r in runs])} | {_ms([r['auc'] for r in runs])} "
            f"| {np.mean([r['stale_fraction'] for r in runs]):.3f} | {np.mean([r['mean_lag'] for r in runs]):.2f} "
            f"| {np.mean([r['discarded'] or 0 for r in runs]):.0f} | {np.mean(tpu):.1f} |")
    if sync:
        lines += ["", f"Initial (version 0) held-out score, identical across schedules of a seed: "
                      f"{_ms([r['initial'] for r in sync])} (seeds {','.join(str(r['seed']) for r in sync)})."]
    lines += ["", "## Runs left out, missing seeds", "", *_left_out(scan, grid)]

    tests = {key: compare_with_sync(grid, key, margin, alpha) for key in ENDPOINTS}
    lines += [f"## Comparison with sync: equivalence at ±{margin:g} points, Holm-corrected", "",
              f"Δ = cell − sync, paired by seed. Margin m = {margin:g} points of score (both endpoints), α = "
              f"{alpha:g}. Holm over the cells with ≥ 2 paired seeds, per endpoint, separately for the difference "
              "test and for TOST. Verdict rule: *equivalent within m* if the Holm-adjusted TOST p < α (the 90% "
              "interval inside ±m, corrected for the number of cells); else *worse* / *better* if the "
              "Holm-adjusted two-sided p < α (by the sign of Δ); else *inconclusive* (always with < 2 pairs). "
              "An interval that contains 0 is not evidence of equivalence.", ""]
    for key, title in ENDPOINTS.items():
        lines += [f"### {title}", ""]
        lines += _comparison_table(tests[key], margin) if tests[key] else ["No cell has a seed paired with sync."]
        lines += [""]

    lines += [f"## Power: seeds for a TOST at ±{margin:g}", "",
              f"From the measured paired SD of each cell, for a true Δ = 0, α = {alpha:g}, power {power:g}: the "
              "exact power of the paired TOST (t test, integrated over the sampling distribution of the SD), the "
              "smallest seed count reaching the target power, the normal formula n ≈ (z₁₋α + z₁₋β/₂)²·σ²/m² for "
              "comparison (it understates n for small samples), and the seeds needed when each TOST must pass at "
              "α/k — Holm's first step over the k cells, enough for every cell to be declared equivalent. A SD from "
              "a handful of seeds is itself uncertain (see the last line).", ""]
    for key, title in ENDPOINTS.items():
        if not tests[key]:
            continue
        rows = power_rows(tests[key], margin, alpha, power)
        family = max([t["family"] for t in tests[key].values()] + [1])
        lines += [f"### {title}", "", *_power_table(rows, family), ""]
        overall = [r for r in rows if r["cell"].startswith("overall")]
        if overall and math.isfinite(overall[0].get("sd_upper", math.nan)):
            r = overall[0]
            lines += [f"Pooled paired SD {r['sd']:.2f} ({r['df']} df); its one-sided 80% upper confidence bound "
                      f"{r['sd_upper']:.2f} would need {_n(r['needed_upper'])} seeds per cell at α/{family}. The "
                      f"{r['n']} seeds of the smallest paired cell give a TOST power of {r['power_now']:.2f} at the "
                      "pooled SD.", ""]

    lines += ["## The published findings, tested here", "", *findings(grid, margin, alpha), ""]
    lines += ["## Published numbers (side table)", "", *published_table(), ""]
    if data == "synthetic":
        lines += ["On the synthetic shop the trivial rule \"open first hit, buy\" scores 64.1 on the test split, about "
                  "what ES reaches: that shop separates schedules poorly. The study's real runs are on WebShop's "
                  "real small set (`staleness_grid.py --preset real`, report with `--data webshop_small`).", ""]
    if figures:
        lines += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures] + [""]
    path = out / f"{stem}.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_OUT,
                        help="grid runs root (default experiments/results/study/)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where staleness.md + PNGs go (default: experiments/results/ for the real WebShop "
                             "runs, experiments/results/<data>/ for others)")
    parser.add_argument("--data", default="synthetic", help="which dataset's runs (synthetic or webshop_small)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help="equivalence margin m in points of score (final score and AUC; default 3)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="test level α (default 0.05)")
    parser.add_argument("--power", type=float, default=DEFAULT_POWER,
                        help="target power of the TOST for the seed counts (default 0.8)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="expected seeds 0..S-1, to list the missing ones (default: every seed seen in any cell)")
    args = parser.parse_args(argv)
    if args.margin <= 0 or not 0 < args.alpha < 0.5 or not 0 < args.power < 1:
        parser.error("need --margin > 0, 0 < --alpha < 0.5 and 0 < --power < 1")
    scan = scan_grid(args.runs, args.data, args.seeds)
    if not scan.grid:
        print(f"no finished runs under {args.runs / args.data}", file=sys.stderr)
        return 1
    out = args.out or results_dir(args.data)
    path = write_report(scan.grid, out, args.data, args.runs, args.margin, args.alpha, args.power, scan)
    print(f"wrote {path} ({sum(len(v) for v in scan.grid.values())} runs in {len(scan.grid)} cells; "
          f"{len(scan.failed)} failed, {len(scan.unfinished)} unfinished, {len(scan.excluded)} left out)")
    for line in summary_lines(scan.grid, args.margin, args.alpha, args.power):
        print(line)
    return 0


def summary_lines(grid: dict[str, list[dict]], margin: float = DEFAULT_MARGIN, alpha: float = DEFAULT_ALPHA,
                  power: float = DEFAULT_POWER) -> list[str]:
    """The verdicts and the power analysis in a few plain lines (what main prints)."""
    lines = []
    for key, title in ENDPOINTS.items():
        tests = compare_with_sync(grid, key, margin, alpha)
        if not tests:
            continue
        lines.append(f"{title} vs sync (margin ±{margin:g}, α {alpha:g}, Holm over "
                     f"{max(t['family'] for t in tests.values())} cells):")
        rows = {r["cell"]: r for r in power_rows(tests, margin, alpha, power)}
        for name, t in tests.items():
            r = rows[name]
            need = (f"power {r['power_now']:.2f} now, {_n(r['needed'])} seeds for power {power:g} "
                    f"({_n(r['needed_holm'])} at α/{max(t['family'], 1)})" if math.isfinite(r["sd"])
                    else "SD unknown (< 2 pairs)")
            label = t["verdict"].replace(" m", f" ±{margin:g}")
            lines.append(f"  {name:<14} {label:<22} Δ {t['mean']:+6.2f}  n {t['n']}  paired SD {t['sd']:.2f}  {need}")
        overall = rows.get("overall (pooled SD)")
        if overall:
            lines.append(f"  overall: pooled paired SD {overall['sd']:.2f} ({overall['df']} df) -> "
                         f"{_n(overall['needed'])} seeds per cell at α, {_n(overall['needed_holm'])} with Holm; "
                         f"80% upper SD bound {overall['sd_upper']:.2f} -> {_n(overall['needed_upper'])}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
