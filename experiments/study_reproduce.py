"""The study's reproducibility check (experiments/protocol.md): re-run committed (cell, seed) runs and compare.

Each run is made again at the current commit into a scratch directory, with the overrides its ``grid.json``
recorded, and compared with its committed records: every metrics record with the fields that measure time left
out, and the evaluation traces byte for byte. The result goes to
``experiments/results/study/reproducibility.json``, which ``study_report.py`` prints.

    python experiments/study_reproduce.py                       # the protocol's check: seeds 100-103 of sync, async-G4
    python experiments/study_reproduce.py --cells sync --seeds 100 --out /tmp/check.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from esjax.rundir.metrics import read_metrics, untimed  # noqa: E402
from experiments import staleness_grid  # noqa: E402
from experiments.study_report import DATA, RECORDS, REPRODUCIBILITY  # noqa: E402


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


def reproduce(cell_name: str, seed: int, scratch: Path, records: Path = RECORDS, data: str = DATA) -> list[str]:
    """Re-run one committed (cell, seed) with its recorded overrides into ``scratch`` and compare."""
    committed = records / data / cell_name / f"seed{seed}"
    grid = json.loads((committed / "grid.json").read_text())
    cell = next(c for c in staleness_grid.all_cells() if c.name == cell_name)
    run_dir = scratch / cell_name / f"seed{seed}"
    staleness_grid.run_cell(cell, seed, run_dir, staleness_grid.DATASETS[data], grid["overrides"])
    staleness_grid.compact_run(run_dir)
    return differences(committed, run_dir)


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="sync,async-G4")
    parser.add_argument("--seeds", default="100,101,102,103")
    parser.add_argument("--out", type=Path, default=REPRODUCIBILITY)
    args = parser.parse_args(argv)
    lines, identical = [], 0
    with tempfile.TemporaryDirectory() as scratch:
        for cell in args.cells.split(","):
            for seed in map(int, args.seeds.split(",")):
                diff = reproduce(cell, seed, Path(scratch))
                identical += not diff
                lines.append(f"{cell} seed {seed}: " + ("bit-identical (timing fields aside)" if not diff
                                                         else "; ".join(diff)))
                print(lines[-1], flush=True)
    total = len(lines)
    lines.insert(0, f"At {_commit()}: {identical} of {total} re-runs identical to their committed records.")
    args.out.write_text(json.dumps({"commit": _commit(), "lines": lines}, indent=1) + "\n")
    return 0 if identical == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
