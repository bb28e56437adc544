"""The staleness study's margin and number of seeds, computed exactly as experiments/protocol.md fixes them.

The rule is ``experiments.lib.study.protocol_power``, applied to the frozen main job's committed runs.

    python -m experiments.protocol_power            # prints G, m, σ_d, n and whether the study runs
    python -m experiments.protocol_power --json     # the same numbers as one JSON object
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from experiments.lib.study import MAIN_JOB, MAX_SEEDS, SEEDS, protocol_power


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
