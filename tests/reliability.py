"""Rows of RELIABILITY.md, recorded by the reliability tests themselves.

Each fault-injection test calls :func:`record` with what it injected, how, what it expected and what it
observed (built from the values it just asserted on), and whether anything accepted was lost. Rows live in
``tests/reliability_rows/<id>.json``; ``python -m tests.reliability_table`` (and the last reliability
test) turns them into RELIABILITY.md. A row is only written after the test's assertions passed, so the
table never shows an outcome that was not observed.
"""

from __future__ import annotations

import json
from pathlib import Path

ROWS = Path(__file__).resolve().parent / "reliability_rows"


def record(row_id: str, *, area: str, fault: str, injection: str, expected: str, observed: str,
           accepted_lost: str, test: str) -> None:
    """Write (or refresh) one row; the file only changes when the row's content does."""
    ROWS.mkdir(parents=True, exist_ok=True)
    row = {"id": row_id, "area": area, "fault": fault, "injection": injection, "expected": expected,
           "observed": observed, "accepted_lost": accepted_lost, "test": test}
    path = ROWS / f"{row_id}.json"
    text = json.dumps(row, indent=1, sort_keys=True) + "\n"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
