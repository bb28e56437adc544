"""The study's reproducibility check (experiments/protocol.md): re-run committed (cell, seed) runs and compare.

Each run is made again at the current commit, with the overrides its ``grid.json`` recorded, into
``experiments/results/study/reproducibility/<data>/<cell>/seed<s>/``, compacted as the study's runs are (so its
records can be committed and checked by anyone), and compared with the committed original: every metrics record
with the fields that measure time left out, and the evaluation traces byte for byte. A re-run already finished there
is not made again. The result goes to ``experiments/results/study/reproducibility.json``, which ``study_report.py``
prints.

    python -m experiments.study_reproduce                       # the protocol's check: seeds 100-103 of sync, async-G4
    python -m experiments.study_reproduce --jobs 2              # the same, the runs split over two processes
    python -m experiments.study_reproduce --check               # no runs: diff the committed re-runs with the originals
    python -m experiments.study_reproduce --cells sync --seeds 100 --reruns /tmp/r --out /tmp/check.json
    python -m experiments.study_reproduce --merge a.json b.json # one result from parts made at one commit
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from esjax.rundir.metrics import read_metrics, untimed
from experiments.lib import REPO
from experiments.lib.grid import DATASETS, all_cells, run_cell
from experiments.lib.records import compact_run
from experiments.lib.study import DATA, RECORDS, REPRODUCIBILITY, RERUNS


def untimed_records(run_dir: Path) -> list[dict]:
    return untimed(read_metrics(run_dir / "metrics.jsonl"))


def traces(run_dir: Path) -> dict[str, bytes]:
    """Evaluation traces by name, decompressed (gzip headers carry no time, but compare content anyway)."""
    out = {}
    for path in sorted((run_dir / "traces").glob("*.jsonl*")):
        data = path.read_bytes()
        out[path.name.removesuffix(".gz")] = gzip.decompress(data) if path.suffix == ".gz" else data
    return out


def differences(committed: Path, fresh: Path) -> list[str]:
    """What differs between a committed run and its re-run (empty: bit for bit, timing aside)."""
    found = []
    a, b = untimed_records(committed), untimed_records(fresh)
    if len(a) != len(b):
        found.append(f"{len(a)} committed records, {len(b)} re-run records")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            found.append(f"record {i} ({x.get('kind')} v{x.get('version')}) differs in {', '.join(keys)}")
            break
    ta, tb = traces(committed), traces(fresh)
    changed = sorted(name for name in set(ta) | set(tb) if ta.get(name) != tb.get(name))
    if changed:
        found.append(f"traces differ: {', '.join(changed)}")
    return found


def reproduce(cell_name: str, seed: int, reruns: Path = RERUNS, records: Path = RECORDS, data: str = DATA) -> list[str]:
    """Re-run one committed (cell, seed) with its recorded overrides into ``reruns`` (kept, compacted; a finished
    re-run there is kept as it is) and compare."""
    committed = records / data / cell_name / f"seed{seed}"
    run_dir = reruns / data / cell_name / f"seed{seed}"
    if not (run_dir / "summary.md").is_file():
        grid = json.loads((committed / "grid.json").read_text())
        cell = next(c for c in all_cells() if c.name == cell_name)
        run_cell(cell, seed, run_dir, DATASETS[data], grid["overrides"])
        compact_run(run_dir)
    return differences(committed, run_dir)


def rerun_commit(run_dir: Path) -> str:
    """The commit a re-run was made at (its run.json)."""
    return (json.loads((run_dir / "run.json").read_text()).get("git_commit") or "unknown")[:7]


def check(reruns: Path = RERUNS, records: Path = RECORDS, data: str = DATA) -> dict:
    """The result from the kept re-runs alone (nothing is run): each against its committed original."""
    run_dirs = sorted((reruns / data).glob("*/seed*/summary.md"))
    if not run_dirs:
        raise SystemExit(f"--check: no finished re-run under {reruns / data}")
    lines, commits = [], set()
    for marker in run_dirs:
        run_dir = marker.parent
        cell, seed = run_dir.parent.name, int(run_dir.name.removeprefix("seed"))
        diff = differences(records / data / cell / run_dir.name, run_dir)
        lines.append(f"{cell} seed {seed}: " + ("; ".join(diff) if diff else IDENTICAL))
        commits.add(rerun_commit(run_dir))
    return result(", ".join(sorted(commits)), lines)


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


IDENTICAL = "bit-identical (timing fields aside)"


def result(commit: str, runs: list[str]) -> dict:
    """The result file's content: a headline, then one line per re-run (``"<cell> seed <s>: <outcome>"``)."""
    identical = sum(line.endswith(": " + IDENTICAL) for line in runs)
    head = f"At {commit}: {identical} of {len(runs)} re-runs identical to their committed records."
    return {"commit": commit, "lines": [head, *runs]}


def merge(parts: list[Path]) -> dict:
    """One result from parts made by separate processes; they must come from one commit."""
    loaded = [json.loads(p.read_text()) for p in parts]
    commits = {part["commit"] for part in loaded}
    if len(commits) != 1:
        raise SystemExit(f"--merge: the parts come from different commits ({', '.join(sorted(commits))})")
    return result(commits.pop(), [line for part in loaded for line in part["lines"][1:]])


def _in_parallel(cells: list[str], seeds: list[int], jobs: int, reruns: Path) -> dict:
    """Split the re-runs over ``jobs`` processes of this script, started as this one was (by cell, or by seed when
    there are fewer cells), one part file each, then merge the parts."""
    split = ([(cells[j::jobs], seeds) for j in range(jobs)] if len(cells) >= jobs
             else [(cells, seeds[j::jobs]) for j in range(min(jobs, len(seeds)))])
    with tempfile.TemporaryDirectory() as tmp:
        parts = [Path(tmp) / f"part{j}.json" for j in range(len(split))]
        script = ["-m", __spec__.name] if __spec__ else [__file__]
        procs = [subprocess.Popen([sys.executable, *script, "--cells", ",".join(c), "--seeds", ",".join(map(str, s)),
                                   "--reruns", str(reruns), "--out", str(part)]) for (c, s), part in zip(split, parts)]
        codes = [p.wait() for p in procs]
        if any(code not in (0, 1) for code in codes):  # 1: a difference found, which the merged result reports
            raise SystemExit(f"a re-run process failed (exit codes {codes})")
        return merge(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="sync,async-G4")
    parser.add_argument("--seeds", default="100,101,102,103")
    parser.add_argument("--out", type=Path, default=REPRODUCIBILITY)
    parser.add_argument("--jobs", type=int, default=1, help="processes to split the re-runs over (by cell)")
    parser.add_argument("--merge", type=Path, nargs="+", help="write one result from these part files instead")
    parser.add_argument("--reruns", type=Path, default=RERUNS, help="where the re-runs' records are kept")
    parser.add_argument("--check", action="store_true", help="run nothing: compare the kept re-runs with the originals")
    args = parser.parse_args(argv)
    cells, seeds = args.cells.split(","), [int(s) for s in args.seeds.split(",")]
    if args.check:
        out = check(args.reruns)
        print("\n".join(out["lines"][1:]))
    elif args.merge:
        out = merge(args.merge)
    elif args.jobs > 1:
        out = _in_parallel(cells, seeds, args.jobs, args.reruns)
    else:
        runs = []
        for cell in cells:
            for seed in seeds:
                diff = reproduce(cell, seed, args.reruns)
                runs.append(f"{cell} seed {seed}: " + ("; ".join(diff) if diff else IDENTICAL))
                print(runs[-1], flush=True)
        out = result(_commit(), runs)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(out["lines"][0])
    return 0 if all(line.endswith(": " + IDENTICAL) for line in out["lines"][1:]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
