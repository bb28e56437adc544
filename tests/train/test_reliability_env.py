"""Env faults: an env step that raises or hangs fails only its episode, which is re-run deterministically
(same member, goal and sampling stream) up to ``env.max_retries`` times before the member's job is dropped;
a SIGKILLed process-pool worker is replaced and its sessions replayed."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from conftest import same_bits, theta_moved
from reliability import record
from run_settings import tiny_random

from envs.webshop_bridge import InProcessEnvPool, ProcessEnvPool, ShopSpec, get_shop
from envs.webshop_bridge.env import WebShopTextEnv
from esjax.config import load_config
from esjax.loop.rollout import RolloutEngine
from esjax.rundir.metrics import TIMING_FIELDS
from esjax.train.session import train

BASE = tiny_random(updates=3, eval_every=10, checkpoint_every=10, population=8, eval_goals=2, max_steps=6)
N = 8
TIMES = TIMING_FIELDS | {"tick"}


def _history(records):
    """The accepted history: per update, its version, cohort (lags) and fitness statistics."""
    keys = ("version", "lag_hist", "fitness_mean", "fitness_max", "fitness_std", "accepted")
    return [{k: r[k] for k in keys} for r in records if r["kind"] == "update"]


class StepFaults:
    """Patches WebShopTextEnv.step: ``plan(call, env)`` returns None (normal), 'raise' or a sleep in seconds."""

    def __init__(self, monkeypatch, plan):
        self.plan, self.calls, self.injected = plan, 0, []
        self.lock = threading.Lock()
        original = WebShopTextEnv.step

        def step(env, action):
            with self.lock:
                call, self.calls = self.calls, self.calls + 1
            what = self.plan(call, env)
            if what == "raise":
                self.injected.append((call, "raise"))
                raise ConnectionResetError("injected env failure")
            if what is not None:
                self.injected.append((call, f"sleep {what}"))
                time.sleep(what)
            return original(env, action)

        monkeypatch.setattr(WebShopTextEnv, "step", step)


SYNC = [*BASE, "schedule.kind=sync"]  # cohorts independent of timing: a re-run episode changes no cohort


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return train(load_config(None, SYNC), run_dir=tmp_path_factory.mktemp("reference"))


def _events(records, action=None):
    return [r for r in records if r.get("kind") == "event" and r["event"] == "env_fault"
            and (action is None or r["action"] == action)]


def test_transient_env_errors_and_hangs_are_retried(reference, monkeypatch, tmp_path):
    def plan(call, env):
        if call in (40, 41, 200):
            return "raise"
        return 2.0 if call == 90 else None

    faults = StepFaults(monkeypatch, plan)
    config = load_config(None, [*SYNC, "env.step_timeout_s=0.5", "env.max_retries=4"])  # 4 faults: never dropped
    result = train(config, run_dir=tmp_path / "run")
    events = _events(result.records)
    assert len(faults.injected) == 4 and len(events) == 4
    assert all(e["action"] == "retry" for e in events)
    reasons = sorted(e["reason"].split(":")[0] for e in events)
    assert reasons == ["error", "error", "error", "timeout"]
    assert result.version == 3
    # The failed episodes were re-run exactly: the accepted history and the final θ match a fault-free run.
    assert _history(result.records) == _history(reference.records)
    assert theta_moved(reference.records) and same_bits(result.params, reference.params)  # θ moved: it counts
    # a re-run evaluation episode replaces the failed one in the traces: the same files as the fault-free run
    traces = sorted(p.name for p in (reference.run_dir / "traces").iterdir())
    assert traces and traces == sorted(p.name for p in (result.run_dir / "traces").iterdir())
    assert all((result.run_dir / "traces" / name).read_bytes() == (reference.run_dir / "traces" / name).read_bytes()
               for name in traces)
    record("env-transient-errors", area="env",
           fault="env steps raise (3 steps) or hang for 2 s (1 step) in the middle of a run",
           injection="WebShopTextEnv.step patched to raise ConnectionResetError on chosen calls / sleep 2 s "
                     "with env.step_timeout_s=0.5 (sync schedule, compared with a fault-free sync run)",
           expected="each failed episode ends as failed and is re-run (same member, goal, sampling stream); "
                    "run goes on",
           observed=f"{len(events)} `env_fault` retry events (3 error, 1 timeout); run reached version "
                    f"{result.version}; accepted history and final θ bit-identical to the fault-free run",
           accepted_lost="no: per-update cohorts and fitness identical to the fault-free run",
           test="tests/train/test_reliability_env.py::test_transient_env_errors_and_hangs_are_retried")


def test_persistently_failing_member_is_dropped_and_counted(monkeypatch, tmp_path):
    original_start = RolloutEngine.start

    def start(self, kind, **kwargs):
        episode = original_start(self, kind, **kwargs)
        self.pool.envs[episode.row]._member = (kind, kwargs["version"], kwargs["index"])
        return episode

    monkeypatch.setattr(RolloutEngine, "start", start)
    faults = StepFaults(monkeypatch, lambda call, env: "raise" if getattr(env, "_member", None) == ("train", 1, 1)
                        else None)
    result = train(load_config(None, [*BASE, "env.max_retries=2"]), run_dir=tmp_path / "run")
    events = _events(result.records)
    assert [e["action"] for e in events] == ["retry", "retry", "drop_job"]
    assert all(e["member"] == [1, 1] for e in events) and len(faults.injected) >= 3  # both episodes fail
    updates = [r for r in result.records if r["kind"] == "update"]
    assert result.version == 3 and all(sum(r["cohort_lag_hist"]) == N for r in updates)
    after = updates[-1]
    assert after["accepted"] == 3 * N and after["discarded_by"]["abandoned"] >= 1
    record("env-persistent-member-failure", area="env",
           fault="every env step of one member (version 1, index 1) raises",
           injection="RolloutEngine.start tags env sessions with their member; WebShopTextEnv.step raises for "
                     "that member; env.max_retries=2",
           expected="2 re-runs, then the job is dropped and counted as abandoned; the run goes on",
           observed=f"events {[e['action'] for e in events]} for member [1, 1]; run reached version "
                    f"{result.version} with complete cohorts of {N}",
           accepted_lost=f"no: accepted = {after['accepted']} = {result.version} × {N}; only the failing member "
                         "is discarded (`abandoned`)",
           test="tests/train/test_reliability_env.py::test_persistently_failing_member_is_dropped_and_counted")


def _script(shop, goal: int) -> list[str]:
    """A fixed mix of actions for one session: a search, paging, clicks into an item and back, junk."""
    words = shop.goals[goal].instruction_text.split()[-4:]
    return [f"search[{' '.join(words)}]", "click[next >]", "click[< prev]", "click[bogus]", "not an action",
            "click[back to search]", f"search[{words[-1]}]", "click[next >]"]


def test_killed_process_pool_worker_is_replaced_and_replayed():
    spec = ShopSpec(kind="synthetic", num_products=100)
    shop = get_shop(spec)
    n, goals = 6, [3, 4, 5, 6, 7, 8]
    scripts = [_script(shop, g) for g in goals]
    local = InProcessEnvPool(shop, n, seed=0)
    with ProcessEnvPool(spec, n, workers=2, seed=0) as remote:
        assert remote.reset(goals)[0] == local.reset(goals)[0]
        kills = 0
        for t in range(len(scripts[0])):
            if t in (3, 6):  # SIGKILL worker 0 (sessions 0, 2, 4) between steps; at t=6 also worker 1
                victims = [remote.pids[0]] if t == 3 else remote.pids
                for pid in victims:
                    os.kill(pid, signal.SIGKILL)
                    kills += 1
                time.sleep(0.2)
            actions = [s[t] for s in scripts]
            a, b = remote.step(actions), local.step(actions)
            assert a[0] == b[0] and (a[1] == b[1]).all() and (a[2] == b[2]).all()
        assert remote.available_actions() == local.available_actions()
        restarts = remote.restarts
    assert restarts == kills == 3
    record("env-pool-worker-sigkill", area="env",
           fault="ProcessEnvPool worker processes SIGKILLed mid-episode (1, then both)",
           injection="os.kill(worker pid, SIGKILL) between steps of 6 live sessions",
           expected="dead workers replaced; their sessions reset and replayed; the next step answers as if "
                    "nothing happened",
           observed=f"{restarts} replacements; every observation, reward and done flag equal to an in-process "
                    "EnvPool given the same actions",
           accepted_lost="no: no session lost its state",
           test="tests/train/test_reliability_env.py::test_killed_process_pool_worker_is_replaced_and_replayed")
