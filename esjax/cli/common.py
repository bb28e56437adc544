"""Shared CLI plumbing: user errors become one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

from esjax.errors import EsjaxError, UserError

#: What run_cli reports in one line: every esjax user error (a task's input errors among them:
#: :class:`esjax.errors.TaskError`), and missing / unreadable paths.
USER_ERRORS: tuple[type[BaseException], ...] = (EsjaxError, FileNotFoundError, NotADirectoryError, PermissionError)

__all__ = ["USER_ERRORS", "UserError", "run_cli"]


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> None:
    """Call ``main`` and turn user errors into ``error: <message>`` with exit code 2."""
    try:
        code = main(argv)
    except USER_ERRORS as err:
        message = str(err).splitlines()[0] if str(err) else err.__class__.__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as err:  # a trainer's RunInterrupted says which checkpoint exists and how to resume
        print(str(err) or "interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
