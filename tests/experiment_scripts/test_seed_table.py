"""experiments/seed_table.py: the per-seed table of a config's runs names the machine from each run's run.json, and
README's main-job section names that machine (issue 57: it named another)."""

import json
import re
from pathlib import Path

import yaml

from experiments import seed_table
from experiments.lib import REPO, RESULTS
from experiments.lib.runs import machines_of


def _main_job_machine_line() -> str:
    rows = [{"machines": machines_of(json.loads((d / "run.json").read_text()))}
            for d in sorted((RESULTS / "main-job").glob("seed*"))]
    return seed_table.machine_line(rows)


def test_the_main_jobs_machine_comes_from_its_run_json():
    assert _main_job_machine_line() == ("Machine (each run's run.json, resumes included): AMD EPYC, 2 cores "
                                        "(all 8 runs).")


def test_readme_names_the_machine_the_main_jobs_records_name():
    readme = (REPO / "README.md").read_text()
    section = readme.split("### What the main job measures")[1].split("\n## ")[0]
    cpu = re.search(r": (.+?), \d+ cores \(all", _main_job_machine_line()).group(1)
    assert cpu in section and "Xeon" not in section


def _run(run_dir: Path, seed: int, machines: list[str]) -> None:
    run_dir.mkdir(parents=True)
    records = [{"kind": "eval", "version": v, "score": s, "success_rate": 0.1} for v, s in ((0, 60.0), (30, 70.0))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "summary.md").write_text("- wall-clock: 300.0 s\n")
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"run": {"seed": seed}}))
    info = {"git_commit": "abcdef0123", "machine": {"cpu": machines[0], "cores": 2},
            "resumes": [{"machine": {"cpu": m, "cores": 2}} for m in machines[1:]]}
    (run_dir / "run.json").write_text(json.dumps(info))


def test_mixed_machines_are_each_counted(tmp_path):
    _run(tmp_path / "seed0", 0, ["AMD EPYC"])
    _run(tmp_path / "seed1", 1, ["Intel(R) Xeon(R) Processor", "AMD EPYC"])  # resumed on another machine
    text = seed_table.table(seed_table.seed_rows(tmp_path))
    assert text.rstrip().endswith("Machine (each run's run.json, resumes included): AMD EPYC, 2 cores (2 of 2 runs); "
                                  "Intel(R) Xeon(R) Processor, 2 cores (1 of 2 runs).")
    assert "| 0 | 60.0 | 70.0 | 70.0 | **+10.0** |" in text and "5.0 min | abcdef0 |" in text


def test_steps_per_episode_come_from_the_gzipped_traces_of_the_first_and_last_evaluation(tmp_path):
    """BabyAI's Done-means report steps per episode before and after: read from the committed (gzipped) traces."""
    import gzip

    for seed, (before, after) in ((0, ([10, 20], [4, 6])), (1, ([30, 10], [8, 8]))):
        run_dir = tmp_path / f"seed{seed}"
        _run(run_dir, seed, ["AMD EPYC"])
        (run_dir / "traces").mkdir()
        for version, steps in ((0, before), (30, after)):
            lines = "".join(json.dumps({"goal": g, "steps": n, "reward": 0.5}) + "\n" for g, n in enumerate(steps))
            (run_dir / "traces" / f"eval-v{version}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    rows = seed_table.seed_rows(tmp_path)
    assert [r["steps"] for r in rows] == [(15.0, 5.0), (20.0, 8.0)]
    text = seed_table.table(rows)
    assert "| 15.0 → 5.0 |" in text and "steps per episode 17.5 → 6.5." in text
    assert "success rate Δ +0.0 points" in text
