"""PNG plots and ``summary.md`` of a finished run, drawn from its ``metrics.jsonl``.

Record kinds: ``update`` (one per ES update: version, wall_time, fitness_mean / min / max / std, lags,
slot_utilization, cohort_stale_fraction, discarded, ...) and ``eval`` (version, wall_time, score, success_rate and,
from per-goal rewards, their 95% intervals ``score_ci_low`` / ``score_ci_high`` / ``success_ci_low`` /
``success_ci_high``; a record carrying its per-goal ``rewards`` instead gets them computed here).

``plots/score.png``, four panels that each hold one quantity on one axis: the held-out score at every evaluated
version with its 95% interval; the success rate with its Wilson interval; the training population's fitness per
update (mean, min-max band, ±1 SD band; sampled actions of perturbed members on each version's own train goals,
so not on the held-out score's scale); the held-out score against wall-clock time. Resume and extension points
of the run are marked. ``plots/staleness.png``: the integer lag histogram and, per update, the stale share of
the cohort, results discarded and slot utilization (a constant utilization is stated, not drawn).
``plots/throughput.png``: episodes and scored tokens per second against wall-clock time, and seconds per update.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator, PercentFormatter  # noqa: E402

from esjax.rundir.metrics_schema import cohort_lags  # noqa: E402
from esjax.rundir.stats import eval_intervals  # noqa: E402

EVAL_COLOR, SUCCESS_COLOR, FITNESS_COLOR = "tab:blue", "tab:green", "tab:orange"


def _series(records: list[dict[str, Any]], kind: str, key: str, x: str = "version") -> tuple[list, list]:
    rows = [r for r in records if r.get("kind") == kind and r.get(key) is not None and r.get(x) is not None]
    return [r[x] for r in rows], [r[key] for r in rows]


def lag_counts(records: list[dict[str, Any]]) -> Counter:
    """Histogram of accepted lags over the whole run: the update records' cohort lags summed
    (:func:`esjax.rundir.metrics_schema.cohort_lags`, which also reads schema-1 records)."""
    counts: Counter = Counter()
    for record in records:
        if record.get("kind") == "update":
            counts.update(cohort_lags(record))
    return counts


def eval_points(records: list[dict[str, Any]], x: str = "version") -> list[dict[str, Any]]:
    """Every evaluation, in order of ``x``: x, score, success rate and (where the record has them, or its per-goal
    ``rewards``) the 95% interval bounds; a version evaluated twice (a resumed run's records) counts once."""
    by_x: dict[Any, dict[str, Any]] = {}
    for r in records:
        if r.get("kind") != "eval" or r.get("score") is None or r.get(x) is None:
            continue
        bounds = {k: r[k] for k in ("score_ci_low", "score_ci_high", "success_ci_low", "success_ci_high")
                  if r.get(k) is not None}
        if not bounds and r.get("rewards"):
            bounds = eval_intervals(r["rewards"])
        by_x[r[x]] = {"x": r[x], "score": r["score"], "success_rate": r.get("success_rate"), **bounds}
    return [by_x[k] for k in sorted(by_x)]


def fitness_band(records: list[dict[str, Any]], x: str = "version") -> dict[str, list[float]]:
    """Per update: x and the cohort's fitness ×100 (mean, min, max, mean ± SD where recorded)."""
    out: dict[str, list[float]] = {k: [] for k in ("x", "mean", "min", "max", "sd_low", "sd_high")}
    for r in records:
        if r.get("kind") != "update" or r.get("fitness_mean") is None or r.get(x) is None:
            continue
        mean = 100 * r["fitness_mean"]
        sd = 100 * (r.get("fitness_std") or 0.0)
        low = 100 * r["fitness_min"] if r.get("fitness_min") is not None else float("nan")
        high = 100 * r["fitness_max"] if r.get("fitness_max") is not None else float("nan")
        out["x"].append(r[x])
        out["mean"].append(mean)
        out["min"].append(low)
        out["max"].append(high)
        out["sd_low"].append(mean - sd if math.isnan(low) else max(mean - sd, low))  # kept inside min-max
        out["sd_high"].append(mean + sd if math.isnan(high) else min(mean + sd, high))
    return out


def is_constant(values: list[float], tol: float = 1e-9) -> bool:
    return len(values) > 0 and max(values) - min(values) <= tol


def _eval_axes(ax, points: list[dict[str, Any]], xlabel: str, key: str = "score") -> None:
    """One evaluation quantity per axis: ``score`` (95% t interval over goals) or ``success`` (rate in %, Wilson
    interval). Points carry error bars; the thin line between them only guides the eye (nothing was measured
    between evaluations)."""
    if key == "score":
        color, scale, label, interval = EVAL_COLOR, 1.0, "held-out score (100 × mean reward)", "95% interval (t)"
        value = [p["score"] for p in points]
        bounds = [(p.get("score_ci_low"), p.get("score_ci_high")) for p in points]
    else:
        points = [p for p in points if p.get("success_rate") is not None]
        color, scale, label, interval = SUCCESS_COLOR, 100.0, "success rate (reward = 1)", "95% interval (Wilson)"
        value = [p["success_rate"] for p in points]
        bounds = [(p.get("success_ci_low"), p.get("success_ci_high")) for p in points]
    xs = [p["x"] for p in points]
    ys = [scale * v for v in value]
    ax.plot(xs, ys, "-", color=color, linewidth=0.8, alpha=0.5)
    ax.plot(xs, ys, "o", color=color, label=label)
    banded = [(x, y, lo, hi) for x, y, (lo, hi) in zip(xs, ys, bounds) if lo is not None and hi is not None]
    if banded:
        ax.errorbar([b[0] for b in banded], [b[1] for b in banded],
                    yerr=[[b[1] - scale * b[2] for b in banded], [scale * b[3] - b[1] for b in banded]],
                    fmt="none", ecolor=color, alpha=0.6, capsize=4, label=interval)
    for x, y in zip(xs, ys):
        ax.annotate(f"{y:.1f}" + ("%" if key != "score" else ""), (x, y), textcoords="offset points",
                    xytext=(6, 4), fontsize=7, color=color)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("score" if key == "score" else "success rate")
    if key != "score":
        top = max(ax.get_ylim()[1], 1.0)
        ax.set_ylim(-0.03 * top, top)
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=0 if top >= 10 else 1))
    low, high = ax.get_ylim()
    if key == "score" and high - low < 5:  # a flat score (e.g. 0 everywhere): a readable range instead of ±0.05
        ax.set_ylim(low - (5 - (high - low)) / 2, high + (5 - (high - low)) / 2)
    ax.grid(alpha=0.3)


def _mark_resumes(ax, marks: list[tuple[int, str]]) -> None:
    """A vertical line where the run was resumed (dotted) or extended (dashed)."""
    styles = {"resumed": ("tab:gray", ":"), "extended": ("tab:purple", "--")}
    for i, (version, label) in enumerate(marks):
        color, style = styles.get(label, ("tab:gray", "-."))
        ax.axvline(version, color=color, linestyle=style, linewidth=1.1, alpha=0.8,
                   label=f"{label} here" if label not in [m[1] for m in marks[:i]] else None)


def _legend_below(ax, handles=None, labels=None) -> None:
    """A legend under the axes, where it hides no data."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                  frameon=False)


def _fitness_axes(ax, band: dict[str, list[float]], xlabel: str, legend: bool) -> None:
    """The training population per update: mean fitness ×100, its min-max band and ±1 SD band."""
    xs = band["x"]
    ax.plot(xs, band["mean"], "-", color=FITNESS_COLOR, label="cohort mean fitness ×100")
    if any(v == v for v in band["min"]) and any(v == v for v in band["max"]):  # NaN-free somewhere
        ax.fill_between(xs, band["min"], band["max"], color=FITNESS_COLOR, alpha=0.15, linewidth=0,
                        label="cohort min-max")
    ax.fill_between(xs, band["sd_low"], band["sd_high"], color=FITNESS_COLOR, alpha=0.3, linewidth=0,
                    label="mean ± 1 SD")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("training fitness ×100")
    ax.grid(alpha=0.3)
    if legend:
        _legend_below(ax)


def write_plots(records: list[dict[str, Any]], out_dir: str | Path, title: str | None = None,
                marks: list[tuple[int, str]] = ()) -> list[Path]:
    """Write the run's figures into ``out_dir`` and return their paths (``title``: e.g. run name, seed, commit;
    ``marks``: ``(version, 'resumed' | 'extended')`` of the run's resumes, drawn on the per-version panels)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in (("score.png", lambda r: _score_figure(r, list(marks))), ("staleness.png", _staleness_figure),
                       ("throughput.png", _throughput_figure)):
        fig = draw(records)
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        paths.append(out_dir / name)
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


#: Why the training curve is not on the held-out score's scale (printed under its panel).
FITNESS_NOTE = ("training fitness: perturbed members (θ + σε), sampled actions, each version's own train goals —\n"
                "not comparable to the greedy held-out score; it can fall while the held-out score rises")


def _score_figure(records: list[dict[str, Any]], marks: list[tuple[int, str]] = ()):
    """Held-out score, success rate, training fitness (each on its own axis) and the score against wall-clock."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.6))
    points = eval_points(records)
    _eval_axes(axes[0, 0], points, "ES updates (version)", "score")
    axes[0, 0].set_title("held-out score (greedy, unperturbed θ)", fontsize=9)
    _eval_axes(axes[0, 1], points, "ES updates (version)", "success")
    axes[0, 1].set_title("held-out success rate", fontsize=9)
    _fitness_axes(axes[1, 0], fitness_band(records), "ES updates (version)", legend=False)
    axes[1, 0].set_title("training population (each update's cohort)", fontsize=9)
    axes[1, 0].text(0.0, -0.2, FITNESS_NOTE, transform=axes[1, 0].transAxes, fontsize=7, va="top", color="0.3")
    timed = eval_points(records, "wall_time")
    _eval_axes(axes[1, 1], timed, "wall-clock (s)", "score")
    axes[1, 1].set_title("held-out score against wall-clock time", fontsize=9)
    for ax in (axes[0, 0], axes[0, 1], axes[1, 0]):
        _mark_resumes(ax, list(marks))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best", frameon=False)
    return fig


def _staleness_figure(records: list[dict[str, Any]]):
    """The lag histogram, and per update the stale share, discards and slot utilization."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    counts = lag_counts(records)
    lags = list(range(max(counts) + 1)) if counts else [0]
    axes[0].bar(lags, [counts.get(lag, 0) for lag in lags], width=0.6)
    axes[0].set_xticks(lags)  # lags are whole updates
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_xlabel("lag of accepted fitness (updates)")
    axes[0].set_ylabel("members")
    axes[0].set_title("lag histogram", fontsize=9)
    updates = [r for r in records if r.get("kind") == "update" and r.get("version") is not None]
    versions = [r["version"] for r in updates]
    ax = axes[1]
    stale = [r.get("cohort_stale_fraction") for r in updates]
    if any(v is not None for v in stale):
        ax.plot(versions, [v if v is not None else float("nan") for v in stale], "o-", markersize=3,
                label="stale share of the cohort")
    utilization = [r["slot_utilization"] for r in updates if r.get("slot_utilization") is not None]
    notes = []
    if is_constant(utilization):
        notes.append(f"slot utilization {utilization[0]:.2f} at every update")
    elif utilization:
        ax.plot([r["version"] for r in updates if r.get("slot_utilization") is not None], utilization, "-",
                label="slot utilization (busy slots / slots)")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("ES updates (version)")
    ax.set_ylabel("share")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    totals = [r.get("discarded") for r in updates]
    if updates and all(t is not None for t in totals):
        per_update = [b - a for a, b in zip([0, *totals[:-1]], totals)]
        if any(per_update):
            right = ax.twinx()
            right.bar(versions, per_update, width=0.5, color="tab:red", alpha=0.35,
                      label="results discarded in the update")
            right.set_ylabel("discarded", color="tab:red")
            right.yaxis.set_major_locator(MaxNLocator(integer=True))
            handles, labels = ax.get_legend_handles_labels()
            more, more_labels = right.get_legend_handles_labels()
            _legend_below(ax, handles + more, labels + more_labels)
        else:
            notes.append("no results discarded")
    if not ax.get_legend():
        _legend_below(ax)
    ax.set_title("per update" + (f" ({'; '.join(notes)})" if notes else ""), fontsize=9)
    return fig


def _throughput_figure(records: list[dict[str, Any]]):
    """Throughput over the run: episodes and scored tokens per second between updates against wall-clock time,
    and seconds per update (a slowdown, a compile or an evaluation shows up here)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    ax = axes[0]
    xs, episodes = _series(records, "update", "episodes_per_s", "wall_time")
    ax.plot(xs, episodes, "o-", markersize=3, color="tab:purple", label="training episodes / s")
    ax.set_xlabel("wall-clock (s)")
    ax.set_ylabel("episodes / s", color="tab:purple")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    right = ax.twinx()
    xs, tokens = _series(records, "update", "tokens_per_s", "wall_time")
    right.plot(xs, tokens, "-", color="tab:gray", alpha=0.8, label="scored tokens / s, right axis")
    right.set_ylabel("tokens / s", color="tab:gray")
    right.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = right.get_legend_handles_labels()
    _legend_below(ax, handles + more, labels + more_labels)
    ax.set_title("throughput between updates", fontsize=9)
    versions, seconds = _series(records, "update", "seconds")
    axes[1].bar(versions, seconds, width=0.6, color="tab:purple", alpha=0.6)
    evaluated = {p["x"] for p in eval_points(records)}
    marked = [(v, t) for v, t in zip(versions, seconds) if v - 1 in evaluated]
    if marked:  # the updates whose interval ran an evaluation beside training
        axes[1].plot(*zip(*marked), "v", color=EVAL_COLOR, markersize=5, label="an evaluation ran in this interval")
        _legend_below(axes[1])
    axes[1].set_xlabel("ES updates (version)")
    axes[1].set_ylabel("seconds")
    axes[1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].grid(alpha=0.3, axis="y")
    axes[1].set_title("wall-clock seconds per update", fontsize=9)
    return fig


def _run_lines(run_info: dict[str, Any]) -> list[str]:
    """Where the run came from: commit, command-line overrides, machine (from run.json)."""
    def commit(meta: dict[str, Any]) -> str:
        text = str(meta.get("git_commit") or "unknown")
        return f"{text} (uncommitted changes)" if meta.get("git_dirty") else text

    def overrides(meta: dict[str, Any]) -> str:
        items = meta.get("overrides") or []
        return ", ".join(f"`--set {item}`" for item in items) if items else "none"

    machine = run_info.get("machine") or {}
    lines = ["## Run", "", f"- commit: {commit(run_info)}", f"- overrides: {overrides(run_info)}"]
    if machine:
        lines.append(f"- machine: {machine.get('cpu', 'unknown')}, {machine.get('cores', '?')} cores, "
                     f"Python {machine.get('python', '?')}, devices: {', '.join(run_info.get('devices') or [])}")
    for i, resume in enumerate(run_info.get("resumes") or [], 1):
        cpu = (resume.get("machine") or {}).get("cpu", "unknown")
        lines.append(f"- resume {i}: commit {commit(resume)}, overrides {overrides(resume)}, {cpu}")
    return [*lines, ""]


def _warning_lines(records: list[dict[str, Any]]) -> list[str]:
    """Counts of what went wrong during the run (event records): constant-fitness cohorts, rejected updates,
    env faults."""
    events = Counter(r.get("event") for r in records if r.get("kind") == "event")
    lines = []
    constant = sorted(r["version"] for r in records if r.get("kind") == "event" and r.get("event") ==
                      "constant_fitness")
    if constant:
        shown = ", ".join(map(str, constant[:20])) + (", ..." if len(constant) > 20 else "")
        lines.append(f"- {len(constant)} update(s) had a cohort whose fitnesses were all equal (zero ES gradient, "
                     f"no learning signal): versions {shown}")
    if events.get("nonfinite_update"):
        lines.append(f"- {events['nonfinite_update']} update(s) rejected: they would have made θ non-finite")
    if events.get("env_fault"):
        lines.append(f"- {events['env_fault']} env fault(s) (episodes re-run, scored 0 or jobs dropped)")
    for stop in (r for r in records if r.get("kind") == "event" and r.get("event") == "stopped"):
        lines.append(f"- stopped early at version {stop['version']}: {stop['reason']}")
    return ["## Warnings", "", *lines, ""] if lines else []


def _interval(point: dict[str, Any], name: str, scale: float, unit: str) -> str:
    """``[62.1, 65.7]`` from a point's ``<name>_ci_low`` / ``_high`` (× ``scale``), or ``n/a``."""
    low, high = point.get(f"{name}_ci_low"), point.get(f"{name}_ci_high")
    if low is None or high is None:
        return "n/a"
    return f"[{scale * low:.1f}{unit}, {scale * high:.1f}{unit}]"


def behaviour_lines(behaviour: dict[int, dict[str, float]], rows: Sequence[tuple[str, str, str]]) -> list[str]:
    """The greedy agent's behaviour at the first and the last traced evaluation (what a score change was made of):
    ``rows`` (the task's :attr:`esjax.task.Task.behaviour_rows`: key, label, format) of each version's measures."""
    if not behaviour or not rows:
        return []
    first, last = min(behaviour), max(behaviour)
    versions = [first] if first == last else [first, last]
    lines = ["What the greedy agent did (from the evaluation traces):", "",
             "| | " + " | ".join(f"v{v}" for v in versions) + " |", "|---|" + "---|" * len(versions)]
    for key, label, fmt in rows:
        lines.append(f"| {label} | " + " | ".join(fmt.format(behaviour[v][key]) for v in versions) + " |")
    return [*lines, ""]


def write_summary(records: list[dict[str, Any]], out_path: str | Path, title: str,
                  run_info: dict[str, Any] | None = None,
                  traces: dict[int, list[dict[str, Any]]] | None = None, task: Any = None) -> str:
    """A short markdown summary: every evaluation (score, success rate, their 95% intervals where the record has
    them or its per-goal rewards), the score change with its interval (paired by goal when ``traces`` of the first
    and last evaluation are given) and the agent's behaviour at both (the run's ``task``'s measures,
    :meth:`esjax.task.Task.behaviour`), updates, acceptance, staleness, warnings, and (from ``run_info``, the run's
    run.json) the commit, overrides and machine."""
    from esjax.rundir.traces import paired_delta

    traces = traces or {}
    evals = eval_points(records)
    goals = {r["version"]: r.get("goals") for r in records if r.get("kind") == "eval" and "version" in r}
    updates = [r for r in records if r.get("kind") == "update"]
    lines = [f"# {title}", ""]
    if evals:
        lines += ["Every held-out evaluation (unperturbed θ, greedy; 95% intervals over goals: score t, success "
                  "rate Wilson):", "",
                  "| | version | score | score 95% CI | success rate | success 95% CI | goals |",
                  "|---|---|---|---|---|---|---|"]
        for i, p in enumerate(evals):
            label = "before" if i == 0 else "after" if i == len(evals) - 1 else ""
            success = "n/a" if p.get("success_rate") is None else f"{100 * p['success_rate']:.1f}%"
            lines.append(f"| {label} | {p['x']} | {p['score']:.1f} | {_interval(p, 'score', 1, '')} | {success} | "
                         f"{_interval(p, 'success', 100, '%')} | {goals.get(p['x'], '?')} |")
        lines.append("")
        if len(evals) >= 2:
            first, last = evals[0], evals[-1]
            paired = (paired_delta(traces[first["x"]], traces[last["x"]])
                      if first["x"] in traces and last["x"] in traces else None)
            if paired is not None:
                change = (f"Δ score: {paired['delta']:+.1f}, 95% interval [{paired['low']:+.1f}, "
                          f"{paired['high']:+.1f}] over the {paired['goals']} held-out goals, paired by goal "
                          f"({paired['better']} goals better, {paired['worse']} worse)")
            else:
                change = f"Δ score: {last['score'] - first['score']:+.1f} on {goals.get(last['x'], '?')} held-out goals"
            lines += [f"{change}. This is one run (one seed): the interval covers the choice of goals, not the "
                      "spread from seed to seed; compare settings over several seeds.", ""]
    if task is not None:
        lines += behaviour_lines({v: task.behaviour(lines_) for v, lines_ in traces.items()}, task.behaviour_rows)
    if updates:
        last = updates[-1]
        counts = lag_counts(records)
        total = sum(counts.values()) or 1
        stale = sum(c for lag, c in counts.items() if lag > 0)
        lines += [f"- updates: {last['version']}",
                  f"- accepted: {last.get('accepted', 'n/a')}, discarded: {last.get('discarded', 'n/a')}",
                  f"- stale fraction of accepted fitness: {stale / total:.3f}",
                  f"- wall-clock: {last.get('wall_time', 0.0):.1f} s", ""]
    lines += _warning_lines(records)
    if run_info:
        lines += _run_lines(run_info)
    text = "\n".join(lines).rstrip("\n") + "\n"
    Path(out_path).write_text(text)
    return text
