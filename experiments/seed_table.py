"""Per-seed table of a config's runs on the test split: before / mid / after, Δ, success, wall time, and the mean Δ
with its paired 95% t interval (what README's main-job table and issue 31's Done-means report), and the machine the
runs ran on, from each run's run.json (its start and every resume): a machine named in README or the results is
the one the records name.

    python -m experiments.seed_table experiments/results/full-weights      # reads <dir>/seed<s>/, compacts them
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from esjax.rundir.stats import mean_interval
from experiments.lib.records import compact_run
from experiments.lib.runs import machines_of


def _wall_seconds(summary: str) -> float | None:
    found = re.search(r"wall-clock: ([0-9.]+) s", summary)
    return float(found.group(1)) if found else None


def steps_per_episode(run_dir: Path) -> tuple[float, float] | None:
    """Mean env steps per episode at the first and the last evaluation, from the run's traces (None without them)."""
    from esjax.rundir.traces import first_and_last_traces

    traces = first_and_last_traces(run_dir / "traces")
    if not traces:
        return None
    means = [float(np.mean([line["steps"] for line in traces[v]])) for v in sorted(traces)]
    return means[0], means[-1]


def seed_rows(root: Path) -> list[dict]:
    from esjax.rundir.metrics import read_metrics

    rows = []
    for run_dir in sorted(root.glob("seed*"), key=lambda p: int(p.name[4:])):
        if not (run_dir / "summary.md").is_file():
            continue  # unfinished: listed by the caller, never counted
        evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
        info = json.loads((run_dir / "run.json").read_text())
        rows.append({"seed": int(run_dir.name[4:]), "scores": [e["score"] for e in evals],
                     "success": (evals[0]["success_rate"], evals[-1]["success_rate"]),
                     "wall": _wall_seconds((run_dir / "summary.md").read_text()),
                     "commit": (info.get("git_commit") or "?")[:7], "machines": machines_of(info),
                     "steps": steps_per_episode(run_dir)})
        compact_run(run_dir)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| seed | before | mid | after | Δ | success before → after | steps / episode before → after | wall | "
             "commit |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["scores"]
        wall = "?" if r["wall"] is None else f"{r['wall'] / 60:.1f} min"
        lines.append(f"| {r['seed']} | {s[0]:.1f} | {s[len(s) // 2]:.1f} | {s[-1]:.1f} | **{s[-1] - s[0]:+.1f}** | "
                     f"{100 * r['success'][0]:.1f}% → {100 * r['success'][1]:.1f}% | {_pair(r['steps'])} | {wall} | "
                     f"{r['commit']} |")
    deltas = [r["scores"][-1] - r["scores"][0] for r in rows]
    if len(deltas) >= 2:
        mean, low, high = mean_interval(deltas)
        seeds = ", ".join(str(r["seed"]) for r in rows)
        before, after = np.mean([r["scores"][0] for r in rows]), np.mean([r["scores"][-1] for r in rows])
        success = [r["success"][1] - r["success"][0] for r in rows]
        s_mean, s_low, s_high = mean_interval([100 * d for d in success])
        steps = [r["steps"] for r in rows if r["steps"] is not None]
        steps_text = (f"; steps per episode {np.mean([a for a, _ in steps]):.1f} → {np.mean([b for _, b in steps]):.1f}"
                      if len(steps) == len(rows) else "")
        lines += ["", f"{len(rows)} seeds ({seeds}): mean Δ **{mean:+.1f}**, paired 95% t interval "
                      f"**[{low:+.1f}, {high:+.1f}]** (SD {np.std(deltas, ddof=1):.1f}); mean score {before:.1f} → "
                      f"{after:.1f}; success rate Δ {s_mean:+.1f} points [{s_low:+.1f}, {s_high:+.1f}]{steps_text}."]
    lines += ["", machine_line(rows)]
    return "\n".join(lines) + "\n"


def _pair(steps: tuple[float, float] | None) -> str:
    return "?" if steps is None else f"{steps[0]:.1f} → {steps[1]:.1f}"


def machine_line(rows: list[dict]) -> str:
    """Which machine ran how many of the runs, from their run.json."""
    counts: dict[str, int] = {}
    for r in rows:
        for machine in dict.fromkeys(r.get("machines") or ["not recorded"]):
            counts[machine] = counts.get(machine, 0) + 1
    parts = [f"{m} ({n} of {len(rows)} runs)" if len(counts) > 1 or n != len(rows) else f"{m} (all {n} runs)"
             for m, n in counts.items()]
    return f"Machine (each run's run.json, resumes included): {'; '.join(parts)}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    print(table(seed_rows(args.root)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
