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
