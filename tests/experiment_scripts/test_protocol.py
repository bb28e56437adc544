"""The staleness study's pre-registration, checked from git history (experiments/protocol_check.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments import protocol_check  # noqa: E402


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
