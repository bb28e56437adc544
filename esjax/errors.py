"""The errors esjax reports to its user, under one base class.

Every error about the user's input or environment — a bad config key, model folder, mesh, run directory or
checkpoint, a multi-process job that cannot form, a missing optional extra — derives from :class:`EsjaxError`, and
the command-line entry points (:func:`esjax.cli.common.run_cli`) print any of them as one line ``error: <message>``
with exit code 2, never a traceback. Each class lives beside the code that raises it; this module holds the base
and :class:`UserError` for the cases no specific class covers. A task's input errors (a data file, a goal list,
one of its ``env`` keys) derive from :class:`TaskError` (``envs.webshop_bridge.DataError`` does), so the same
one-line report covers every task without the core knowing any.
"""

from __future__ import annotations


class EsjaxError(Exception):
    """Base of every user-facing esjax error."""


class UserError(EsjaxError, RuntimeError):
    """A problem with the user's input or environment, reported in one line."""


class TaskError(EsjaxError, ValueError):
    """A task's input is wrong (a data file, a split or goal list, one of its ``env`` keys): the message names the
    file, key or field and what was expected. Each task's own error classes derive from it
    (:mod:`esjax.task`)."""
