"""metrics.jsonl against its written schema (esjax/rundir/metrics_schema.py) on a real run: every record valid, one
type per field, and the accepted count the same in the last update record, the end record and summary.md."""

from __future__ import annotations

import re
import warnings

from esjax.config import load_config
from esjax.rundir.metrics_schema import SCHEMA_VERSION, cohort_lags, problems
from esjax.rundir.plots import lag_counts
from esjax.train.session import train

# more slots than members: results of the next cohort arrive before the update (an open cohort at record time)
TINY = ["run.updates=3", "run.eval_every=3", "run.checkpoint_every=3", "es.population=4", "schedule.slots=8",
        "schedule.max_lag=2", "env.data=webshop_small", "env.eval_goals=4", "env.tasks_per_member=1",
        "env.max_steps=4", "run.progress=false", "run.plots=false"]


def test_every_record_of_a_real_run_fits_the_schema_and_accepted_counts_agree(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the trainer sets es.scope: no default-scope warning
        result = train(load_config(None, TINY), run_dir=tmp_path / "run")
    records = result.records
    assert {r["kind"] for r in records} >= {"update", "eval", "end"}
    assert [p for r in records for p in problems(r)] == []
    assert all(r["schema_version"] == SCHEMA_VERSION for r in records)
    updates = [r for r in records if r["kind"] == "update"]
    end = records[-1]
    assert end["kind"] == "end" and len(updates) == 3
    # one meaning per field: running totals of applied updates in both kinds
    last = updates[-1]
    assert last["open_cohort"] > 0  # the next cohort's members were in: old records counted them as accepted
    assert last["accepted"] == end["accepted"] == 3 * 4 == sum(end["lag_hist"])
    assert last["lag_hist"] == end["lag_hist"] and last["stale_fraction"] == end["stale_fraction"]
    assert all(r["accepted"] == 4 * r["version"] == sum(r["lag_hist"]) for r in updates)
    assert dict(lag_counts(records)) == {lag: c for lag, c in enumerate(end["lag_hist"]) if c}
    assert all(sum(cohort_lags(r).values()) == 4 for r in updates)
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert re.search(r"- accepted: (\d+),", summary).group(1) == str(end["accepted"])


def test_schema_flags_wrong_types_and_reads_schema_1_update_records():
    good = {"kind": "event", "schema_version": 2, "version": 3, "wall_time": 1.5, "event": "stopped",
            "at_version": 3, "tick": 9, "reason": "r"}
    assert problems(good) == []
    assert problems({**good, "tick": 9.5}) == ["event: tick=9.5 is not int"]
    assert problems({**good, "extra": 1}) == ["event: unknown field extra"]
    assert problems({**good, "extra": 1}, extra_ok=True) == []
    assert problems({"kind": "end"})[0] == "end: missing schema_version"
    # a schema-1 update record: the cohort's lags were a {lag: count} dict in lag_hist
    assert cohort_lags({"kind": "update", "lag_hist": {"0": 2, "1": 14}}) == {0: 2, 1: 14}
    assert cohort_lags({"kind": "update", "cohort_lag_hist": [2, 14], "lag_hist": [100, 20]}) == {0: 2, 1: 14}


def test_readme_documents_every_field_of_the_schema():
    from pathlib import Path

    from esjax.rundir.metrics_schema import COMMON, KINDS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("### metrics.jsonl records"):readme.index("## Generate mode")]
    for name in {*COMMON, *(f for fields in KINDS.values() for f in fields)}:
        assert f"`{name}`" in section, name
