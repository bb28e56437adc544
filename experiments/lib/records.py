"""A finished run directory reduced to the records worth committing (the study's evidence lives in the repository).

Kept: ``config.yaml``, ``run.json``, ``metrics.jsonl``, ``summary.md`` and whatever else the scripts add
(``grid.json``, ``study.json``, ``behaviour.json``), and the evaluation traces gzipped (~0.1 MB per 500 goals,
so any later measure of behaviour can be computed from them). Dropped: checkpoints (only a resume needs them, and
a finished run is never resumed by the study scripts) and plots (drawn again from metrics.jsonl).
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path


def compact_run(run_dir: str | Path) -> list[Path]:
    """Gzip ``traces/*.jsonl`` (reproducibly: no timestamp in the header) and drop ``checkpoints/`` and ``plots/``;
    returns the gzipped files. Call it only on a finished run (its ``summary.md`` written)."""
    run_dir = Path(run_dir)
    zipped = []
    for path in sorted((run_dir / "traces").glob("*.jsonl")):
        target = path.with_name(path.name + ".gz")
        with open(path, "rb") as src, gzip.GzipFile(target, "wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)
        path.unlink()
        zipped.append(target)
    for name in ("checkpoints", "plots"):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    return zipped
