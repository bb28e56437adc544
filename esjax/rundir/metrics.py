"""Run records: one JSON line per update or evaluation in ``metrics.jsonl``, optionally TensorBoard too.

Records are flushed and fsynced as they are written, so the history of accepted work survives a crash
up to the last record. A checkpoint remembers how many records had been written when it was taken; a resume
keeps exactly those (:func:`truncate_records`) and the resumed run writes the rest again, so the file ends
with one record per (kind, version) whatever the point of the crash.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

#: Fields of metrics records that measure time: they differ between two runs of the same config, so comparisons of
#: runs (resume tests, the study's reproducibility check) leave them out.
TIMING_FIELDS = frozenset({"wall_time", "seconds", "episodes_per_s", "tokens_per_s", "eval_seconds",
                           "update_seconds"})


def untimed(records: Iterable[dict[str, Any]], timing: Iterable[str] = TIMING_FIELDS) -> list[dict[str, Any]]:
    """The records with their timing fields left out."""
    drop = set(timing)
    return [{k: v for k, v in r.items() if k not in drop} for r in records]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


class MetricsWriter:
    """Appends records to ``<run_dir>/metrics.jsonl``, and mirrors their numbers to TensorBoard and/or Weights &
    Biases when enabled. The JSONL file is the record of the run; the mirrors are views of it."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = False, wandb: dict[str, Any] | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        #: complete records in the file: those already there plus those written since
        self.count = sum(1 for _ in _iter_records(self.path))
        self._file = self.path.open("a", encoding="utf-8")
        self._mirrors: list[Any] = []
        if tensorboard:
            self._mirrors.append(_TensorBoard(Path(run_dir)))
        if wandb is not None:
            self._mirrors.append(_WandB(Path(run_dir), **wandb))

    def write(self, record: dict[str, Any]) -> None:
        record = _jsonable(record)
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.count += 1
        if self._mirrors:
            version = int(record.get("version", 0))
            scalars = {f"{record.get('kind', 'train')}/{key}": value for key, value in record.items()
                       if isinstance(value, int | float) and not isinstance(value, bool) and key != "schema_version"}
            for mirror in self._mirrors:
                mirror.write(version, scalars)

    def close(self) -> None:
        self._file.close()
        for mirror in self._mirrors:
            mirror.close()


class RecordCounter:
    """The metrics writer of a process that does not write the run directory (any but the primary of a
    multi-process job): it only counts records, so the loop state it checkpoints agrees with the primary's."""

    def __init__(self, count: int = 0):
        self.count = count

    def write(self, record: dict[str, Any]) -> None:
        self.count += 1

    def close(self) -> None:
        """Nothing to release."""


def _missing_extra(key: str, package: str, extra: str) -> ImportError:
    return ImportError(f"{key}: needs the optional {package} package, which is not installed: "
                       f"pip install 'esjax[{extra}]' (or --set {key}=false)")


class _TensorBoard:
    """Scalars under ``<run_dir>/tensorboard``, one step per version."""

    def __init__(self, run_dir: Path):
        try:
            from tensorboardX import SummaryWriter  # optional extra: pip install 'esjax[tb]'
        except ImportError:
            raise _missing_extra("run.tensorboard", "tensorboardX", "tb") from None
        self._writer = SummaryWriter(str(run_dir / "tensorboard"))

    def write(self, version: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, version)

    def close(self) -> None:
        self._writer.close()


class _WandB:
    """A Weights & Biases run for this run directory (files under ``<run_dir>/wandb``).

    Its id is kept in ``<run_dir>/wandb_id``, so a resumed run continues the same W&B run. Every metric is plotted
    against ``version`` (an evaluation's record arrives after later updates' records, so W&B's own step, which
    must only grow, cannot be the version). ``WANDB_MODE=offline`` keeps everything local (``wandb sync`` later);
    ``WANDB_MODE=disabled`` turns it off.
    """

    def __init__(self, run_dir: Path, project: str, name: str, config: dict[str, Any]):
        try:
            import wandb  # optional extra: pip install 'esjax[wandb]'
        except ImportError:
            raise _missing_extra("run.wandb", "wandb", "wandb") from None
        id_file = run_dir / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        id_file.write_text(run_id)
        self._run = wandb.init(project=project, name=name, id=run_id, resume="allow", dir=str(run_dir),
                               config=config)
        self._run.define_metric("version")
        self._run.define_metric("*", step_metric="version")

    def write(self, version: int, scalars: dict[str, float]) -> None:
        self._run.log({"version": version, **scalars})

    def close(self) -> None:
        self._run.finish()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a ``metrics.jsonl`` (a torn last line from a crash is ignored)."""
    return list(_iter_records(Path(path)))


def _iter_records(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open(encoding="utf-8") as file:
        for line in file:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def truncate_after(path: str | Path, version: int) -> None:
    """Keep only records up to ``version`` (used when resuming from a checkpoint at that version)."""
    path = Path(path)
    kept: Iterable[dict[str, Any]] = [r for r in _iter_records(path) if int(r.get("version", 0)) <= version]
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as file:
        for record in kept:
            file.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(tmp, path)


def truncate_records(path: str | Path, count: int) -> None:
    """Keep only the first ``count`` complete records (used when resuming from a checkpoint taken when
    ``count`` records had been written; a torn line from a crash is dropped too)."""
    path = Path(path)
    kept = []
    for record in _iter_records(path):
        if len(kept) >= count:
            break
        kept.append(record)
    if len(kept) < count:  # the file was edited or lost: keep what there is, the checkpoint still has θ
        warnings.warn(f"{path}: the checkpoint counts {count} records, the file has only {len(kept)}; "
                      "the missing history cannot be rewritten", RuntimeWarning, stacklevel=2)
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as file:
        for record in kept:
            file.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(tmp, path)
