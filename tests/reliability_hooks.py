"""Fault hooks for subprocess runs of the trainer: ``python tests/reliability_hooks.py HOOK ARG -- esjax.run args``.

Hooks:
  stall-in-save STEP   the JSON item of checkpoint STEP is written into orbax's temporary folder, then the
                       save stalls (a marker file ``<run>/STALLED_IN_SAVE`` says so) until the process is killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# Run as a script, this file's folder (tests/) is sys.path[0]: put the checkout it belongs to first, so the
# hooked run imports this checkout's esjax whether or not (and wherever) the package is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def stall_in_save(step: int, run_dir: Path) -> None:
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as handler

    original = handler.JsonCheckpointHandler._save_fn

    async def _save_fn(self, x, directory):
        await original(self, x, directory)
        if Path(str(directory)).parent.name.startswith(f"{step}."):  # <step>.orbax-checkpoint-tmp-*/loop
            (run_dir / "STALLED_IN_SAVE").write_text(str(directory))
            time.sleep(3600)

    handler.JsonCheckpointHandler._save_fn = _save_fn


def main(argv: list[str]) -> None:
    hook, arg, sep, *rest = argv
    assert sep == "--", argv
    run_dir = Path(rest[rest.index("--run-dir") + 1])
    if hook == "stall-in-save":
        stall_in_save(int(arg), run_dir)
    else:
        raise SystemExit(f"unknown hook {hook!r}")
    from esjax.cli.common import run_cli
    from esjax.cli.run import main as run_main

    run_cli(run_main, rest)


if __name__ == "__main__":
    main(sys.argv[1:])
