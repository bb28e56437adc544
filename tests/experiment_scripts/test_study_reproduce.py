"""The study's reproducibility check re-runs a committed grid run from its grid.json and compares records and
traces (experiments/study_reproduce.py), on a tiny random-weights grid run."""

import json

import pytest

from experiments import staleness_grid, study_reproduce

TINY = ["model.source=random", "env.num_products=30", "env.eval_goals=2", "run.updates=2", "run.eval_every=1",
        "es.population=4", "schedule.slots=4", "env.tasks_per_member=1"]


def test_a_rerun_matches_its_committed_records_and_a_change_is_named(tmp_path):
    out = tmp_path / "records"
    args = ["--quick", "--out", str(out), "--cells", "sync", "--seeds", "1"]
    for item in TINY:
        args += ["--set", item]
    assert staleness_grid.main(args) == 0
    reruns = tmp_path / "reruns"
    assert study_reproduce.reproduce("sync", 0, reruns, out, "synthetic") == []
    kept = reruns / "synthetic" / "sync" / "seed0"  # the re-run's records stay, compacted as the study's runs
    assert (kept / "summary.md").is_file() and not (kept / "checkpoints").exists()
    assert sorted(p.name for p in (kept / "traces").iterdir()) == sorted(
        p.name for p in (out / "synthetic" / "sync" / "seed0" / "traces").iterdir())
    assert study_reproduce.check(reruns, out, "synthetic")["lines"][1:] == [f"sync seed 0: {study_reproduce.IDENTICAL}"]
    committed = out / "synthetic" / "sync" / "seed0"
    lines = (committed / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["wall_time"] = 1e9  # timing fields never count
    update = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "update")
    changed = json.loads(lines[update])
    changed["fitness_mean"] = -1.0
    lines[0], lines[update] = json.dumps(first), json.dumps(changed)
    (committed / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    found = study_reproduce.differences(committed, kept)
    assert len(found) == 1 and "differs in fitness_mean" in found[0]
    # the one-command check runs nothing and names the change; the kept re-run is not made again either
    checked = study_reproduce.check(reruns, out, "synthetic")
    assert checked["lines"][0].endswith(": 0 of 1 re-runs identical to their committed records.")
    assert "differs in fitness_mean" in checked["lines"][1]
    before = (kept / "metrics.jsonl").stat().st_mtime_ns
    assert study_reproduce.reproduce("sync", 0, reruns, out, "synthetic") == found
    assert (kept / "metrics.jsonl").stat().st_mtime_ns == before


def test_parts_from_separate_processes_merge_into_one_result_from_one_commit(tmp_path):
    same = study_reproduce.IDENTICAL
    parts = {"a": study_reproduce.result("abc1234", [f"sync seed 100: {same}", f"sync seed 101: {same}"]),
             "b": study_reproduce.result("abc1234", ["async-G4 seed 100: record 3 (update v2) differs in theta"]),
             "c": study_reproduce.result("def5678", [f"async-G4 seed 101: {same}"])}
    for name, part in parts.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(part))
    out = tmp_path / "merged.json"
    code = study_reproduce.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out)])
    merged = json.loads(out.read_text())
    assert code == 1 and merged["commit"] == "abc1234"
    assert merged["lines"] == ["At abc1234: 2 of 3 re-runs identical to their committed records.",
                               *parts["a"]["lines"][1:], *parts["b"]["lines"][1:]]
    with pytest.raises(SystemExit, match="different commits"):
        study_reproduce.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "c.json"), "--out", str(out)])


def test_the_committed_reruns_are_what_the_committed_result_says_and_identical():
    """Issue 57: the protocol's eight re-runs (seeds 100–103 of sync and async-G4) are committed with their records;
    the one-command check (``--check``) diffs them with the study's originals, runs nothing, and gives the
    committed reproducibility.json."""
    from experiments.lib.study import REPRODUCIBILITY

    result = study_reproduce.check()
    assert result == json.loads(REPRODUCIBILITY.read_text())
    runs = result["lines"][1:]
    assert sorted(line.split(":")[0] for line in runs) == sorted(
        f"{cell} seed {seed}" for cell in ("sync", "async-G4") for seed in range(100, 104))
    assert all(line.endswith(": " + study_reproduce.IDENTICAL) for line in runs)
