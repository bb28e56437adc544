"""experiments/generate_seeds.py (issue 36's evidence runner): a run in its own process leaves compacted records,
its wall time and peak RSS, and the report's per-seed row is built from those records alone."""

import json

from experiments import generate_seeds

SMALL = ("run.updates=2", "run.eval_every=1", "es.population=4", "schedule.slots=4", "env.tasks_per_member=2",
         "env.eval_goals=3", "env.max_steps=5")


def test_a_run_leaves_its_records_and_the_report_reads_them(tmp_path):
    seed = generate_seeds.SEEDS[0]
    resources = generate_seeds.run_one("async-K1", seed, tmp_path, extra=SMALL)
    path = generate_seeds.run_dir("async-K1", seed, tmp_path)
    assert generate_seeds.is_done(path) and resources["seconds"] > 0 and resources["max_rss_mb"] > 100
    assert not (path / "checkpoints").exists() and sorted(p.name for p in (path / "traces").iterdir()) == [
        "eval-v0.jsonl.gz", "eval-v1.jsonl.gz", "eval-v2.jsonl.gz"]
    behaviour = json.loads((path / "behaviour.json").read_text())
    assert sorted(behaviour, key=int) == ["0", "1", "2"]
    assert all(0 <= b["invalid_action_rate"] <= 1 and b["episodes"] == 3 for b in behaviour.values())

    text = generate_seeds.report(tmp_path)
    evals = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    first, mid, last = [r for r in evals if r["kind"] == "eval"]
    row = next(line for line in text.splitlines() if line.startswith(f"| {seed} |"))
    assert f"| {first['score']:.1f} | {mid['score']:.1f} (v1) | {last['score']:.1f} |" in row
    assert "one seed: no interval" in text and "Not yet run: seeds 201, 202, 203, 204" in text
    assert "sync vs async-K1" not in text  # no sync run: no pair
