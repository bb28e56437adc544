"""``train()``: one training job from a config to a finished run directory — create (or resume) the run
directory, build the loop (:class:`esjax.train.trainer.Trainer`), run it with metrics, checkpoints and live progress,
then write the plots and summary. Failures and Ctrl-C are reported in one line that says what is left on disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import jax

from esjax.config import Config, config_to_yaml
from esjax.parallel import multihost
from esjax.parallel.multihost import ProcessInfo, allgather_objects, barrier
from esjax.rundir.checkpoint import Checkpointer, StorageError
from esjax.rundir.directory import (
    CONFIG_FILE,
    RunInterrupted,
    default_run_dir,
    interrupted_error,
    plot_title,
    prepare_run_dir,
    read_run_info,
    record_resume,
    resume_marks,
    run_metadata,
    storage_reason,
)
from esjax.rundir.metrics import MetricsWriter, RecordCounter, read_metrics, truncate_after, truncate_records
from esjax.train.hooks import Hooks
from esjax.train.parts import check_extras
from esjax.train.progress import Progress
from esjax.train.trainer import RunAborted, Trainer

__all__ = ["Hooks", "RunAborted", "RunInterrupted", "TrainResult", "Trainer", "train"]


@dataclasses.dataclass
class TrainResult:
    run_dir: Path
    version: int
    params: Any
    records: list[dict[str, Any]]
    totals: dict[str, Any] = dataclasses.field(default_factory=dict)  # the coordinator's final totals


def enable_compilation_cache(path: str | None) -> None:
    """Reuse compiled programs across runs (an explicit JAX_COMPILATION_CACHE_DIR wins). Best effort: a
    cache folder that cannot be created (read-only home) only costs compile time."""
    import os
    import warnings

    if path is None or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as err:
        warnings.warn(f"run.compilation_cache: {path!r} cannot be used ({err.__class__.__name__}); compiling "
                      "without a persistent cache", RuntimeWarning, stacklevel=2)
        return
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def join_job(config: Config) -> ProcessInfo:
    """This process's place in the job: with ``mesh.distributed`` it joins the multi-process job first (settings
    from the ``ESJAX_*`` / ``JAX_*`` environment or the cluster, see :mod:`esjax.parallel.multihost`)."""
    if config.mesh.distributed:
        return multihost.initialize()
    return multihost.process_info()


@contextlib.contextmanager
def stop_gracefully(trainer: Trainer):
    """Ctrl-C or SIGTERM asks the trainer to finish its tick, write a checkpoint there and stop (so no work since
    the last checkpoint is lost); a second one stops at once. Single-process runs in the main thread only: the
    processes of a multi-process run would not agree on the tick (there, a signal stops at once as before)."""
    if jax.process_count() != 1 or threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handler(signum, frame):
        if not trainer.request_stop():  # the second one
            raise KeyboardInterrupt
        print(f"\n{signal.Signals(signum).name}: writing a checkpoint at the end of this tick, then stopping "
              "(again to stop at once)", file=sys.stderr, flush=True)

    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def train(config: Config, run_dir: str | Path | None = None, resume: bool = False,
          overrides: list[str] | None = None, hooks: Hooks | None = None) -> TrainResult:
    """Run (or resume) a training job and write its run directory; returns the final θ and records.

    ``overrides``: the ``--set`` items of the command line (recorded in run.json and summary.md). ``hooks``: callbacks
    at the loop's named points (:class:`~esjax.train.hooks.Hooks`), run after the trainer's own.

    A start that fails (bad input found while building the parts, a run directory that cannot be written, a
    missing optional package, a failure or Ctrl-C before the first update) raises a one-line error and leaves
    no new run directory behind. Ctrl-C later raises :class:`RunInterrupted`, whose message names the latest
    checkpoint and the command that resumes from it.
    """
    job = join_job(config)  # a multi-process job forms here, before anything touches a device
    run_dir = Path(run_dir or config.run.run_dir or default_run_dir(config))
    if job.process_count > 1:  # the primary's default name (it has the time in it) for everyone
        run_dir = Path(allgather_objects(str(run_dir))[0])
    primary = job.is_primary  # the one process that writes the run directory's files (orbax: each its part)
    check_extras(config)
    created = prepare_run_dir(run_dir, resume) if primary else None
    barrier("esjax: run directory ready")
    if config.run.progress and primary:
        print(f"{'resuming' if resume else 'writing'} the run in {run_dir}: loading the task and the policy",
              flush=True)
    checkpointer = writer = trainer = None
    try:
        enable_compilation_cache(config.run.compilation_cache)
        if not resume and primary:
            (run_dir / CONFIG_FILE).write_text(config_to_yaml(config))
            (run_dir / "run.json").write_text(json.dumps(run_metadata(config, overrides), indent=2))
        trainer = Trainer(config, run_dir, hooks)
        checkpointer = Checkpointer(run_dir, config.run.keep_checkpoints)
        metrics_path = run_dir / "metrics.jsonl"
        kept = 0  # metrics records that stay in the file
        if resume and checkpointer.steps():
            step, records = trainer.restore(checkpointer)
            if records is not None:  # drop what was written after the checkpoint
                kept = records
                if primary:
                    truncate_records(metrics_path, kept)
            elif primary:  # a checkpoint from before record counting
                truncate_after(metrics_path, step)
        else:
            if resume and primary:
                metrics_path.unlink(missing_ok=True)
            trainer.fresh()
        wandb = None
        if config.run.wandb:
            wandb = {"project": config.run.wandb_project, "name": run_dir.name, "config": config.model_dump()}
        writer = MetricsWriter(run_dir, config.run.tensorboard, wandb) if primary else RecordCounter(kept)
        barrier("esjax: run restored")
        if resume and primary:
            record_resume(run_dir, overrides, trainer.version)
            if overrides:  # config.yaml says what the run is now (e.g. an extended run.updates)
                (run_dir / CONFIG_FILE).write_text(config_to_yaml(config))
    except BaseException as err:
        for part in (writer, checkpointer, trainer):  # trainer: its env pool's workers
            if part is not None:
                with contextlib.suppress(Exception):
                    part.close()
        if created is not None:  # only the primary creates it
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(err, OSError):
            raise StorageError(f"{run_dir}: cannot write the run ({storage_reason(err)})") from None
        if isinstance(err, KeyboardInterrupt) and not isinstance(err, RunInterrupted):
            where = (f"the new run directory {run_dir} was removed" if created is not None
                     else f"{run_dir} is unchanged")
            raise RunInterrupted(f"interrupted during start-up: nothing was trained, {where}", run_dir, None,
                                 removed=created is not None) from None
        raise
    progress = Progress(config.run.updates, enabled=config.run.progress and primary)
    failed, interrupted, removed = True, False, False
    steps: list[int] = []
    try:
        with progress, (jax.set_mesh(trainer.mesh) if trainer.mesh is not None else contextlib.nullcontext()), \
                stop_gracefully(trainer):
            trainer.run(writer, checkpointer, progress)
        barrier("esjax: run finished")  # every record is on disk (each write is synced) before anyone reads
        records = read_metrics(run_dir / "metrics.jsonl")
        summary = None
        if primary:
            from esjax.rundir.plots import write_plots, write_summary
            from esjax.rundir.traces import first_and_last_traces

            run_info = read_run_info(run_dir)
            if config.run.plots:
                write_plots(records, run_dir / "plots", plot_title(config, run_info), resume_marks(run_info))
            summary = write_summary(records, run_dir / "summary.md",
                                    f"{config.run.name}: {config.schedule.kind} ES", run_info=run_info,
                                    traces=first_and_last_traces(run_dir / "traces"), task=trainer.parts.task)
        failed = False
    except OSError as err:  # a full or read-only disk under the run directory: stop, keep the last checkpoint
        raise StorageError(f"{run_dir}: cannot write the run ({storage_reason(err)}); stopped at version "
                           f"{trainer.version}, the last complete checkpoint is kept") from None
    except KeyboardInterrupt:
        interrupted = True  # reported below, once the files are closed
    finally:
        with contextlib.suppress(Exception):
            steps = checkpointer.steps()
        for close in (writer.close, checkpointer.close, trainer.close):
            with contextlib.suppress(OSError):
                close()
        # A failure (or Ctrl-C) before the first update of a new run is a failed start: nothing to resume.
        if failed and created is not None and not steps and trainer.version == 0:
            shutil.rmtree(created, ignore_errors=True)
            removed = True
    if interrupted:
        raise interrupted_error(run_dir, trainer.version, steps, config.run.checkpoint_every, removed,
                           overrides if resume else None) from None
    if summary is not None:
        progress.final(summary, records)
    if config.run.progress and primary:
        plots = " plots/," if config.run.plots else ""
        print(f"run directory: {run_dir} (summary.md,{plots} metrics.jsonl, checkpoints/)", flush=True)
    return TrainResult(run_dir, trainer.version, trainer.params, records, trainer.totals())
