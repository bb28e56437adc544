"""Failure modes of a run that must not be silent: a cohort of equal fitness (zero ES gradient), Ctrl-C, a
start that fails, a missing optional package; and what run.json / summary.md record about the run."""

from __future__ import annotations

import functools
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from run_settings import SMALL_RANDOM

from esjax.cli import run as run_cli_module
from esjax.cli.common import run_cli
from esjax.config import load_config
from esjax.train import session
from esjax.train.hooks import Hooks
from esjax.train.session import Trainer, train

REPO = Path(__file__).resolve().parents[2]

# A tiny random policy on a 30-product synthetic shop; with one step per episode nothing can be bought, so
# every member scores 0 and every cohort has equal fitness.
SMALL = SMALL_RANDOM


def _cli(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(run_cli_module.main, argv)
    return exit_info.value.code


def _set(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_constant_fitness_is_warned_once_and_counted_and_the_run_is_recorded(tmp_path, capsys):
    overrides = [*SMALL, "env.max_steps=1", "run.updates=2"]
    result = train(load_config(None, overrides), run_dir=tmp_path / "flat", overrides=overrides)
    events = [r for r in result.records if r.get("kind") == "event" and r["event"] == "constant_fitness"]
    assert [e["version"] for e in events] == [1, 2] and all(e["fitness"] == 0.0 for e in events)
    err = capsys.readouterr().err
    assert err.count("warning: update 1: every member of the cohort has fitness 0") == 1
    assert "warning: update 2" not in err  # once per run; the rest are counted
    summary = (result.run_dir / "summary.md").read_text()
    assert ("2 update(s) had a cohort whose fitnesses were all equal (zero ES gradient, no learning signal): "
            "versions 1, 2") in summary
    # run.json and summary.md: commit, overrides, machine
    meta = json.loads((result.run_dir / "run.json").read_text())
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    expected = head.stdout.strip() if head.returncode == 0 else "unknown"
    assert meta["git_commit"] == expected and meta["overrides"] == overrides
    assert meta["machine"]["cores"] and meta["machine"]["cpu"] and meta["mesh"] == {"data": 1, "model": 1}
    assert f"- commit: {expected}" in summary and "`--set env.max_steps=1`" in summary
    assert f"- machine: {meta['machine']['cpu']}" in summary


def test_ctrl_c_names_the_checkpoint_and_the_resume_command_that_works(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    overrides = [*SMALL, "env.max_steps=3", "run.updates=3", "run.checkpoint_every=1"]
    hooks = Hooks()

    @hooks.on_version
    def interrupt_after_update_2(trainer, record):  # version 2 is applied and checkpointed, then Ctrl-C
        if record.version + 1 == 2:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # the CLI's train() with the hook
        patch.setattr(session, "train", functools.partial(session.train, hooks=hooks))
        assert _cli(["--run-dir", str(run_dir), *_set(overrides)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2] == (f"interrupted at version 2; latest checkpoint: version 2 "
                       f"({run_dir.absolute() / 'checkpoints' / '2'})")
    assert err[-1] == f"resume with: python -m esjax.run --resume {run_dir}"
    assert _cli(shlex.split(err[-1].removeprefix("resume with: "))[3:]) == 0  # the printed command resumes
    assert json.loads((run_dir / "run.json").read_text())["resumes"][0]["overrides"] == []
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in records if r["kind"] == "update"] == [1, 2, 3]


def test_failed_or_interrupted_start_leaves_no_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default run directory is runs/<name>-<time> under the working directory
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text("{}")  # a model folder esjax cannot run
    assert _cli(_set([*SMALL, "model.source=hf", f"model.path={bad}"])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model.path: ") and "model_type" in err[0]
    assert not (tmp_path / "runs").exists()

    # Ctrl-C while the first update is still being computed: nothing to resume, no directory left behind
    def interrupt(self, *args):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "run", interrupt)
    assert _cli(["--run-dir", str(tmp_path / "new" / "run"), *_set([*SMALL, "env.max_steps=1"])]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"interrupted before the first update: no checkpoint was written and the new run directory "
                       f"{tmp_path / 'new' / 'run'} was removed")
    assert not (tmp_path / "new").exists()


def test_tensorboard_without_its_extra_is_one_line_at_start(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import tensorboardX raises ImportError
    run_dir = tmp_path / "tb"
    assert _cli(["--run-dir", str(run_dir), *_set([*SMALL, "run.tensorboard=true"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.tensorboard" in err[0] and "pip install 'esjax[tb]'" in err[0]
    assert not run_dir.exists()


def test_git_commit_is_unknown_outside_a_checkout(tmp_path):
    from esjax.rundir.directory import git_commit

    package = tmp_path / "site" / "esjax"
    package.mkdir(parents=True)
    assert git_commit(package) == {"commit": "unknown", "dirty": None}


def test_constant_fitness_can_stop_the_run_with_a_final_eval_and_checkpoint(tmp_path, capsys):
    overrides = [*SMALL, "env.max_steps=1", "run.updates=6", "run.checkpoint_every=5",
                 "run.max_constant_fitness_updates=2"]
    result = train(load_config(None, overrides), run_dir=tmp_path / "stop", overrides=overrides)
    assert result.version == 2  # every cohort is flat: the second update in a row ends the run
    kinds = [(r["kind"], r.get("event"), r["version"]) for r in result.records]
    assert ("event", "stopped", 2) in kinds and kinds[-1] == ("end", None, 2)
    assert [r["version"] for r in result.records if r["kind"] == "eval"] == [0, 2]  # the final evaluation
    assert not any(r["kind"] == "update" and r["version"] > 2 for r in result.records)
    assert (result.run_dir / "checkpoints" / "2").is_dir()
    assert "stopping at version 2: 2 updates in a row had a constant cohort fitness" in capsys.readouterr().err
    assert "- stopped early at version 2: 2 updates in a row" in (result.run_dir / "summary.md").read_text()


def test_human_goal_set_is_selectable_on_real_data(tmp_path):
    """env.goals=human builds WebShop's human-instruction goals (here from a small items_human_ins.json written for
    real products of the packaged set); synthetic data refuses it, naming the key."""
    from envs.webshop_bridge import load_webshop
    from esjax.config import ConfigError
    from esjax.train.parts import load_task

    asins = [p.asin for p in load_webshop("webshop_small").catalog.products[:3]]
    human = {asin: [{"instruction": f"i need item number {i}.", "instruction_attributes": ["quality"],
                     "instruction_options": []}] for i, asin in enumerate(asins)}
    path = tmp_path / "items_human_ins.json"
    path.write_text(json.dumps(human))
    config = load_config(None, ["env.data=webshop_small", "env.goals=human", f"env.human_file={path}"])
    shop = load_task(config.env).data
    assert len(shop.goals) == 3 and {g.kind for g in shop.goals} == {"human"}
    assert {g.asin for g in shop.goals} == set(asins)
    assert shop.goals[0].instruction_text.startswith("i need item number")
    with pytest.raises(ConfigError, match="env.goals: 'human' needs real WebShop data"):
        load_config(None, ["env.goals=human"])
    with pytest.raises(ConfigError, match="env.human_file"):
        load_config(None, ["env.data=webshop_small", "env.goals=human", f"env.human_file={tmp_path / 'none.json'}"])
    with pytest.raises(ConfigError, match="items_human_ins.json"):  # the packaged set has no human file
        load_task(load_config(None, ["env.data=webshop_small", "env.goals=human"]).env)
