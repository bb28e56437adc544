"""Issue 36's evidence: ``configs/generate.yaml`` as shipped, on seeds fixed before any of these runs.

Each (cell, seed) is one ``python -m esjax.run --config configs/generate.yaml --set run.seed=S`` in its own process
(its wall time and peak RSS measured with ``os.wait4``), greedy evaluation on WebShop's 500 test goals before,
midway and after. Cells: ``async-K1`` (the config as shipped: natural asynchrony, K = 1) and ``sync`` (the same
with a barrier), paired by seed: the sync vs async pair is exploratory (5 seeds, no margin fixed), not a verdict.

Finished runs are compacted into ``experiments/results/generate/seeds/<cell>/seed<S>/`` (config, run.json,
metrics, summary, gzipped traces, ``behaviour.json``, ``resources.json`` last); a run whose ``resources.json`` is
there is done, so the runs can span sessions. ``generate_seeds.md`` is regenerated from those records alone.

    python -m experiments.generate_seeds --cells async-K1            # the 5 seeds of the shipped config
    python -m experiments.generate_seeds --cells sync,async-K1       # and the exploratory pair
    python -m experiments.generate_seeds --report                    # regenerate generate_seeds.md only
    python -m experiments.generate_seeds --check                     # it matches the committed records
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from esjax.rundir.stats import mean_interval
from experiments.lib import REPO, RESULTS
from experiments.lib.records import compact_run

CONFIG = REPO / "configs" / "generate.yaml"
OUT = RESULTS / "generate" / "seeds"
REPORT = RESULTS / "generate_seeds.md"
#: Fixed on 5 Dec 2026 before any run of this script; never used to choose a setting (trials used seed 0 on the
#: eval split). Never add seeds after looking.
SEEDS = (200, 201, 202, 203, 204)
CELLS: dict[str, list[str]] = {"async-K1": [], "sync": ["schedule.kind=sync"]}
COMMON = ["run.progress=false", "run.plots=false"]
#: (key of behaviour.json, label, format) for the report's behaviour table.
BEHAVIOUR = (("invalid_action_rate", "invalid actions / actions", "{:.1%}"),
             ("searches_per_episode", "searches / episode", "{:.2f}"),
             ("item_pages_per_episode", "product clicks / episode (valid or not)", "{:.2f}"),
             ("option_clicks_per_item_page", "option clicks / product click", "{:.2f}"),
             ("option_clicks_named_in_instruction", "option clicks the instruction names", "{:.0%}"),
             ("bought", "episodes that bought", "{:.0%}"),
             ("bought_without_option_click", "purchases without an option click", "{:.0%}"),
             ("reward_of_buys_with_option_click", "reward of purchases with an option click", "{:.3f}"),
             ("reward_of_buys_without_option_click", "reward of purchases without one", "{:.3f}"),
             ("step_cap_hits", "step-cap hits", "{:.1%}"),
             ("steps_per_episode", "steps / episode", "{:.2f}"))


def run_dir(cell: str, seed: int, out: Path = OUT) -> Path:
    return out / cell / f"seed{seed}"


def is_done(path: Path) -> bool:
    return (path / "resources.json").is_file()


def eval_behaviour(path: Path) -> dict[str, dict]:
    """Per evaluation version: the invalid-action rate (invalid actions / actions taken, from the eval record and
    its traces) and :func:`envs.webshop_bridge.behaviour.behaviour` of its greedy episodes."""
    from envs.webshop_bridge.behaviour import behaviour
    from esjax.rundir.metrics import read_metrics
    from esjax.rundir.traces import read_traces

    invalid = {r["version"]: r["invalid_actions"] for r in read_metrics(path / "metrics.jsonl") if r["kind"] == "eval"}
    out = {}
    for version, count in sorted(invalid.items()):
        lines = read_traces(path / "traces" / f"eval-v{version}.jsonl")
        steps = sum(int(line["steps"]) for line in lines)
        out[str(version)] = {"invalid_action_rate": count / max(steps, 1), **behaviour(lines)}
    return out


def run_one(cell: str, seed: int, out: Path = OUT, extra: tuple[str, ...] = ()) -> dict:
    """One run in a child process; its records compacted into ``run_dir(cell, seed)``. ``extra``: overrides
    after the cell's (tests shrink the run with them; the evidence runs use none)."""
    path = run_dir(cell, seed, out)
    if path.exists():  # a run interrupted before it finished starts over (the records must come from one process)
        import shutil

        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sets = [*CELLS[cell], *COMMON, f"run.seed={seed}", *extra]
    argv = [sys.executable, "-m", "esjax.run", "--config", str(CONFIG), *(a for s in sets for a in ("--set", s)),
            "--run-dir", str(path)]
    started, load = time.perf_counter(), os.getloadavg()[0]
    with open(path.parent / f"seed{seed}.log", "w") as log:
        child = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cell} seed {seed} failed: see {path.parent / f'seed{seed}.log'}")
    (path / "behaviour.json").write_text(json.dumps(eval_behaviour(path), indent=1) + "\n")
    compact_run(path)
    (path.parent / f"seed{seed}.log").unlink()
    resources = {"cell": cell, "seed": seed, "seconds": seconds, "max_rss_mb": usage.ru_maxrss / 1024,
                 "load_at_start": load, "overrides": sets}
    (path / "resources.json").write_text(json.dumps(resources, indent=1) + "\n")
    return resources


def collect(out: Path = OUT) -> dict[str, list[dict]]:
    """Every finished run under ``out``, by cell: the three evaluations, behaviour and resources."""
    from esjax.rundir.metrics import read_metrics

    found: dict[str, list[dict]] = {}
    for marker in sorted(out.glob("*/seed*/resources.json")):
        path = marker.parent
        resources = json.loads(marker.read_text())
        evals = [r for r in read_metrics(path / "metrics.jsonl") if r["kind"] == "eval"]
        info = json.loads((path / "run.json").read_text())
        found.setdefault(resources["cell"], []).append({
            **resources, "evals": evals, "behaviour": json.loads((path / "behaviour.json").read_text()),
            "commit": (info.get("git_commit") or "?")[:7]})
    return found


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def report(out: Path = OUT) -> str:
    """generate_seeds.md, from the records under ``out`` alone."""
    found = collect(out)
    lines = ["# configs/generate.yaml on seeds fixed before the runs (issue 36)", "",
             "Generated by `python experiments/generate_seeds.py --report` from the records in "
             "[generate/seeds/](generate/seeds/); greedy scores on WebShop's 500 test goals. Seeds "
             f"{', '.join(map(str, SEEDS))} were fixed before any run; every finished run is listed. Wall time is "
             "comparable only between runs alone on the 2-core machine: the load shown is the one-minute load when "
             "the run started, and a run that started alone may have shared the CPU later.", ""]
    for cell in [c for c in CELLS if c in found]:
        runs = sorted(found[cell], key=lambda r: r["seed"])
        lines += [f"## {cell}", "", "| seed | before | mid (version) | after | Δ | success before → after | "
                  "invalid actions before → after | wall (min) | load at start | peak RSS (MB) | commit |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        deltas = []
        for r in runs:
            first, last = r["evals"][0], r["evals"][-1]
            mids = r["evals"][1:-1]
            mid = f"{mids[0]['score']:.1f} (v{mids[0]['version']})" if mids else "—"
            b0, b1 = r["behaviour"][str(first["version"])], r["behaviour"][str(last["version"])]
            deltas.append(last["score"] - first["score"])
            lines.append(f"| {r['seed']} | {first['score']:.1f} | {mid} | {last['score']:.1f} | {deltas[-1]:+.1f} | "
                         f"{_pct(first['success_rate'])} → {_pct(last['success_rate'])} | "
                         f"{_pct(b0['invalid_action_rate'])} → {_pct(b1['invalid_action_rate'])} | "
                         f"{r['seconds'] / 60:.1f} | {r['load_at_start']:.1f} | {r['max_rss_mb']:.0f} | "
                         f"{r['commit']} |")
        mean, low, high = mean_interval(deltas)
        ci = f"95% CI [{low:+.1f}, {high:+.1f}]" if len(deltas) > 1 else "one seed: no interval"
        missing = [s for s in SEEDS if s not in {r["seed"] for r in runs}]
        lines += ["", f"Paired mean Δ (after − before) over {len(deltas)} seeds: **{mean:+.1f}**, {ci}."
                  + (f" Not yet run: seeds {', '.join(map(str, missing))}." if missing else ""), "",
                  "What the greedy agent wrote (evaluation traces, mean over the seeds):", "",
                  "| | before | after |", "|---|---|---|"]
        for key, label, fmt in BEHAVIOUR:
            # a mean reward of purchases of one kind is None in a run without such a purchase
            values = [[v for r in runs if (v := r["behaviour"][str(r["evals"][i]["version"])].get(key)) is not None]
                      for i in (0, -1)]
            cells = [fmt.format(np.mean(v)) if v else "—" for v in values]
            lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
        lines.append("")
    if {"sync", "async-K1"} <= set(found):
        sync = {r["seed"]: r for r in found["sync"]}
        pairs = [(r["evals"][-1]["score"] - r["evals"][0]["score"])
                 - (sync[r["seed"]]["evals"][-1]["score"] - sync[r["seed"]]["evals"][0]["score"])
                 for r in found["async-K1"] if r["seed"] in sync]
        mean, low, high = mean_interval(pairs)
        ci = f"[{low:+.2f}, {high:+.2f}]" if len(pairs) > 1 else "(one pair)"
        lines += ["## sync vs async-K1 (exploratory)", "",
                  f"Gain of async-K1 minus gain of sync, paired by seed over {len(pairs)} seeds: **{mean + 0.0:+.2f}** "
                  f"points, 95% t CI {ci}. Exploratory: no equivalence margin was fixed before these runs, so no "
                  "equivalence is claimed; this is a first look at the study's question for an agent that writes "
                  "its actions, not a verdict. Wall times are not compared: the runs shared the CPU unevenly and "
                  "later ones found XLA's compilation cache warm.", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default="async-K1", help=f"comma-separated, of {', '.join(CELLS)}")
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="a subset of the fixed seeds")
    p.add_argument("--report", action="store_true", help="only regenerate generate_seeds.md")
    p.add_argument("--check", action="store_true", help="exit 1 unless generate_seeds.md matches the records")
    args = p.parse_args(argv)
    if args.check:
        same = REPORT.is_file() and REPORT.read_text() == report()
        print("generate_seeds.md matches the records" if same else "generate_seeds.md is stale: run --report")
        return 0 if same else 1
    if not args.report:
        cells, seeds = args.cells.split(","), [int(s) for s in args.seeds.split(",")]
        unknown = [c for c in cells if c not in CELLS] + [str(s) for s in seeds if s not in SEEDS]
        if unknown:
            p.error(f"not a cell or not a fixed seed: {', '.join(unknown)}")
        for seed in seeds:  # interleaved: seed by seed, every cell
            for cell in cells:
                if not is_done(run_dir(cell, seed)):
                    print(json.dumps(run_one(cell, seed)), flush=True)
    REPORT.write_text(report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
