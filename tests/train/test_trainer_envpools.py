"""The trainer drives every env pool the same way: ``env.pool: process`` (worker processes) and ``env.pool: ray``
(Ray actors on a real local Ray cluster) give exactly the metrics, traces and final θ of the in-process pool for
the same seed, and a run resumed on worker processes (in-flight episodes replayed through the pool) stays
bit-identical too.

The config is ``configs/default.yaml`` (embedded policy, packaged real WebShop data) cut to 2 updates of 4 members
× 2 goals and 16 evaluation goals, with a checkpoint at every version.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import same_bits, theta_moved
from ray_fixtures import real_ray
from run_settings import read_records

from esjax.config import ConfigError, load_config
from esjax.rundir.metrics import untimed
from esjax.train.parts import check_extras
from esjax.train.session import train

REPO = Path(__file__).resolve().parents[2]
# The main job's ES step on the kernels (σ 0.05) changes too few of 4 × 2 sampled episodes for θ to move in 2
# updates; the norm-scale step (σ 0.2) does, and the pools are compared on what they drive, not on the step.
SMALL = ["run.updates=2", "env.eval_goals=16", "es.population=4", "schedule.slots=4", "env.tasks_per_member=2",
         "es.scope=all", "es.include=['norm/scale$']", "es.sigma=0.2", "es.learning_rate=0.25",
         "run.progress=false", "run.plots=false", "run.checkpoint_every=1", "run.keep_checkpoints=10"]


def _config(pool: str):
    return load_config(REPO / "configs" / "default.yaml", [*SMALL, f"env.pool={pool}", "env.workers=2"])


def _records(run_dir: Path) -> list[dict]:
    return untimed(read_records(run_dir))


def _traces(run_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((run_dir / "traces").iterdir())}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result = train(_config("inprocess"), run_dir=tmp_path_factory.mktemp("inprocess") / "run")
    updates = [r for r in result.records if r["kind"] == "update"]
    assert result.version == 2 and any(r["fitness_std"] > 0 for r in updates)  # θ moved: the comparison bites
    return result


def _check_same(result, reference) -> None:
    assert result.version == reference.version
    assert _records(result.run_dir) == _records(reference.run_dir)
    assert _traces(result.run_dir) == _traces(reference.run_dir)
    assert theta_moved(reference.records) and same_bits(result.params, reference.params)


def test_process_pool_trains_like_the_in_process_pool(reference, tmp_path):
    result = train(_config("process"), run_dir=tmp_path / "run")
    _check_same(result, reference)
    # resumed from the checkpoint at version 1 (as if killed after it): in-flight episodes replayed in the workers
    shutil.rmtree(result.run_dir / "checkpoints" / "2")
    for path in (result.run_dir / "traces").iterdir():
        if path.name != "eval-v0.jsonl":
            path.unlink()
    resumed = train(load_config(result.run_dir / "config.yaml"), run_dir=result.run_dir, resume=True)
    _check_same(resumed, reference)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # ray.init starts its processes
def test_ray_pool_trains_like_the_in_process_pool(reference, tmp_path):
    with real_ray():
        result = train(_config("ray"), run_dir=tmp_path / "run")
    _check_same(result, reference)


def test_ray_pool_without_ray_is_a_config_error(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "ray" else object())
    with pytest.raises(ConfigError, match=r"env.pool: 'ray' needs .*esjax\[ray\]"):
        check_extras(_config("ray"))
