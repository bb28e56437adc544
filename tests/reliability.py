"""Rows of RELIABILITY.md, checked by the reliability tests themselves.

Each fault-injection test calls :func:`record` with what it injected, how, what it expected and what it
observed (built from the values it just asserted on), and whether anything accepted was lost. The committed
rows live in ``tests/reliability_rows/<id>.json`` and RELIABILITY.md is generated from them by
``python -m tests.reliability_table``. A test never writes a tracked file: :func:`record` writes the row it
observed to ``tmp/reliability_rows/<id>.json`` (untracked) and fails if it differs from the committed row;
after reviewing the difference, ``python -m tests.reliability_table --accept`` copies the observed rows over
the committed ones and regenerates RELIABILITY.md. A row is only written after the test's assertions passed,
so the table never shows an outcome that was not observed.
"""

from __future__ import annotations

import difflib
import os

from reliability_table import OBSERVED, REPO, ROWS, row_text


def record(row_id: str, *, area: str, fault: str, injection: str, expected: str, observed: str,
           accepted_lost: str, test: str) -> None:
    """Write the observed row under ``tmp/`` and check it equals the committed one."""
    row = {"id": row_id, "area": area, "fault": fault, "injection": injection, "expected": expected,
           "observed": observed, "accepted_lost": accepted_lost, "test": test}
    text = row_text(row)
    OBSERVED.mkdir(parents=True, exist_ok=True)
    out = OBSERVED / f"{row_id}.json"
    partial = out.with_name(f".{out.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(out)
    committed = ROWS / f"{row_id}.json"
    current = committed.read_text() if committed.is_file() else ""
    if current != text:
        diff = "".join(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                            str(committed.relative_to(REPO)), str(out.relative_to(REPO))))
        raise AssertionError(f"the observed RELIABILITY.md row {row_id!r} differs from the committed one; if the "
                             "new row is right, run `python -m tests.reliability_table --accept` (copies "
                             f"tmp/reliability_rows/ over tests/reliability_rows/, regenerates RELIABILITY.md)\n"
                             f"{diff}")
