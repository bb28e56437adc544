"""A run directory and what it records about the run: ``config.yaml``, ``run.json`` (versions, commit,
overrides, machine, and one entry per resume), its creation (removed again when the start fails), the command that
resumes it, and the message a Ctrl-C prints.
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import jax
import optax

import esjax
from esjax.config import Config, ConfigError, load_config
from esjax.errors import UserError
from esjax.rundir.checkpoint import StorageError

CONFIG_FILE = "config.yaml"


class RunDirError(UserError):
    """The run directory cannot be used (e.g. the path names a regular file)."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the message says which checkpoint exists and how to resume (``esjax.run`` adds the
    exact command)."""

    def __init__(self, message: str, run_dir: Path, checkpoint: int | None, removed: bool = False):
        super().__init__(message)
        self.run_dir, self.checkpoint, self.removed = run_dir, checkpoint, removed


def git_commit(package: Path | None = None) -> dict[str, Any]:
    """The commit of the esjax source checkout (``"unknown"`` when esjax is not run from a git checkout) and
    whether tracked files differ from it. ``package``: the esjax package folder to ask about (default: this one's)."""
    import subprocess

    root = Path(package or Path(esjax.__file__).parent).resolve().parent
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()

        top = Path(git("rev-parse", "--show-toplevel")).resolve()
        if top != root:  # esjax installed inside some other repository: that commit says nothing about esjax
            return {"commit": "unknown", "dirty": None}
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError, ValueError):
        return {"commit": "unknown", "dirty": None}


def session(overrides: list[str] | None) -> dict[str, Any]:
    """Who ran this start or resume: the esjax commit, the ``--set`` overrides, the machine and its devices."""
    from esjax.rundir.machine import machine_info

    source = git_commit()
    return {"git_commit": source["commit"], "git_dirty": source["dirty"], "overrides": list(overrides or []),
            "machine": machine_info(), "devices": [str(d) for d in jax.devices()], "argv": sys.argv,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def run_metadata(config: Config, overrides: list[str] | None = None) -> dict[str, Any]:
    import flax

    from esjax.model.sharding import MeshError, mesh_shape

    try:  # the mesh the run will use (mesh.data = 0 resolved); an impossible one is the trainer's error to report
        data, model = mesh_shape(config.mesh.data, config.mesh.model, len(jax.devices()))
        mesh = {"data": data, "model": model}
    except MeshError:
        mesh = None
    return {"esjax": esjax.__version__, "jax": jax.__version__, "jaxlib": jax.lib.__version__
            if hasattr(jax.lib, "__version__") else None, "flax": flax.__version__, "optax": optax.__version__,
            "python": sys.version.split()[0], "platform": platform.platform(), "seed": config.run.seed,
            "device_kind": jax.devices()[0].device_kind, "mesh": mesh, **session(overrides)}


def record_resume(run_dir: Path, overrides: list[str] | None, version: int | None = None) -> None:
    """Append this resume (the version it continues from, commit, overrides, machine) to run.json's ``resumes``
    list (best effort: a run.json that is missing or unreadable is left alone)."""
    meta = read_run_info(run_dir)
    if meta is None:
        return
    meta.setdefault("resumes", []).append({"version": version, **session(overrides)})
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2))


def resume_marks(run_info: dict[str, Any] | None) -> list[tuple[int, str]]:
    """``(version, label)`` of every resume in run.json that continued a run: 'extended' when it raised
    ``run.updates``, 'resumed' otherwise (resumes recorded before versions were kept are skipped)."""
    marks = []
    for entry in (run_info or {}).get("resumes", []):
        version = entry.get("version")
        if version is None:
            continue
        extended = any(str(item).startswith("run.updates=") for item in entry.get("overrides") or [])
        marks.append((int(version), "extended" if extended else "resumed"))
    return marks


def plot_title(config: Config, run_info: dict[str, Any] | None) -> str:
    """``default: async ES (K=1), seed 0, commit 0c0adf3d`` (``+`` marks uncommitted changes)."""
    commit = str((run_info or {}).get("git_commit") or "unknown")
    if commit != "unknown":
        commit = commit[:8] + ("+" if (run_info or {}).get("git_dirty") else "")
    return (f"{config.run.name}: {config.schedule.kind} ES (K={config.schedule.max_lag}), seed {config.run.seed}, "
            f"commit {commit}")


def read_run_info(run_dir: Path) -> dict[str, Any] | None:
    """run.json of a run directory, or None when it is missing or unreadable."""
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def default_run_dir(config: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.run.name}-{stamp}"


def resume_config(run_dir: str | Path, overrides: list[str] | None = None) -> Config:
    """The config a run was started with (``--set`` may change only non-structural keys)."""
    path = Path(run_dir) / CONFIG_FILE
    if not Path(run_dir).exists():
        raise ConfigError(f"{run_dir}: does not exist")
    if not path.is_file():
        raise ConfigError(f"{path}: not a run directory (no {CONFIG_FILE})")
    return load_config(path, overrides)


def storage_reason(err: OSError) -> str:
    """``[Errno 30] Read-only file system: 'path'`` as one short line."""
    text = f"{err.strerror}: {err.filename}" if err.strerror and err.filename else str(err)
    return text.splitlines()[0][:300] if text else err.__class__.__name__


def prepare_run_dir(run_dir: Path, resume: bool) -> Path | None:
    """Make sure ``run_dir`` is a usable directory (creating it and its parents for a new run). Returns the
    top-most folder this call created (removed again if the start fails), or None."""
    what = "--resume" if resume else "--run-dir / run.run_dir"
    try:
        if run_dir.exists() and not run_dir.is_dir():
            raise RunDirError(f"{run_dir}: the run directory ({what}) exists and is not a directory")
        if run_dir.is_dir():
            return None
        if resume:
            raise RunDirError(f"{run_dir}: the run directory ({what}) does not exist")
        top = run_dir  # the top-most folder this call creates
        while not top.parent.exists() and top.parent != top:
            top = top.parent
        run_dir.mkdir(parents=True, exist_ok=True)
        return top
    except OSError as err:
        raise StorageError(f"{run_dir}: cannot create the run directory ({what}): {storage_reason(err)}") from None
    except ValueError as err:  # an embedded NUL byte and the like
        raise RunDirError(f"{str(run_dir)[:200]!r}: not a usable run directory ({what}): {err}") from None


def resume_command(run_dir: Path, overrides: list[str] | None = None) -> str:
    """The shell command that resumes ``run_dir`` with the same ``--set`` overrides."""
    parts = ["python", "-m", "esjax.run", "--resume", str(run_dir)]
    for item in overrides or []:
        parts += ["--set", item]
    return shlex.join(parts)


def interrupted_error(run_dir: Path, version: int, steps: list[int], checkpoint_every: int, removed: bool,
                 resume_overrides: list[str] | None) -> RunInterrupted:
    if removed:
        return RunInterrupted(f"interrupted before the first update: no checkpoint was written and the new run "
                              f"directory {run_dir} was removed", run_dir, None, removed=True)
    command = resume_command(run_dir, resume_overrides)
    if steps:
        latest = steps[-1]
        where = run_dir.absolute() / "checkpoints" / str(latest)
        return RunInterrupted(f"interrupted at version {version}; latest checkpoint: version {latest} ({where})\n"
                              f"resume with: {command}", run_dir, latest)
    return RunInterrupted(f"interrupted at version {version}, before the first checkpoint (run.checkpoint_every="
                          f"{checkpoint_every}): no checkpoint exists, a resume starts the run over\n"
                          f"resume with: {command}", run_dir, None)
