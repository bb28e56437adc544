"""Resume keeps the wall clock going, and ``--resume RUN_DIR --set run.updates=N`` extends a finished run.

Through the command line's own ``main`` on a tiny random policy (seconds): a 2-update run is finished once; a copy
with its last checkpoint deleted stands for a run killed after checkpoint 1. Resuming it must continue the wall
clock from the time stored in that checkpoint (``LoopCounters.wall_time``), not from 0, so ``wall_time`` never
decreases across ``metrics.jsonl``; then the finished run is extended to 3 updates. The first run's clock runs
1000x fast, so its wall times (thousands of seconds) are far beyond anything a resumed run could reach counting
from 0: a resume that forgot the stored time cannot pass by luck.
"""

from __future__ import annotations

import json
import shutil
import time
import types
from pathlib import Path

import pytest
from run_settings import read_records, tiny_random

import esjax.train.trainer
from esjax.cli.run import main
from esjax.rundir.checkpoint import read_loop_state

TINY = tiny_random(updates=2, eval_every=1, checkpoint_every=1, population=4, eval_goals=4, max_steps=4)


def _walls(records: list[dict]) -> list[float]:
    return [r["wall_time"] for r in records if "wall_time" in r]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    fast = types.SimpleNamespace(perf_counter=lambda: 1000 * time.perf_counter(), strftime=time.strftime)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(esjax.train.trainer, "time", fast)  # the trainer's clock only (wall_time), nothing else
        assert main(["--run-dir", str(run_dir), *(x for item in TINY for x in ("--set", item))]) == 0
    assert read_records(run_dir)[-1]["wall_time"] > 1000
    return run_dir


def test_resumed_wall_time_continues_from_the_checkpoint(finished, tmp_path):
    run_dir = tmp_path / "killed"
    shutil.copytree(finished, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "2")  # as if killed right after checkpoint 1
    loop = read_loop_state(run_dir, 1)
    kept = loop["metrics_records"]  # records written up to the checkpoint; the rest are dropped and redone
    started = time.perf_counter()
    assert main(["--resume", str(run_dir)]) == 0
    resume_seconds = time.perf_counter() - started  # a clock restarted at 0 could not get past this
    records = read_records(run_dir)
    assert [r["version"] for r in records if r["kind"] == "update"] == [1, 2]
    walls = _walls(records)
    assert walls == sorted(walls), walls  # never goes back across the resume
    resumed = _walls(records[kept:])
    assert resumed and min(resumed) >= loop["wall_time"] > resume_seconds, (loop["wall_time"], resumed)
    assert _walls(records[:kept]) == _walls(read_records(finished)[:kept])  # the kept prefix is untouched
    assert len(json.loads((run_dir / "run.json").read_text())["resumes"]) == 1


def test_resume_with_more_updates_extends_a_finished_run(finished, tmp_path):
    run_dir = tmp_path / "extended"
    shutil.copytree(finished, run_dir)
    before = read_records(finished)
    end_wall = before[-1]["wall_time"]
    assert main(["--resume", str(run_dir), "--set", "run.updates=3"]) == 0
    records = read_records(run_dir)
    assert [r["version"] for r in records if r["kind"] == "update"] == [1, 2, 3]
    assert [r["version"] for r in records if r["kind"] == "eval"] == [0, 1, 2, 3]
    assert records[-1]["kind"] == "end" and records[-1]["version"] == 3
    assert [r["version"] for r in records if r["kind"] == "end"] == [3]  # the first run's end record is redone
    assert "updates: 3" in (run_dir / "config.yaml").read_text()  # the run directory says what it holds now
    walls = _walls(records)
    assert walls == sorted(walls) and walls[-1] > end_wall
    assert (run_dir / "checkpoints" / "3").is_dir()
    assert "| after | 3 |" in (run_dir / "summary.md").read_text()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["resumes"][-1]["overrides"] == ["run.updates=3"]
    assert main(["--resume", str(run_dir)]) == 0  # resuming again without the override: already finished
    assert read_records(run_dir) == records
