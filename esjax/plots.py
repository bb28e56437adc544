"""PNG plots and ``summary.md`` of a finished run, drawn from its ``metrics.jsonl``.

Record kinds: ``update`` (one per ES update: version, wall_time, fitness_mean, lags, slot_utilization, ...)
and ``eval`` (version, wall_time, score, success_rate).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402


def _series(records: list[dict[str, Any]], kind: str, key: str, x: str = "version") -> tuple[list, list]:
    rows = [r for r in records if r.get("kind") == kind and r.get(key) is not None and r.get(x) is not None]
    return [r[x] for r in rows], [r[key] for r in rows]


def lag_counts(records: list[dict[str, Any]]) -> Counter:
    """Histogram of accepted lags over the whole run."""
    counts: Counter = Counter()
    for record in records:
        if record.get("kind") == "update":
            for lag, count in (record.get("lag_hist") or {}).items():
                counts[int(lag)] += int(count)
    return counts


def write_plots(records: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write the run's figures into ``out_dir`` and return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, x, label in ((axes[0], "version", "ES updates"), (axes[1], "wall_time", "wall-clock (s)")):
        xs, ys = _series(records, "eval", "score", x)
        ax.plot(xs, ys, "o-", label="held-out eval score")
        xs, ys = _series(records, "update", "fitness_mean", x)
        ax.plot(xs, [100 * y for y in ys], "-", alpha=0.7, label="training fitness ×100 (cohort mean)")
        ax.set_xlabel(label)
        ax.set_ylabel("score (100 × mean reward)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "score.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    counts = lag_counts(records)
    lags = sorted(counts) or [0]
    axes[0].bar(lags, [counts.get(lag, 0) for lag in lags])
    axes[0].set_xlabel("lag of accepted fitness (updates)")
    axes[0].set_ylabel("members")
    axes[0].set_title("lag histogram")
    xs, ys = _series(records, "update", "slot_utilization")
    axes[1].plot(xs, ys, "-")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_xlabel("ES updates")
    axes[1].set_ylabel("busy slots / slots")
    axes[1].set_title("slot utilization")
    fig.tight_layout()
    paths.append(out_dir / "staleness.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


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
    return ["## Warnings", "", *lines, ""] if lines else []


def write_summary(records: list[dict[str, Any]], out_path: str | Path, title: str,
                  run_info: dict[str, Any] | None = None) -> str:
    """A short markdown summary: before/after eval, updates, acceptance, staleness, warnings, and (from
    ``run_info``, the run's run.json) the commit, overrides and machine."""
    evals = [r for r in records if r.get("kind") == "eval"]
    updates = [r for r in records if r.get("kind") == "update"]
    lines = [f"# {title}", ""]
    if evals:
        first, last = evals[0], evals[-1]
        lines += ["| | version | score | success rate |", "|---|---|---|---|",
                  f"| before | {first['version']} | {first['score']:.1f} | {100 * first['success_rate']:.1f}% |",
                  f"| after | {last['version']} | {last['score']:.1f} | {100 * last['success_rate']:.1f}% |",
                  "", f"Δ score: {last['score'] - first['score']:+.1f} on {last.get('goals', '?')} held-out goals.", ""]
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
