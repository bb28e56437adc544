"""The study's reproducibility check re-runs a committed grid run from its grid.json and compares records and
traces (experiments/study_reproduce.py), on a tiny random-weights grid run."""

import json

from experiments import staleness_grid, study_reproduce

TINY = ["model.source=random", "env.num_products=30", "env.eval_goals=2", "run.updates=2", "run.eval_every=1",
        "es.population=4", "schedule.slots=4", "env.tasks_per_member=1"]


def test_a_rerun_matches_its_committed_records_and_a_change_is_named(tmp_path):
    out = tmp_path / "records"
    args = ["--quick", "--out", str(out), "--cells", "sync", "--seeds", "1"]
    for item in TINY:
        args += ["--set", item]
    assert staleness_grid.main(args) == 0
    assert study_reproduce.reproduce("sync", 0, tmp_path / "scratch", out, "synthetic") == []
    committed = out / "synthetic" / "sync" / "seed0"
    lines = (committed / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["wall_time"] = 1e9  # timing fields never count
    update = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "update")
    changed = json.loads(lines[update])
    changed["fitness_mean"] = -1.0
    lines[0], lines[update] = json.dumps(first), json.dumps(changed)
    (committed / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    found = study_reproduce.differences(committed, tmp_path / "scratch" / "sync" / "seed0")
    assert len(found) == 1 and "differs in fitness_mean" in found[0]
