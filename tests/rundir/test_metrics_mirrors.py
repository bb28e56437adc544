"""The optional mirrors of metrics.jsonl: a Weights & Biases run (offline here: no network) that a resume continues,
and TensorBoard's missing extra named in one line."""

from __future__ import annotations

import time

import pytest
from run_settings import SMALL_RANDOM

from esjax.config import load_config
from esjax.train.session import train

pytest.importorskip("wandb", reason="the optional W&B extra (installed by the test extra)")

SMALL = [*SMALL_RANDOM, "env.max_steps=2", "run.wandb=true", "run.wandb_project=esjax-tests", "run.eval_every=1"]


def _logged(run_dir, expected: tuple[bytes, ...] = (), timeout: float = 60.0) -> bytes:
    """The offline W&B run files' bytes, once they hold every ``expected`` key: W&B's service process writes them
    after ``finish()`` returns, so a read right away can see only the file header (this test flaked on that)."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        logged = b"".join(f.read_bytes() for f in files)
        if (files and all(key in logged for key in expected)) or time.monotonic() > deadline:
            assert files, "no offline W&B run was written"
            return logged
        time.sleep(0.2)


def test_wandb_mirror_logs_updates_and_evals_and_a_resume_continues_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    train(load_config(None, [*SMALL, "run.updates=1"]), run_dir=run_dir)
    run_id = (run_dir / "wandb_id").read_text().strip()
    keys = (b"update/fitness_mean", b"eval/score", b"eval/success_rate", b"esjax-tests", run_id.encode())
    logged = _logged(run_dir, keys)
    for key in keys:
        assert key in logged, key
    # a resume that extends the run logs to the same W&B run id
    extended = train(load_config(None, [*SMALL, "run.updates=2"]), run_dir=run_dir, resume=True)
    assert extended.version == 2 and (run_dir / "wandb_id").read_text().strip() == run_id
    runs = {p.name.rsplit("-", 1)[-1] for p in (run_dir / "wandb").glob("offline-run-*")}
    assert runs == {run_id}
