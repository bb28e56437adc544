"""The pre-registered staleness study's report (experiments/protocol.md), from its committed records alone.

``experiments/results/staleness.md`` is this module's output and nothing else's: the records under
``experiments/results/study/webshop_small/`` (each finished run's config.yaml, metrics.jsonl, summary.md, grid.json)
and the margin and n that ``experiments.lib.study.protocol_power`` computes from the main job's committed runs. It
follows the protocol's rules, not the data:

* **no interim looks**: a family's effect sizes, intervals and verdicts are computed only once sync and every cell
  of the family have all n seeds (100 … 100 + n − 1); before that the report shows how many runs are finished and
  nothing measured from them;
* the secondary family is analysed only after the primary one is complete;
* TOST at the protocol's margin, Holm within each family, separately per endpoint
  (``experiments.lib.runs.compare_with_sync`` on the family's cells alone);
* the deviations from the protocol are listed first (``DEVIATIONS``, written down as they happen);
* the figure (``staleness_study.png``: held-out curves, and each seed's paired Δ against the margin) exists only
  for a complete primary family, like the numbers.

    python -m experiments.study_report            # rewrites experiments/results/staleness.md (+ its figure)
    python -m experiments.study_report --check    # exit 1 if the committed file differs from a fresh render
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from esjax.rundir.stats import mean_interval
from experiments.lib import REPO, RESULTS
from experiments.lib.figures import write_study_figure
from experiments.lib.published import published_table
from experiments.lib.runs import ENDPOINTS, GridScan, compare_with_sync, scan_grid
from experiments.lib.study import (
    ALPHA,
    DATA,
    FAMILIES,
    MAX_SEEDS,
    RECORDS,
    REPRODUCIBILITY,
    STUDY_COMMIT,
    Power,
    expected_seeds,
    family_complete,
    protocol_power,
)

OUT = RESULTS / "staleness.md"
FIGURE = OUT.with_name("staleness_study.png")
#: The command the report states (the form the committed report has always shown; ``python -m
#: experiments.staleness_grid`` runs the same).
COMMAND = "python experiments/staleness_grid.py --preset real --cells {cells} --first-seed 100 --seeds {n} --jobs 2"

#: Every departure from experiments/protocol.md, in the order it happened (the protocol asks for this list).
DEVIATIONS = (
    "The protocol's setting names N = 16 (the main job's population when it was written). Issue 31 froze the main "
    "job at N = 32 (32 rollout slots), and the protocol's first rule is that setting, so every cell runs with "
    "N = 32: async-G4 has 4 rollout slots for 32 members, delay4 / delay8 keep 4 of 32 members late (the same "
    "12.5% share as 2 of 16).",
    "Issue 31 was marked resolved in the session that started the runs (its resolution takes effect when that "
    "session ends); every Done-means item of it had been measured and CI had passed before the first run.",
    "The study's runs span several sessions (the protocol allows it); each session restarted the shard processes, "
    "and a run cut by a session's end resumed from its last checkpoint (resume is bit-identical, tested). For the "
    "last seeds the split changed from seed parity over 100–123 to balance the two cores: seeds 117 and 119 in one "
    "process, 121 and 123 in another started when the even-seed process ended after seed 122 (at most two "
    "processes at once, all cells of a seed in one process, as the protocol asks); async-G4 seed 117 was stopped "
    "minutes after it started for this and resumed.",
    "The reproducibility check ran beside the study's last runs, not after them, at 083a1cc: the commit at which "
    "the check started, whose code (esjax/, envs/, configs/, experiments/staleness_grid.py and records.py) is the "
    "final commit's; later commits add only run records, this report and tests. Its eight re-runs were niced so "
    "the study's own runs kept the cores, and went as three processes (sync 100–103; async-G4 100–102; async-G4 "
    "103, started near the end to finish within the session) whose lines were merged (`study_reproduce.py "
    "--merge`; the async-G4 100–102 process was stopped before its redundant seed 103, its three lines taken from "
    "its log).",
)


def run_commit(run: dict) -> str:
    """The commit a finished run was made at, from its run.json ('?' if not recorded)."""
    try:
        return json.loads((run["dir"] / "run.json").read_text()).get("git_commit") or "?"
    except (OSError, ValueError):
        return "?"


def _progress_table(scan: GridScan, seeds: list[int]) -> list[str]:
    lines = ["| cell | family | finished runs (of n) | failed | unfinished or excluded | at another commit |",
             "|---|---|---|---|---|---|"]
    family_of = {name: family for family, names in FAMILIES.items() for name in names} | {"sync": "both (reference)"}
    for name in ("sync", *FAMILIES["primary"], *FAMILIES["secondary"]):
        done = sorted(r["seed"] for r in scan.grid.get(name, []) if r["seed"] in seeds)
        failed = sorted(s for c, s, _ in scan.failed if c == name)
        other = sorted([s for c, s in scan.unfinished if c == name] + [s for c, s, _ in scan.excluded if c == name])
        elsewhere = sorted(r["seed"] for r in scan.grid.get(name, [])
                           if r["seed"] in seeds and not run_commit(r).startswith(STUDY_COMMIT))
        lines.append(f"| {name} | {family_of[name]} | {len(done)} / {len(seeds)} | "
                     f"{', '.join(map(str, failed)) or '—'} | {', '.join(map(str, other)) or '—'} | "
                     f"{', '.join(map(str, elsewhere)) or '—'} |")
    return lines


def _family_section(grid: dict[str, list[dict]], cells: tuple[str, ...], seeds: list[int], margin: float) -> list[str]:
    """Verdicts of one complete family: TOST + Holm over its cells, per endpoint, on the protocol's seeds only."""
    subset = {name: [r for r in grid[name] if r["seed"] in seeds] for name in ("sync", *cells)}
    sync_gain = mean_interval([r["final"] - r["initial"] for r in subset["sync"]])
    lines = [f"Sync gains {sync_gain[0]:+.2f} points (95% CI [{sync_gain[1]:+.2f}, {sync_gain[2]:+.2f}]) on the "
             f"final score over its {len(seeds)} seeds.", "",
             "| cell | endpoint | stale share | Δ vs sync (mean) | 95% CI | 90% CI | Holm TOST p | Holm p (Δ = 0) | "
             "retained share of sync's gain | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, label in ENDPOINTS.items():
        tests = compare_with_sync(subset, key, margin, ALPHA)
        for name in cells:
            t = tests[name]
            stale = sum(r["stale_fraction"] for r in subset[name]) / len(subset[name])
            retained = "—"
            if key == "final" and sync_gain[0] > 0:  # 1 + Δ / G, the interval from Δ's with G held fixed
                retained = (f"{1 + t['mean'] / sync_gain[0]:.0%} "
                            f"[{1 + t['low95'] / sync_gain[0]:.0%}, {1 + t['high95'] / sync_gain[0]:.0%}]")
            lines.append(f"| {name} | {label} | {stale:.2f} | {t['mean']:+.2f} | [{t['low95']:+.2f}, "
                         f"{t['high95']:+.2f}] | [{t['low90']:+.2f}, {t['high90']:+.2f}] | {t['p_tost_holm']:.3g} | "
                         f"{t['p_diff_holm']:.3g} | {retained} | {t['verdict']} (m = {margin:g}) |")
    return lines


def _reproducibility() -> list[str]:
    if not REPRODUCIBILITY.is_file():
        return ["Not run yet: it follows the last run of the study (seeds 100–103 of sync and async-G4 re-run at the "
                "final commit, compared with their committed records)."]
    result = json.loads(REPRODUCIBILITY.read_text())
    return [f"- {line}" for line in result.get("lines", [])] or ["(empty result file)"]


def render(records: Path = RECORDS, power: Power | None = None) -> str:
    power = power or protocol_power()
    scan = scan_grid(records, DATA)
    lines = ["# The staleness study, pre-registered (issue 32)", "",
             "Generated by `python experiments/study_report.py` from the committed records under "
             "`experiments/results/study/` alone; the rules are [experiments/protocol.md](../protocol.md).", "",
             "## Deviations from the protocol", ""]
    lines += [f"{i}. {text}" for i, text in enumerate(DEVIATIONS, 1)] or ["None."]
    lines += ["", "## Margin and seeds (the protocol's rule on issue 31's frozen main job)", "",
              f"Main job, seeds 0–7 on the test split: gain G = {power.gain:.2f}, margin m = 0.35 × G rounded down "
              f"= **{power.margin:g} points**; SD of the final scores {power.final_sd:.2f}, its 80% upper bound "
              f"{power.final_sd_upper:.2f}, σ_d = {power.sigma_d:.2f} → n = **{power.n}** seeds per cell "
              f"(`python experiments/protocol_power.py`)."]
    if not power.feasible:
        lines += ["", f"n exceeds {MAX_SEEDS}: by the protocol the study is **not run** on this "
                      "setting, and no verdict is reported."]
        return "\n".join(lines) + "\n"
    seeds = expected_seeds(power.n)
    lines += ["", f"Seeds {seeds[0]}–{seeds[-1]}, every run at commit {STUDY_COMMIT} (checked from each `run.json` "
              f"below). Command: `{COMMAND.format(cells=','.join(('sync', *FAMILIES['primary'])), n=power.n)}`.", "",
              "## Progress", ""]
    lines += _progress_table(scan, seeds)
    primary_done = family_complete(scan.grid, FAMILIES["primary"], seeds)
    for family, cells in FAMILIES.items():
        lines += ["", f"## {family.capitalize()} family: {', '.join(cells)} (Holm over {len(cells)})", ""]
        if family == "secondary" and not primary_done:
            lines.append("Not analysed: the protocol runs it only after the primary family is complete.")
        elif not any(scan.grid.get(name) for name in cells):
            lines.append(f"Not run: no run of {', '.join(cells)} exists yet (sync's are shared; the command: "
                         f"`{COMMAND.format(cells=','.join(cells), n=power.n)}`).")
        elif not family_complete(scan.grid, cells, seeds):
            lines.append(f"Incomplete: **no verdict and no effect size** until sync and every cell have all "
                         f"{power.n} seeds (the protocol allows no interim look).")
        else:
            lines += _family_section(scan.grid, cells, seeds, power.margin)
            if family == "primary":
                lines += ["", f"![held-out curves and paired differences]({FIGURE.name}) "
                              "(`staleness_study.png`: left, the mean held-out curve per cell, band ±1 SD over the "
                              "seeds; right, each seed's Δ final score against sync, the mean with its 90% CI, and "
                              "the margin)"]
    lines += ["", "## Reproducibility check", ""] + _reproducibility()
    lines += ["", "## The published numbers (theirs, not ours)", ""] + published_table()
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = parser.parse_args(argv)
    power = protocol_power()
    text = render(power=power)
    if not args.check:
        scan, seeds = scan_grid(RECORDS, DATA), expected_seeds(power.n)
        if power.feasible and family_complete(scan.grid, FAMILIES["primary"], seeds):
            figure = write_study_figure(scan.grid, FAMILIES["primary"], seeds, power.margin, FIGURE)
            print(f"wrote {figure.relative_to(REPO)}")
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.relative_to(REPO)} {'is' if same else 'is NOT'} what the records give")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
