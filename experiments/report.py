"""Results of the staleness study: table, findings and figures from the grid's run directories.

Reads every finished run (a directory with ``summary.md``) under ``RUNS/<data>/<cell>/seed<s>/`` written by
``experiments/staleness_grid.py`` and writes ``OUT/staleness.md`` (default ``experiments/results/``) with
the figures next to it:

* ``staleness_curves.png``: held-out eval score vs ES updates per schedule (mean over seeds, band = ±1 std);
* ``staleness_heatmap.png``: Δ final eval score vs sync over lag k × stale fraction p (k = 0 / p = 0 is sync);
* ``staleness_wallclock.png``: eval score vs wall-clock seconds and updates vs loop ticks (sync vs async).

Per run: final score (100 × mean reward of the greedy unperturbed θ on the held-out goals at the last
version), success rate (share of goals with reward 1), area under the eval curve (trapezoid over versions,
divided by the number of updates: the mean score along the run), and Δ vs sync = cell − sync on the same
seed (paired: a seed fixes the task batches of version 0 and, with a random policy, its initialization).
The 95% CI of Δ is the t interval of the paired differences over seeds.

    python experiments/report.py [--runs experiments/runs] [--out experiments/results] [--data synthetic]
"""

from __future__ import annotations

import argparse
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

from experiments.staleness_grid import DEFAULT_OUT, FRACTIONS, LAGS, Cell, all_cells  # noqa: E402

DEFAULT_RESULTS = REPO / "experiments" / "results"
# Published numbers (arXiv 2610.04196, held-out success on its public benchmark), for the findings text.
PUBLISHED = {"base": 9.3, "sync": 25.4, "async": 25.9, "delay4": 23.8, "delay8": 22.3}


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


def read_run(run_dir: Path) -> dict | None:
    """One finished run's numbers, or None if it is unfinished / has no evaluation."""
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
        for lag, count in (r.get("lag_hist") or {}).items():
            lags[int(lag)] += int(count)
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
    }


def read_grid(runs_root: Path, data: str) -> dict[str, list[dict]]:
    """cell name -> its finished runs (sorted by seed)."""
    out: dict[str, list[dict]] = {}
    root = runs_root / data
    for cell in all_cells():
        runs = []
        for seed_dir in sorted((root / cell.name).glob("seed*")) if (root / cell.name).is_dir() else []:
            run = read_run(seed_dir)
            if run is not None:
                runs.append(run)
        if runs:
            out[cell.name] = sorted(runs, key=lambda r: r["seed"])
    return out


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
    """Δ = cell − sync on the seeds both have: mean, 95% t CI, seeds used."""
    sync_by_seed = {r["seed"]: r[key] for r in sync_runs}
    pairs = [(r["seed"], r[key] - sync_by_seed[r["seed"]]) for r in cell_runs if r["seed"] in sync_by_seed]
    mean, low, high = t_ci([d for _, d in pairs])
    return {"mean": mean, "low": low, "high": high, "seeds": [s for s, _ in pairs], "diffs": [d for _, d in pairs]}


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


# ---------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------


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
        ("natural async and stress tests", ["sync", "async-K1", "async-K2", "extreme-lag"] +
         [f"k{k}-p1" for k in LAGS]),
        ("controlled staleness, p = 0.1 and 0.5", ["sync"] + [f"k{k}-p0.1" for k in LAGS] +
         [f"k{k}-p0.5" for k in LAGS]),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, (title, names) in zip(axes, groups):
        for name in names:
            if name not in grid:
                continue
            x, m, s = _mean_curve(grid[name], "eval_versions", "eval_scores")
            style = "k-" if name == "sync" else "-"
            line, = ax.plot(x, m, style, marker="o", ms=3, lw=2 if name == "sync" else 1.2,
                            label=f"{name} ({len(grid[name])} seeds)")
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
            if name in grid and sync:
                delta[i, j] = paired_delta(grid[name], sync)["mean"]
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
    for name in ["sync", "async-K1", "async-K2", "k4-p0.1", "k2-p1", "extreme-lag"]:
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


def _cell_label(cell: Cell, population: int | None) -> str:
    if cell.family == "sync":
        return "sync (k = 0 / p = 0)"
    if cell.family == "async":
        return f"natural async, K = {cell.k}"
    if cell.family == "extreme_lag":
        return "stress: extreme lag (25% delayed)"
    if cell.family == "all_stale":
        return f"stress: all stale, k = {cell.k} (p = 1)"
    if population:
        return f"controlled k = {cell.k}, p = {cell.p:g} ({_stale_members(cell.p, population)}/{population} stale)"
    return f"controlled k = {cell.k}, p = {cell.p:g}"


def _stale_members(p: float, n: int) -> int:
    return int(math.floor(p * n + 0.5))


def _settings(grid: dict[str, list[dict]]) -> list[str]:
    configs = [r["config"] for runs in grid.values() for r in runs]
    keys = ["model.source", "env.data", "env.num_products", "run.updates", "run.eval_every", "es.population",
            "es.mode", "es.rank", "es.scope", "es.include", "es.sigma", "es.learning_rate", "es.scale", "es.shaping",
            "es.optimizer",
            "schedule.slots", "env.tasks_per_member", "env.max_steps", "env.eval_goals", "env.eval_split",
            "agent.temperature"]
    lines = []
    for name in keys:
        section, key = name.split(".")
        values = sorted({str(c[section][key]) for c in configs})
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


def findings(grid: dict[str, list[dict]]) -> list[str]:
    """Plain statements of which published findings hold here, with the numbers."""
    sync = grid.get("sync")
    if not sync:
        return ["- No finished sync runs: no comparison possible."]
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
                    "There is **no significant improvement** at this budget, so every \"stale ≈ sync\" below is "
                    "weak evidence: schedules that do not learn cannot differ much either."
                    + (" Sync *loses* score here, so a positive Δ below means a schedule lost less than sync, not "
                       "that it learned more." if learn[0] < 0 else "")))
    # 1. natural async ≈ sync
    for name in ("async-K1", "async-K2"):
        if name in grid:
            d = paired_delta(grid[name], sync)
            if math.isnan(d["low"]):
                verdict = "too few paired seeds to test"
            elif d["low"] <= 0 <= d["high"]:
                verdict = "**holds** (the CI contains 0)"
            elif d["high"] < 0:
                verdict = "**does not hold** (async is significantly worse)"
            else:
                verdict = "**does not hold as stated** (async is significantly *better*)"
            if name == "async-K2" and "async-K1" in grid and _same_runs(grid["async-K1"], grid["async-K2"]):
                lines.append("- async-K2 ran exactly as async-K1 (identical records): with as many slots as "
                             "members no result is ever more than 1 update late, so the bound K = 2 never binds.")
                continue
            lines.append(f"- **Natural async ≈ sync** ({name}; published: 25.9 vs 25.4 success): Δ final score "
                         f"{_ci(d)}, stale share of accepted fitness "
                         f"{np.mean([r['stale_fraction'] for r in grid[name]]):.2f} — {verdict}.")
    # 2. small degradation with k and p
    rows = []
    for k in LAGS:
        for p in (*FRACTIONS, 1.0):
            name = f"k{k}-p1" if p == 1.0 else f"k{k}-p{p:g}"
            if name in grid:
                d = paired_delta(grid[name], sync)
                if not math.isnan(d["mean"]):
                    rows.append((k, p, name, d))
    if rows:
        means = np.array([d["mean"] for *_, d in rows])
        worst = min(rows, key=lambda r: r[3]["mean"])
        sig_worse = [name for _, _, name, d in rows if not math.isnan(d["high"]) and d["high"] < 0]
        ks = np.array([k for k, *_ in rows], np.float64)
        ps = np.array([p for _, p, *_ in rows], np.float64)
        design = np.column_stack([np.ones_like(ks), ks, ps])
        coef = np.linalg.lstsq(design, means, rcond=None)[0]
        if all(len(d["seeds"]) < 2 for *_, d in rows):
            verdict = "**Not testable yet**: fewer than two paired seeds per cell."
        elif not sig_worse and worst[3]["mean"] >= -3.5:
            verdict = ("**Holds**: no cell is significantly worse and the worst mean Δ is within the published "
                       "3-point range.")
        else:
            verdict = ("**Holds only partly**: " + (f"{len(sig_worse)} cell(s) are significantly worse; " if sig_worse
                                                     else "") + f"worst mean Δ {worst[3]['mean']:+.1f}.")
        lines.append(
            f"- **Degradation stays small as k and p grow** (published: delay-4 −1.6, delay-8 −3.1 points of "
            f"success vs sync): over the {len(rows)} controlled / all-stale cells the mean Δ is {means.mean():+.1f} "
            f"(range {means.min():+.1f} … {means.max():+.1f}; worst {worst[2]} {_ci(worst[3])}); a linear fit "
            f"Δ ≈ {coef[0]:+.2f} {coef[1]:+.2f}·k {coef[2]:+.2f}·p. Cells significantly below sync (95% CI < 0): "
            f"{', '.join(sig_worse) if sig_worse else 'none'}. " + verdict)
        stale_rows = [(k, name, d) for k, p, name, d in rows if p == 1.0]
        if stale_rows:
            text = ", ".join(f"k = {k}: {_ci(d)}" for k, name, d in stale_rows)
            lines.append(f"- **Even when every fitness is stale** (p = 1, after k fresh warm-up cohorts): Δ {text}.")
    if "extreme-lag" in grid:
        d = paired_delta(grid["extreme-lag"], sync)
        r = grid["extreme-lag"]
        lines.append(f"- **Extreme lag** (25% of members delayed by up to "
                     f"{r[0]['config']['schedule']['max_lag']} updates): Δ {_ci(d)}, mean accepted lag "
                     f"{np.mean([x['mean_lag'] for x in r]):.2f}.")
    # 3. straggler idle time (real loop)
    async_runs = grid.get("async-K1") or grid.get("async-K2")
    if async_runs:
        su = np.mean([r["utilization"] for r in sync])
        au = np.mean([r["utilization"] for r in async_runs])
        st = np.mean([r["ticks"] / max(r["update_versions"][-1], 1) for r in sync])
        at = np.mean([r["ticks"] / max(r["update_versions"][-1], 1) for r in async_runs])
        holds = au > su and at < st
        lines.append(f"- **Async removes the straggler idle time** (real loop): slot utilization sync {su:.2f} vs "
                     f"async {au:.2f}; loop ticks per update sync {st:.1f} vs async {at:.1f} "
                     f"({st / at:.2f}× fewer) — {'**holds**' if holds else '**does not hold here**'}. "
                     "The simulator study at G ∈ {4, 16, 64} is in [wallclock.md](wallclock.md).")
    return lines


def write_report(grid: dict[str, list[dict]], out: Path, data: str, runs_root: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = "staleness" if data == "synthetic" else f"staleness_{data}"
    figures = write_figures(grid, out, stem) if grid else []
    sync = grid.get("sync", [])
    population = None
    for runs in grid.values():
        population = runs[0]["config"]["es"]["population"]
        break
    lines = ["# Staleness study: bounded-staleness asynchronous ES on WebShop", "",
             "Generated by `python experiments/report.py` from the run directories of "
             f"`experiments/staleness_grid.py` (`{runs_root.name}/{data}/`). Every number below comes from a "
             "finished trainer run; seeds are listed per row.", ""]
    lines += ["## Settings", "", "| key | value(s) across runs |", "|---|---|", *_settings(grid), ""]
    lines += [*_provenance(grid), ""]
    lines += ["Final score = 100 × mean reward of the greedy unperturbed θ on the held-out goals at the last "
              "version; success = share of goals with reward 1; AUC = mean eval score along the run (trapezoid "
              "over versions); Δ = cell − sync, paired by seed, with the 95% t interval over seeds. "
              "Stale = share of accepted fitness with lag > 0; discarded = results that fit no cohort.", ""]
    lines += ["## Results", "",
              "| cell | schedule | seeds | final score | success % | AUC | Δ final vs sync [95% CI] | Δ AUC vs sync "
              "| stale | mean lag | discarded | ticks/update |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cell in all_cells():
        runs = grid.get(cell.name)
        if not runs:
            lines.append(f"| {cell.name} | {_cell_label(cell, population)} | — | not run | | | | | | | | |")
            continue
        label = _cell_label(cell, runs[0]["config"]["es"]["population"])
        d = paired_delta(runs, sync) if sync and cell.name != "sync" else None
        da = paired_delta(runs, sync, "auc") if sync and cell.name != "sync" else None
        tpu = [r["ticks"] / max(r["update_versions"][-1], 1) for r in runs]
        lines.append(
            f"| {cell.name} | {label} | {','.join(str(r['seed']) for r in runs)} | {_ms([r['final'] for r in runs])} "
            f"| {_ms([r['success'] for r in runs])} | {_ms([r['auc'] for r in runs])} "
            f"| {_ci(d) if d else '—'} | {_ci(da) if da else '—'} "
            f"| {np.mean([r['stale_fraction'] for r in runs]):.2f} | {np.mean([r['mean_lag'] for r in runs]):.2f} "
            f"| {np.mean([r['discarded'] or 0 for r in runs]):.0f} | {np.mean(tpu):.1f} |")
    if sync:
        lines += ["", f"Initial (version 0) held-out score, identical across schedules of a seed: "
                      f"{_ms([r['initial'] for r in sync])} (seeds {','.join(str(r['seed']) for r in sync)})."]
    failed = sorted((runs_root / data).glob("*/seed*/failed.json"))
    failed = [f for f in failed if not (f.parent / "summary.md").is_file()]
    if failed:
        lines += ["", "Runs that failed (not in the table; `failed.json` in the run directory has the error):", ""]
        for f in failed:
            info = json.loads(f.read_text())
            lines.append(f"- {info['cell']} seed {info['seed']}: `{info['error'][:200]}`")
    lines += ["", "## Which published findings hold here", "", *findings(grid), "",
              "Published (arXiv 2610.04196, its public benchmark, held-out success %): base "
              f"{PUBLISHED['base']}, sync {PUBLISHED['sync']}, natural async {PUBLISHED['async']}, delay-4 "
              f"{PUBLISHED['delay4']}, delay-8 {PUBLISHED['delay8']}; Qwen2.5-7B-Instruct, N = 30, 120 updates. "
              "Our runs use a 0.16M-parameter policy and a far smaller budget, so only the direction and rough "
              "size of the effects are comparable, not the absolute scores.", ""]
    if data == "synthetic" and not (runs_root / "webshop_small").is_dir():
        lines += ["Real WebShop data (`--data webshop_small`, ../shared/webshop_small) was not gridded: the embedded "
                  "policy, pretrained on synthetic titles only, scores 0.0 on real goals (random clicking 7.9; "
                  "[default_policy.md](default_policy.md)), so every schedule would compare zeros. The grid runs "
                  "there unchanged once a policy that buys on real pages exists.", ""]
    if figures:
        lines += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures] + [""]
    path = out / f"{stem}.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_OUT, help="grid runs root (default experiments/runs/)")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help="where staleness.md + PNGs go")
    parser.add_argument("--data", default="synthetic", help="which dataset's runs (synthetic or webshop_small)")
    args = parser.parse_args(argv)
    grid = read_grid(args.runs, args.data)
    if not grid:
        print(f"no finished runs under {args.runs / args.data}", file=sys.stderr)
        return 1
    path = write_report(grid, args.out, args.data, args.runs)
    print(f"wrote {path} ({sum(len(v) for v in grid.values())} runs in {len(grid)} cells)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
