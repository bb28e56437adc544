"""Results of the staleness study: tables, equivalence tests, power analysis and figures from the grid's runs.

Reads every run directory under ``RUNS/<data>/<cell>/seed<s>/`` written by ``experiments/staleness_grid.py``
and writes ``OUT/staleness.md`` (default OUT: ``experiments/results/`` for the real WebShop runs,
``experiments/results/<data>/`` for others) with the figures next to it:

* ``staleness_curves.png``: held-out eval score vs ES updates per schedule (mean over seeds, band = ±1 std);
* ``staleness_heatmap.png``: Δ final eval score vs sync over lag k × stale fraction p (k = 0 / p = 0 is sync);
* ``staleness_wallclock.png``: eval score vs wall-clock seconds and updates vs loop ticks (sync vs async).

Per run (``experiments.lib.runs.read_run``): final score, success rate, AUC (the mean score along the run) and
stale share.

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

The tests, the verdict rule and the seed counts are :mod:`esjax.rundir.stats` (``paired_test``, ``holm``,
``verdict``, ``tost_power``, ``seeds_needed``; experiments/protocol.md, written while ``verdict`` and
``seeds_needed`` lived in this module, names them here); the pairing by seed and the families are
``experiments.lib.runs.compare_with_sync``.

Runs that failed (``failed.json``), are unfinished (no ``summary.md``), or whose records are inconsistent
(duplicate or missing update versions, more or fewer updates than configured, no evaluation at the last
version, as an update cascade leaves) are left out of every statistic and listed by cell and seed, as
are the seeds a cell lacks and the seeds that have no sync partner.

    python -m experiments.report --data webshop_small [--runs experiments/results/study] [--out DIR]
                                 [--margin 3] [--alpha 0.05] [--power 0.8] [--seeds S]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from esjax.rundir.stats import VERDICTS, mean_interval, pooled_sd, sd_upper, seeds_needed, seeds_normal, tost_power
from experiments.lib import REPO
from experiments.lib.figures import write_grid_figures
from experiments.lib.grid import DEFAULT_OUT, Cell, all_cells, results_dir
from experiments.lib.published import PUBLISHED, published_table
from experiments.lib.runs import DEFAULT_ALPHA, DEFAULT_MARGIN, ENDPOINTS, GridScan, compare_with_sync, scan_grid

DEFAULT_POWER = 0.8


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


def _p(p: float) -> str:
    if not math.isfinite(p):
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _iv(low: float, high: float) -> str:
    return "—" if not math.isfinite(low) else f"[{low:+.1f}, {high:+.1f}]"


def _n(value: int | None) -> str:
    return "> 10⁶" if value is None else str(value)


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
    learn = mean_interval([r["final"] - r["initial"] for r in sync])
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
    figures = write_grid_figures(grid, out, stem) if grid else []
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
