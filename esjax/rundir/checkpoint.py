"""Orbax checkpoints of a run: ES state (θ, optimizer state, version) plus the loop's JSON state.

Orbax writes each step into a temporary folder and renames it when complete, so a crash (even SIGKILL)
during a save leaves the previous checkpoint loadable. Restoring walks back from the newest step and, if a
step cannot be read, warns and falls back to the one before it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from esjax.errors import EsjaxError

log = logging.getLogger(__name__)

PyTree = Any


class CheckpointError(EsjaxError, RuntimeError):
    """No checkpoint in a run directory could be restored."""


class StorageError(CheckpointError):
    """The run directory cannot be written (full or read-only disk); the last complete checkpoint is kept."""


def _abstract(tree: PyTree) -> PyTree:
    """Shape/dtype/sharding skeleton used as the restore target (restores straight into the shardings)."""

    def leaf(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x

    return jax.tree.map(leaf, tree)


class Checkpointer:
    """Saves and restores ``(es_state, loop_state)`` under ``<run_dir>/checkpoints/<step>``."""

    def __init__(self, run_dir: str | Path, max_to_keep: int = 3):
        self.directory = Path(run_dir).absolute() / "checkpoints"
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               enable_async_checkpointing=False)
        try:
            self.manager = ocp.CheckpointManager(self.directory, options=options)
        except Exception as err:  # noqa: BLE001 - e.g. a read-only run directory, wrapped by orbax
            raise StorageError(f"{self.directory}: cannot open the checkpoint folder ({_reason(err)})") from None

    def save(self, step: int, es_state: PyTree, loop_state: dict[str, Any]) -> None:
        """Write one checkpoint (blocking: the loop state must be on disk before work continues)."""
        args = ocp.args.Composite(es=ocp.args.StandardSave(es_state), loop=ocp.args.JsonSave(loop_state))
        try:
            if step in self.manager.all_steps():  # an unreadable step left behind by a resume that fell back
                self.manager.delete(step)
            self.manager.save(step, args=args, force=True)
            self.manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001 - orbax/tensorstore wrap OS errors in their own types
            raise StorageError(f"{self.directory}: cannot write checkpoint {step} ({_reason(err)}); "
                               f"the previous checkpoints are kept") from None

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def loop_state(self, step: int) -> dict[str, Any]:
        """The loop state saved with checkpoint ``step`` (no arrays are read)."""
        return dict(self.manager.restore(step, args=ocp.args.Composite(loop=ocp.args.JsonRestore()))["loop"])

    def restore_latest(self, target: Callable[[dict[str, Any]], PyTree]) -> tuple[int, PyTree, dict[str, Any]]:
        """Restore the newest readable checkpoint.

        ``target(loop_state)`` returns an example ES-state tree (its structure and shardings are what the
        arrays are restored into); it sees the loop state first because that says which versions were saved.
        """
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"{self.directory}: no checkpoints to resume from")
        for step in reversed(steps):
            try:
                loop = self.loop_state(step)
                example = _abstract(target(dict(loop)))
                es = self.manager.restore(step, args=ocp.args.Composite(es=ocp.args.StandardRestore(example)))["es"]
                return step, es, loop
            except Exception as err:  # noqa: BLE001 - any unreadable step falls back to an older one
                first_line = str(err).splitlines()[0][:200] if str(err) else ""
                message = (f"checkpoint {self.directory / str(step)} could not be restored "
                           f"({err.__class__.__name__}: {first_line}); falling back to the previous checkpoint")
                warnings.warn(message, RuntimeWarning, stacklevel=2)
                log.warning(message)
        raise CheckpointError(f"{self.directory}: none of the checkpoints {steps} could be restored")

    def close(self) -> None:
        self.manager.close()


def read_loop_state(run_dir: str | Path, step: int) -> dict[str, Any]:
    """The loop state of checkpoint ``step`` of a run directory (versions, coordinator, live episodes, ...)."""
    checkpointer = Checkpointer(run_dir)
    try:
        return checkpointer.loop_state(step)
    finally:
        checkpointer.close()


def _reason(err: BaseException) -> str:
    """The root cause of a (possibly wrapped) write error, in one short line."""
    while err.__cause__ is not None or err.__context__ is not None:
        if isinstance(err, OSError):
            break
        err = err.__cause__ or err.__context__
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    text = str(err).strip().splitlines()
    return f"{err.__class__.__name__}: {text[0][:200]}" if text else err.__class__.__name__
