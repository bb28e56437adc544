"""The figures drawn from a staleness grid's runs (``experiments.lib.runs.read_run`` dicts, per cell).

* ``write_grid_figures`` (``experiments/report.py``, any grid): ``staleness_curves.png``, held-out eval score vs ES
  updates per schedule (mean over seeds, band = ±1 std); ``staleness_heatmap.png``, Δ final eval score vs sync over
  lag k × stale fraction p (k = 0 / p = 0 is sync); ``staleness_wallclock.png``, eval score vs wall-clock seconds
  and updates vs loop ticks (sync vs async).
* ``write_study_figure`` (``experiments/study_report.py``, the pre-registered study): held-out curves per cell, and
  each seed's paired Δ against the margin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from esjax.rundir.stats import mean_interval
from experiments.lib.grid import FRACTIONS, LAGS, all_cells
from experiments.lib.runs import paired_delta


def _pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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


def write_grid_figures(grid: dict[str, list[dict]], out: Path, prefix: str = "staleness") -> list[Path]:
    """``<prefix>_curves.png``, ``<prefix>_heatmap.png`` and ``<prefix>_wallclock.png`` in ``out`` (see the module
    docstring); returns their paths."""
    plt = _pyplot()

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


def write_study_figure(grid: dict[str, list[dict]], cells: tuple[str, ...], seeds: list[int], margin: float,
                       path: Path) -> Path:
    """Left: mean held-out curve per cell over the seeds (band ±1 SD). Right: each seed's paired Δ final score
    (cell − sync) per cell, its mean and 90% CI (the TOST interval, before Holm), and the margin ±m."""
    plt = _pyplot()
    runs = {name: sorted((r for r in grid[name] if r["seed"] in seeds), key=lambda r: r["seed"])
            for name in ("sync", *cells)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
    for i, (name, rs) in enumerate(runs.items()):  # sync black, cell i in colour C<i> on both panels
        scores = np.asarray([r["eval_scores"] for r in rs], np.float64)
        x, mean, sd = np.asarray(rs[0]["eval_versions"]), scores.mean(0), scores.std(0)
        color = "k" if i == 0 else f"C{i}"
        left.plot(x, mean, "-", color=color, marker="o", ms=3, lw=2 if i == 0 else 1.2,
                  label=f"{name} ({len(rs)} seeds)")
        left.fill_between(x, mean - sd, mean + sd, color=color, alpha=0.08)
    left.set_xlabel("ES updates")
    left.set_ylabel("held-out score, 500 test goals (100 × mean reward)")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    sync_final = {r["seed"]: r["final"] for r in runs["sync"]}
    for i, name in enumerate(cells):
        deltas = [r["final"] - sync_final[r["seed"]] for r in runs[name]]
        jitter = np.linspace(-0.15, 0.15, len(deltas))
        right.plot(i + jitter, deltas, "o", ms=3, alpha=0.5, color=f"C{i + 1}")
        mean, low, high = mean_interval(deltas, 0.90)
        right.errorbar([i + 0.3], [mean], yerr=[[mean - low], [high - mean]], fmt="s", color="k", capsize=4)
    right.axhspan(-margin, margin, color="0.85", alpha=0.5, label=f"±m = ±{margin:g} (equivalence margin)")
    right.axhline(0, color="k", lw=0.8)
    right.set_xticks(range(len(cells)), cells)
    right.set_ylabel("Δ final score vs sync, per seed (points)")
    right.set_title("dots: seeds; square: mean and 90% CI", fontsize=9)
    right.grid(alpha=0.3, axis="y")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
