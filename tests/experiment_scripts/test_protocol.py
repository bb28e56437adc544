"""The staleness study's pre-registration, checked from git history (experiments/protocol_check.py)."""

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from experiments import protocol_check, protocol_power, staleness_grid
from experiments.lib import study
from experiments.lib.grid import select_cells

ROOT = Path(__file__).resolve().parents[2]


def _shallow(repo: Path) -> bool:
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--is-shallow-repository"], capture_output=True,
                         text=True)
    return out.returncode != 0 or out.stdout.strip() == "true"


def test_protocol_precedes_every_study_record():
    if _shallow(ROOT):
        pytest.skip("not a full git clone: history cannot prove the order")
    assert protocol_check.problems(ROOT) == []


def _commit(repo: Path, path: str, text: str, message: str) -> None:
    target = repo / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    subprocess.run(["git", "-C", str(repo), "add", path], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message],
                   check=True)


def test_a_record_committed_with_or_before_the_protocol_is_reported(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    _commit(tmp_path, "experiments/results/study/sync/seed100/run.json", "{}", "early record")
    _commit(tmp_path, "experiments/protocol.md", "# protocol", "protocol")
    _commit(tmp_path, "experiments/results/study/sync/seed101/run.json", "{}", "record after")
    found = protocol_check.problems(tmp_path)
    assert len(found) == 1 and "seed100" in found[0]


def test_records_after_the_protocol_pass_and_no_protocol_fails(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    _commit(tmp_path, "README.md", "x", "start")
    assert protocol_check.problems(tmp_path) == ["experiments/protocol.md is not committed"]
    _commit(tmp_path, "experiments/protocol.md", "# protocol", "protocol")
    _commit(tmp_path, "experiments/results/study/sync/seed100/run.json", "{}", "record")
    assert protocol_check.problems(tmp_path) == []


# ------------------------------------------------------------------ the margin and n, computed by the protocol's rule
def test_margin_and_n_follow_from_the_committed_main_job_runs(capsys):
    """issue 31's frozen main job (seeds 0-7, committed) sets the study's margin and n: G 9.66 -> m 3.3, n 24."""
    power = study.protocol_power()
    assert power.gain == pytest.approx(9.66, abs=0.01) and power.margin == 3.3
    assert power.final_sd == pytest.approx(2.34, abs=0.01) and power.sigma_d == pytest.approx(4.48, abs=0.01)
    assert power.n == 24 and power.feasible
    assert protocol_power.main(["--json"]) == 0  # the command prints the same numbers
    assert json.loads(capsys.readouterr().out) == dataclasses.asdict(power)


def test_power_rule_rounds_down_the_margin_up_to_even_n_and_refuses_over_40():
    initial = [60.0] * 8
    steady = study.power_from_scores(initial, [70.0, 70.5, 69.5, 70.2, 69.8, 70.1, 69.9, 70.0])
    assert steady.margin == 3.5 and steady.n == 8  # at least 8 seeds, even when fewer would do
    noisy = study.power_from_scores(initial, [62.0, 70.0, 78.0, 64.0, 76.0, 66.0, 74.0, 68.0])
    assert noisy.margin == 3.4 and noisy.n > 40 and not noisy.feasible  # mean gain 9.75: 3.41 rounds down
    flat = study.power_from_scores(initial, [60.0] * 8)
    assert flat.margin == 0.0 and flat.n is None and not flat.feasible  # no gain: no margin, not run
    assert not study.power_from_scores(initial, [60.0, 60.1] * 4).feasible
    mid = study.power_from_scores(initial, [67.0, 71.0, 69.5, 72.5, 68.0, 70.0, 73.0, 66.5])
    assert mid.n % 2 == 0 and 8 <= mid.n <= 40


def test_the_study_runs_every_cell_of_a_seed_in_one_shard_from_seed_100():
    cells = select_cells("sync,async-G4,delay8,all-stale-k1")
    seeds = tuple(range(100, 124))
    shards = [staleness_grid.plan(cells, seeds, (i, 2)) for i in range(2)]
    for i, runs in enumerate(shards):
        assert {s for _, s in runs} == set(seeds[i::2])
        names = sorted(c.name for c in cells)
        assert all(sorted(c.name for c, s in runs if s == seed) == names for seed in seeds[i::2])
    assert sorted((c.name, s) for runs in shards for c, s in runs) == sorted((c.name, s) for c in cells for s in seeds)
    assert [s for _, s in shards[0]][:4] == [100] * 4  # seed-major: every cell of seed 100 first


def test_first_seed_lists_the_study_seeds(tmp_path, capsys):
    args = ["--preset", "real", "--cells", "sync,delay8", "--first-seed", "100", "--seeds", "3", "--out", str(tmp_path)]
    assert staleness_grid.main([*args, "--list"]) == 0
    assert [line.split()[1:] for line in capsys.readouterr().out.splitlines()] == [
        [cell, f"seed{s}"] for s in (100, 101, 102) for cell in ("sync", "delay8")]
    with pytest.raises(SystemExit, match="--first-seed needs --seeds"):
        staleness_grid.main(["--preset", "real", "--first-seed", "100", "--out", str(tmp_path), "--list"])
