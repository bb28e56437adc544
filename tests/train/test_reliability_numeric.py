"""Numerical faults: an ES update that would make θ non-finite is rejected (θ and t kept, the cohort dropped
and counted, an event logged) and the run goes on; past ``run.max_nonfinite_updates`` it stops cleanly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import reward_by_trace, same_bits, theta_moved
from reliability import record
from run_settings import tiny_random

from esjax.cli.common import run_cli
from esjax.config import load_config
from esjax.train.parts import load_run
from esjax.train.session import RunAborted, train

# The trainer tests' TINY run, shortened: 3 updates, evaluations only at the start and the end.
BASE = tiny_random(updates=3, eval_every=10, checkpoint_every=1, population=8, eval_goals=2, max_steps=6)
N = 8


class PoisonUpdates:
    """Wraps the ES engine's update: on the chosen calls (0-based) the returned θ is all NaN."""

    def __init__(self, module, bad):
        self.module, self.original, self.bad = module, module.update, bad
        self.calls = 0
        self.inputs = []  # (call, θ passed in) for every call

    def __call__(self, config, state, versions, indices, fitness):
        call, self.calls = self.calls, self.calls + 1
        self.inputs.append((call, jax.device_get(state.params), int(state.version)))
        new_state, metrics = self.original(config, state, versions, indices, fitness)
        if self.bad(call):
            new_state = new_state._replace(params=jax.tree.map(lambda x: x * jnp.nan, new_state.params))
        return new_state, metrics


@pytest.fixture
def poison(monkeypatch):
    from esjax.es import step as module

    def install(bad):
        wrapper = PoisonUpdates(module, bad)
        monkeypatch.setattr(module, "update", wrapper)
        return wrapper

    return install


def test_nonfinite_update_is_rejected_and_the_run_goes_on(poison, tmp_path, monkeypatch):
    from esjax.loop.rollout import RolloutEngine

    reward_by_trace(monkeypatch, RolloutEngine)  # fitness varies, θ moves: the checkpoint comparison below counts
    wrapper = poison(lambda call: call in (1, 2))  # the 2nd and 3rd updates blow up
    result = train(load_config(None, BASE), run_dir=tmp_path / "run")
    assert result.version == 3 and wrapper.calls == 5
    events = [r for r in result.records if r.get("kind") == "event" and r["event"] == "nonfinite_update"]
    updates = [r for r in result.records if r["kind"] == "update"]
    assert [e["at_version"] for e in events] == [1, 1] and all(e["members"] == N for e in events)
    # θ and t were kept: the call after each rejected one saw exactly the θ (and version) the rejected one saw.
    for bad_call in (1, 2):
        _, theta_bad, v_bad = wrapper.inputs[bad_call]
        _, theta_next, v_next = wrapper.inputs[bad_call + 1]
        assert v_bad == v_next == 1 and same_bits(theta_bad, theta_next)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(result.params))
    # Every applied cohort is complete and counted once; the rejected ones are discarded, not accepted.
    last = updates[-1]
    assert [r["version"] for r in updates] == [1, 2, 3]
    assert all(sum(r["cohort_lag_hist"]) == N for r in updates)
    assert last["accepted"] == 3 * N and last["discarded_by"]["rejected_update"] == 2 * N
    assert last["rejected_updates"] == 2
    _, _, params, version = load_run(result.run_dir)  # the final checkpoint is finite and loadable
    assert version == 3 and theta_moved(result.records) and same_bits(params, result.params)
    record("numeric-nonfinite-update", area="numerical", fault="an ES update produces NaN parameters (twice)",
           injection="esjax.es.step.update wrapped to return θ·NaN on its 2nd and 3rd call",
           expected="update rejected: θ and version kept, cohort dropped and counted, `nonfinite_update` event; "
                    "run continues to the last version",
           observed=f"{len(events)} `nonfinite_update` events at version 1; next update saw the identical θ; "
                    f"run reached version {result.version}; {last['discarded_by']['rejected_update']} members "
                    f"discarded as `rejected_update`; final θ finite",
           accepted_lost=f"no: {len(updates)} applied cohorts of {N}, accepted = {last['accepted']}",
           test="tests/train/test_reliability_numeric.py::test_nonfinite_update_is_rejected_and_the_run_goes_on")


def test_too_many_nonfinite_updates_stop_the_run_cleanly(poison, tmp_path, capsys):
    poison(lambda call: call >= 1)  # version 1 is fine and checkpointed, then every update blows up
    run_dir = tmp_path / "run"
    config = load_config(None, [*BASE, "run.max_nonfinite_updates=2"])
    with pytest.raises(RunAborted) as info:
        train(config, run_dir=run_dir)
    message = str(info.value)
    assert "\n" not in message and "run.max_nonfinite_updates=2" in message
    with pytest.raises(SystemExit) as exit_info:  # through the CLI wrapper: one line, exit code 2
        run_cli(lambda argv: (_ for _ in ()).throw(info.value))
    # the error is one line (a zero-gradient warning of the poisoned cohorts may precede it)
    errors = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning:")]
    assert exit_info.value.code == 2 and len(errors) == 1 and errors[0].startswith("error: stopping:")
    _, _, params, version = load_run(run_dir)
    assert version == 1 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
    record("numeric-too-many-nonfinite", area="numerical",
           fault="every ES update after the first produces NaN parameters",
           injection="esjax.es.step.update wrapped to return θ·NaN from its 2nd call on; "
                     "run.max_nonfinite_updates=2",
           expected="clean stop with a one-line error after 2 rejections; last good checkpoint intact",
           observed=f"RunAborted, CLI prints one line and exits {exit_info.value.code}; "
                    f"latest checkpoint loads at version {version} with finite θ",
           accepted_lost="no: the checkpoint at version 1 holds every applied update",
           test="tests/train/test_reliability_numeric.py::test_too_many_nonfinite_updates_stop_the_run_cleanly")


def test_coordinator_drops_a_rejected_cohort_and_keeps_counting():
    """The coordinator's side of a rejection, without a model: t kept, members discarded, state round-trips."""
    import json

    from esjax.loop.coordinator import Coordinator, CoordinatorConfig, RejectedUpdate, apply_cohorts
    from esjax.loop.staleness import Async
    from esjax.loop.types import Result

    applied = []

    def apply_update(cohort):
        if len(applied) == 0 and not getattr(apply_update, "rejected", False):
            apply_update.rejected = True
            raise RejectedUpdate("would make parameters non-finite")
        applied.append(cohort.version)
        return {}

    coord = Coordinator(CoordinatorConfig(2, 1), Async())
    records = []
    for _ in range(3):
        jobs = coord.next_jobs(2)
        for job in jobs:
            coord.report(Result(job.job_id, job.member, 1.0 + job.job_id, 1.0))
            records += apply_cohorts(coord, apply_update)
    totals = coord.totals()
    assert [r.version for r in records] == [0, 1] and applied == [0, 1] and coord.version == 2
    assert totals["rejected_updates"] == 1 and totals["discarded_by"]["rejected_update"] == 2
    assert totals["accepted"] == 4 and totals["lag_hist"] == [4, 0]
    assert coord.rejections == [{"version": 0, "members": [[0, 0], [0, 1]],
                                 "reason": "would make parameters non-finite"}]
    state = json.loads(json.dumps(coord.state_dict()))
    again = Coordinator.from_state_dict(CoordinatorConfig(2, 1), Async(), state)
    assert again.totals() == totals
