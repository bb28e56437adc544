"""RELIABILITY.md is generated from the rows the reliability tests record; this keeps it in step with them.

Runs after the other reliability tests (file order); if any row changed, it regenerates the file and fails
so the change is reviewed and committed."""

from __future__ import annotations

import reliability_table


def test_reliability_md_matches_the_recorded_rows():
    rows = reliability_table.rows()
    assert rows, "no rows recorded"
    assert all(set(r) >= {"area", "fault", "injection", "expected", "observed", "accepted_lost", "test"} for r in rows)
    expected = reliability_table.render()
    current = reliability_table.OUT.read_text() if reliability_table.OUT.is_file() else ""
    if current != expected:
        reliability_table.OUT.write_text(expected)
        raise AssertionError("RELIABILITY.md was out of date with tests/reliability_rows; regenerated it — commit it")
