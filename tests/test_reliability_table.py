"""RELIABILITY.md is generated from the committed reliability rows; this keeps it in step with them.

Reads only: the rows the reliability tests observe are checked against the committed ones by the tests
themselves (``tests/reliability.py``), so this test does not depend on which tests ran before it."""

from __future__ import annotations

import reliability_table


def test_reliability_md_matches_the_committed_rows():
    rows = reliability_table.rows()
    assert rows, "no rows committed"
    assert all(set(r) >= {"area", "fault", "injection", "expected", "observed", "accepted_lost", "test"} for r in rows)
    current = reliability_table.OUT.read_text() if reliability_table.OUT.is_file() else ""
    assert current == reliability_table.render(), \
        "RELIABILITY.md is out of date with tests/reliability_rows: run `python -m tests.reliability_table`"


def test_every_row_names_a_test_that_records_it():
    for row in reliability_table.rows():
        path, _, name = row["test"].partition("::")
        source = (reliability_table.REPO / path).read_text()
        assert f"def {name.partition('[')[0]}(" in source and "record(" in source, row["test"]
