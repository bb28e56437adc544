"""BabyAI plugged in through the task seam (``env.task: babyai``, envs/babyai_bridge/task.py): configs/babyai.yaml
trains end to end through the public entry point, and the trainer's guarantees hold on it (issue 55, item 7): the
eval and export round trip, bit-identical resume from a checkpoint and after Ctrl-C, the process and Ray pools
giving the in-process run's records; one pool serves every split by seed, and its keys are validated."""

from __future__ import annotations

import json
import shutil

import pytest

from esjax.config import ConfigError, load_config
from experiments.lib import REPO

BABYAI = REPO / "configs" / "babyai.yaml"
TINY = ["run.updates=2", "run.eval_every=2", "run.checkpoint_every=1", "run.plots=false", "run.progress=false",
        "es.population=4", "schedule.slots=4", "env.tasks_per_member=2", "env.eval_goals=4", "env.max_steps=24",
        "env.levels=[GoToLocal]"]  # the level the shipped policy wins most: members' fitness differ, so θ moves


@pytest.fixture(scope="module")
def babyai_run(tmp_path_factory):
    """configs/babyai.yaml, tiny, trained once through esjax.run (checkpoints after updates 1 and 2)."""
    pytest.importorskip("minigrid")
    from esjax.cli.run import main

    run_dir = tmp_path_factory.mktemp("babyai") / "run"
    args = ["--config", str(BABYAI), "--run-dir", str(run_dir)]
    for item in TINY:
        args += ["--set", item]
    assert main(args) == 0
    return run_dir


def test_babyai_yaml_trains_through_esjax_run_and_its_export_scores_alike(babyai_run, tmp_path, capsys):
    from esjax.rundir.metrics import read_metrics

    run_dir = babyai_run
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["version"] for r in records if r.get("kind") == "update"] == [1, 2]
    evals = [r for r in records if r.get("kind") == "eval"]
    assert [e["version"] for e in evals] == [0, 2] and all(0 <= e["score"] <= 100 for e in evals)
    assert any(r["kind"] == "update" and r["fitness_max"] > r["fitness_min"] and r["update_norm"] > 0
               for r in records)
    lines = [json.loads(x) for x in (run_dir / "traces" / "eval-v0.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(1_100_000_000 <= line["goal"] < 1_100_100_000 for line in lines)  # test seeds
    assert all(line["instruction"].startswith("go to") and 1 <= line["steps"] <= 24 for line in lines)
    assert all(action in ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
               for line in lines for action, _ in line["actions"])
    summary = (run_dir / "summary.md").read_text()
    assert "episodes won" in summary and "steps / episode" in summary
    # the eval and export round trip: the exported folder, evaluated alone with the run's settings (its esjax.json),
    # scores exactly what the run's last evaluation did, goal for goal
    from esjax.cli.eval import main as eval_main
    from esjax.cli.export import main as export_main

    assert export_main(["--run-dir", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    assert eval_main(["--model", str(tmp_path / "hf"), "--json"]) == 0
    alone = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert alone["score"] == pytest.approx(evals[-1]["score"])
    final = [json.loads(x) for x in (run_dir / "traces" / "eval-v2.jsonl").read_text().splitlines()]
    assert alone["goal_indices"] == [line["goal"] for line in final]
    assert alone["rewards"] == pytest.approx([line["reward"] for line in final])
    # episodes played one at a time (--batch 1) score the same, goal for goal
    assert eval_main(["--model", str(tmp_path / "hf"), "--json", "--batch", "1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rewards"] == pytest.approx(alone["rewards"])
    # BabyAI's success is any positive reward (minigrid's shrinks with the steps taken; WebShop's rule, reward 1.0,
    # would count none): the run's records and the standalone evaluation agree on it
    for record, rewards in ((evals[0], [line["reward"] for line in lines]), (evals[-1], alone["rewards"])):
        assert record["success_rate"] == pytest.approx(sum(r > 0 for r in rewards) / len(rewards))
    assert alone["success"] == [r > 0 for r in alone["rewards"]] and alone["success_rate"] == evals[-1]["success_rate"]
    assert [line["success"] for line in lines + final] == [line["reward"] > 0 for line in lines + final]  # traces too
    assert any(0 < r < 1 for r in alone["rewards"] + [line["reward"] for line in lines])  # won, not full marks


def test_a_babyai_run_resumes_bit_identically_from_its_first_checkpoint(babyai_run, tmp_path):
    from conftest import same_bits
    from run_settings import read_records

    from esjax.cli.run import main
    from esjax.rundir.metrics import untimed
    from esjax.train.parts import load_run

    run_dir = tmp_path / "killed"
    shutil.copytree(babyai_run, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "2")  # as if killed right after checkpoint 1
    assert main(["--resume", str(run_dir)]) == 0
    assert untimed(read_records(run_dir)) == untimed(read_records(babyai_run))
    assert same_bits(load_run(run_dir)[2], load_run(babyai_run)[2])
    for name in ("eval-v0.jsonl", "eval-v2.jsonl"):
        assert (run_dir / "traces" / name).read_bytes() == (babyai_run / "traces" / name).read_bytes()


def test_one_pool_resets_each_row_on_its_seeds_split():
    pytest.importorskip("minigrid")
    from envs.babyai_bridge.env import BabyAITextEnv
    from envs.babyai_bridge.levels import SPLITS
    from envs.babyai_bridge.task import SeedPool, split_of_seed

    pool = SeedPool(3)
    seeds = [5, SPLITS["eval"].base + 7, SPLITS["test"].base + 11]
    got = pool.reset_rows([0, 1, 2], seeds)
    for (observation, info), seed in zip(got, seeds):
        split, goal = split_of_seed(seed)
        assert (observation, info) == BabyAITextEnv(split).reset(goal)
        assert info["seed"] == seed
    with pytest.raises(ValueError, match="no BabyAI split"):
        split_of_seed(SPLITS["test"].base + SPLITS["test"].size)


def test_behaviour_counts_wins_by_positive_reward_and_both_step_limits():
    from envs.babyai_bridge.task import BabyAITask

    lines = [{"reward": 0.82, "steps": 10, "end": "no_action"}, {"reward": 0.0, "steps": 64, "end": "env_step_limit"},
             {"reward": 0.0, "steps": 128, "end": "max_steps"}, {"reward": 0.0, "steps": 3, "end": "env_failure"}]
    assert BabyAITask.behaviour(None, lines) == {"success_rate": 0.25, "steps_per_episode": 51.25,
                                                 "step_limit_hits": 0.5}
    assert BabyAITask.is_success(0.09999999999999998) and not BabyAITask.is_success(0.0)  # 1 - 0.9: the least win


def test_splits_never_overlap_and_bad_keys_name_themselves():
    config = load_config(BABYAI)
    from esjax.task import task_class

    task = task_class(config.env.task)(config.env)
    train, eval_, test = (task.split(name) for name in ("train", "eval", "test"))
    assert train[-1] < eval_[0] and eval_[-1] < test[0]
    with pytest.raises(ConfigError, match="env.levels"):
        load_config(BABYAI, ["env.levels=[GoToNowhere]"])
    with pytest.raises(ConfigError, match="env.level_weights"):
        load_config(BABYAI, ["env.level_weights=[1, 2]"])
    with pytest.raises(ConfigError, match="env.data"):  # a WebShop key is not a BabyAI key
        load_config(BABYAI, ["env.data=webshop_small"])


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # ray.init starts its processes
@pytest.mark.parametrize("pool", ["process", "ray"])
def test_process_and_ray_pools_train_babyai_like_the_in_process_pool(babyai_run, tmp_path, pool):
    """``env.pool: process`` and ``env.pool: ray``: BabyAI sessions in worker processes or Ray actors, each built from
    the task's picklable recipe, give the in-process run's records, traces and θ exactly."""
    import contextlib

    from conftest import same_bits
    from ray_fixtures import real_ray
    from run_settings import read_records

    from esjax.rundir.metrics import untimed
    from esjax.train.parts import load_run
    from esjax.train.session import train

    with real_ray() if pool == "ray" else contextlib.nullcontext():
        result = train(load_config(BABYAI, [*TINY, f"env.pool={pool}", "env.workers=2"]), run_dir=tmp_path / "run")
    assert untimed(read_records(result.run_dir)) == untimed(read_records(babyai_run))
    for name in ("eval-v0.jsonl", "eval-v2.jsonl"):
        assert (result.run_dir / "traces" / name).read_bytes() == (babyai_run / "traces" / name).read_bytes()
    assert same_bits(result.params, load_run(babyai_run)[2])


def test_sigint_keeps_a_checkpoint_of_a_babyai_run_and_its_resume_is_bit_identical(tmp_path, child_env):
    """Ctrl-C sent to a real ``python -m esjax.run --config configs/babyai.yaml`` child before its first checkpoint:
    it checkpoints the tick and exits 130; the resume ends where an uninterrupted run ends."""
    pytest.importorskip("minigrid")
    import subprocess
    import sys

    from conftest import interrupt_after_first_update, same_bits, theta_moved
    from run_settings import read_records

    from esjax.rundir.metrics import untimed
    from esjax.train.session import train

    overrides = [*TINY, "run.updates=5", "run.eval_every=5", "run.checkpoint_every=1000", "run.checkpoint_minutes=null"]
    run_dir = tmp_path / "interrupted"
    argv = [sys.executable, "-m", "esjax.run", "--config", str(BABYAI), "--run-dir", str(run_dir)]
    for item in overrides:
        argv += ["--set", item]
    proc = subprocess.Popen(argv, env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    err = interrupt_after_first_update(proc, run_dir)
    assert proc.returncode == 130, err[-2000:]
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert len(steps) == 1 and 1 <= steps[0] < 5, err[-2000:]
    resumed = train(load_config(run_dir / "config.yaml"), run_dir=run_dir, resume=True)
    reference = train(load_config(BABYAI, overrides), run_dir=tmp_path / "reference")
    assert theta_moved(reference.records) and same_bits(resumed.params, reference.params)
    assert untimed(read_records(run_dir)) == untimed(read_records(reference.run_dir))
