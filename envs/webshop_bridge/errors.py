"""The one error type the bridge raises for bad input, so callers can catch data problems precisely."""

from __future__ import annotations

from esjax.errors import TaskError


class DataError(TaskError):
    """A data file is missing, unreadable or has a field of the wrong shape (a :class:`esjax.errors.TaskError`, so
    esjax's command-line programs print it as one line; still a ``ValueError``).

    The message always names the file and, where there is one, the record and field, because a
    traceback from deep inside a loader is useless to someone fixing a 1 GB JSON file.
    """

    def __init__(self, file: str, problem: str, *, record: str | None = None, field: str | None = None):
        self.file = str(file)
        self.record = record
        self.field = field
        where = self.file
        if record is not None:
            where += f", record {record}"
        if field is not None:
            where += f", field '{field}'"
        super().__init__(f"{where}: {problem}")
