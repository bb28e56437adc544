"""Bring your own task: a third task, defined in this file and nowhere else, trains end to end through the public
entry point (``esjax.run``'s ``main`` with a YAML config naming it by dotted path) on a tiny random model.

The task is a counting game: goal ``g`` asks to count up to a target (3 to 6, a fixed function of ``g``) with the
actions ``add one``, ``add two`` and ``stop``; an episode runs until ``stop`` (or the step cap), and ``stop`` pays
1 − |count − target| / (target + 2), at least 0. Train, eval and test goals are disjoint ranges. It has its own
``env`` key (``largest_target``), an in-process pool, a score-mode agent, a tokenizer corpus and one behaviour
measure; nothing under esjax/ was changed for it. What is checked: the run writes its records, evaluations and
traces, θ moves, the summary shows the task's measure, a run killed after its first checkpoint resumes to the same
θ and records, and a key the task does not have is a one-line config error.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import same_bits, theta_moved
from pydantic import BaseModel, Field
from run_settings import read_records

from esjax.cli.run import main
from esjax.config import ConfigError, load_config
from esjax.errors import TaskError
from esjax.loop.envpool import collect_step, failed_step
from esjax.rundir.metrics import untimed
from esjax.task import Task
from esjax.train.parts import load_run

ACTIONS = ("add one", "add two", "stop")
SPLITS = {"train": range(0, 200), "eval": range(200, 250), "test": range(250, 300)}


class CountingOptions(BaseModel):
    """The counting game's own ``env`` key."""

    largest_target: int = Field(6, ge=3, le=20, description="targets run from 3 to this")


def target_of(goal: int, largest: int) -> int:
    """The target of goal ``goal``: a fixed function of it (the same instance every time)."""
    return 3 + (goal * 2654435761 >> 7) % (largest - 2)


class CountingSessions:
    """``n`` counting games in this process: an ``esjax.loop.protocols.EnvPool``."""

    def __init__(self, n: int, largest: int):
        self.largest = largest
        self.targets, self.counts = [0] * n, [0] * n
        self._obs, self._done = [""] * n, np.ones(n, dtype=bool)

    def __len__(self) -> int:
        return len(self.targets)

    def _page(self, row: int) -> str:
        return f"count up to {self.targets[row]}. you are at {self.counts[row]}."

    def reset_rows(self, rows: Sequence[int], goals: Sequence[int]) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for row, goal in zip(rows, goals, strict=True):
            if goal not in range(300):
                raise TaskError(f"goal {goal} is in no split")
            self.targets[row], self.counts[row], self._done[row] = target_of(goal, self.largest), 0, False
            self._obs[row] = self._page(row)
            out.append((self._obs[row], {}))
        return out

    def step(self, actions: Sequence[str | None], timeout: float | None = None):
        live = [(row, action) for row, action in enumerate(actions) if action is not None]
        outs = []
        for row, action in live:
            if action not in ACTIONS:
                outs.append(failed_step(f"error: not an action: {action!r}"))
            elif action == "stop":
                miss = abs(self.counts[row] - self.targets[row]) / (self.targets[row] + 2)
                outs.append((self._page(row), max(0.0, 1.0 - miss), True, {"count": self.counts[row]}))
            else:
                self.counts[row] += 1 if action == "add one" else 2
                outs.append((self._page(row), 0.0, False, {}))
        return collect_step(len(self), live, outs, self._obs, self._done)

    def available_actions(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        return [{"actions": list(ACTIONS)} for _ in rows]

    def instructions(self, rows: Sequence[int]) -> list[str]:
        return [f"count up to {self.targets[row]}" for row in rows]

    def close(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class Choice:
    text: str
    action: str


@dataclasses.dataclass
class Memory:
    instruction: str
    taken: list[str] = dataclasses.field(default_factory=list)


class CountingAgent:
    """Score mode: the policy ranks the three actions given the page and what was done so far."""

    score_norm = "mean"

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def new_memory(self, instruction: str) -> Memory:
        return Memory(instruction)

    def step_inputs(self, observation: str, available: dict[str, Any], memory: Memory):
        prompt = self._ids(f"{observation} done: {', '.join(memory.taken) or 'nothing'}. next:")
        choices = [Choice(action, action) for action in available["actions"]]
        return prompt, choices, [self._ids(" " + choice.text) for choice in choices]

    def remember(self, memory: Memory, available: dict[str, Any], picked: Any) -> None:
        memory.taken.append(picked.action)


class CountingTask(Task):
    """The counting game as an esjax task."""

    Options = CountingOptions
    behaviour_rows = (("stops_on_target", "stops on the target", "{:.1%}"),)

    def split(self, name: str) -> Sequence[int]:
        return SPLITS[name]

    def data_name(self) -> str:
        return "the counting game"

    def texts(self) -> Iterable[str]:
        for goal in range(50):
            yield f"count up to {target_of(goal, self.env.largest_target)}. you are at {goal % 9}."
        yield f"done: nothing, {', '.join(ACTIONS)}. next:"

    def pool(self, n: int) -> CountingSessions:
        return CountingSessions(n, self.env.largest_target)

    def score_agent(self, policy, settings, prompt_style: str) -> CountingAgent:
        return CountingAgent(policy.tokenizer)

    def behaviour(self, lines: Iterable[dict[str, Any]]) -> dict[str, float | None]:
        lines = list(lines)
        return {"stops_on_target": sum(line["reward"] == 1.0 for line in lines) / max(len(lines), 1)}


TASK = f"{__name__}:CountingTask"
CONFIG = {
    "run": {"updates": 2, "eval_every": 1, "checkpoint_every": 1, "progress": False, "plots": False},
    "model": {"source": "random"},
    "es": {"population": 4, "sigma": 0.5, "learning_rate": 0.5, "scale": "nes"},
    "schedule": {"kind": "async", "max_lag": 1, "slots": 4},
    "env": {"task": TASK, "largest_target": 5, "tasks_per_member": 4, "max_steps": 8, "eval_goals": 6},
    "agent": {"temperature": 1.0},
}


@pytest.fixture(scope="module")
def counting_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("counting")
    config = folder / "counting.yaml"
    config.write_text(json.dumps(CONFIG))  # JSON is YAML
    run_dir = folder / "run"
    assert main(["--config", str(config), "--run-dir", str(run_dir)]) == 0
    return run_dir


def test_a_task_defined_here_trains_end_to_end(counting_run):
    records = read_records(counting_run)
    assert [r["version"] for r in records if r["kind"] == "update"] == [1, 2]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["version"] for r in evals] == [0, 1, 2]
    assert all(r["goals"] == 6 and 0 <= r["score"] <= 100 for r in evals)
    assert theta_moved(records)
    traces = [json.loads(line) for line in (counting_run / "traces" / "eval-v0.jsonl").read_text().splitlines()]
    assert [line["goal"] for line in traces] == list(SPLITS["test"][:6])
    assert all(action in ACTIONS for line in traces for action, _ in line["actions"])
    assert all(line["instruction"].startswith("count up to ") for line in traces)
    assert "| stops on the target |" in (counting_run / "summary.md").read_text()  # the task's own measure
    written = load_config(counting_run / "config.yaml")
    assert written.env.task == TASK and written.env.largest_target == 5
    task, policy, params, version = load_run(counting_run)
    assert isinstance(task, CountingTask) and version == 2
    assert not same_bits(params, policy.params)  # θ_2 is not θ_0


def test_a_run_of_the_task_resumes_bit_identically(counting_run, tmp_path):
    run_dir = tmp_path / "killed"
    shutil.copytree(counting_run, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "2")  # as if killed right after checkpoint 1
    assert main(["--resume", str(run_dir)]) == 0
    assert untimed(read_records(run_dir)) == untimed(read_records(counting_run))
    assert same_bits(load_run(run_dir)[2], load_run(counting_run)[2])


def test_the_tasks_keys_are_validated_with_the_config():
    assert load_config(None, [f"env.task={TASK}"]).env.largest_target == 6
    with pytest.raises(ConfigError, match=r"env.largest_target"):
        load_config(None, [f"env.task={TASK}", "env.largest_target=2"])
    with pytest.raises(ConfigError, match=r"unknown key 'env.data'"):  # WebShop's key is not this task's
        load_config(None, [f"env.task={TASK}", "env.data=webshop_small"])
    with pytest.raises(ConfigError, match=r"env.task: .*cannot import"):
        load_config(None, ["env.task=no_such_package.tasks:Game"])
    from esjax.train.parts import build_pool, build_task

    for pool in ("process", "ray"):  # both need the task's pool recipe, which this one does not have
        env = load_config(None, [f"env.task={TASK}", f"env.pool={pool}"]).env
        with pytest.raises(ConfigError, match=rf"env.pool: '{pool}' is not available for task CountingTask \(it has "
                                              r"no pool recipe"):
            build_pool(env, build_task(env), 2)
