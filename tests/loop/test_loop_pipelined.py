"""The pipelined tick (env steps and next prompts of each call's rows while later calls compute) changes nothing
a run records: the embedded policies on real WebShop, serial and pipelined, give the same records, traces and θ, in
score mode and in generate mode."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from conftest import same_bits, theta_moved
from run_settings import embedded

import esjax.loop.generate_rollout as generate
import esjax.train.parts as parts
from esjax.config import load_config
from esjax.loop.generate_rollout import GenerateEngine
from esjax.loop.rollout import RolloutEngine
from esjax.rundir.metrics import untimed
from esjax.train.session import train

REPO = Path(__file__).resolve().parents[2]
GENERATE = REPO / "configs" / "generate.yaml"
#: generate.yaml's policy in a few small updates, evaluations between: several versions' lanes in a tick
GENERATE_SMALL = ["run.updates=3", "run.eval_every=1", "run.checkpoint_every=1", "run.progress=false",
                  "run.plots=false", "es.population=4", "schedule.slots=4", "env.tasks_per_member=4",
                  "env.eval_goals=2", "env.max_steps=6", "agent.decode_steps=2"]


def _run(tmp_path, monkeypatch, name: str, pipelined: bool, config_path=None, overrides=None):
    """One run with the pipelined or the serial tick; returns it and the env steps of each ``pool.step`` call."""
    from envs.webshop_bridge.pool import InProcessEnvPool

    steps = []
    step = InProcessEnvPool.step

    def counted(pool, actions, timeout=None):
        steps.append(sum(a is not None for a in actions))
        return step(pool, actions, timeout)

    with monkeypatch.context() as patch:
        patch.setattr(parts, "RolloutEngine", functools.partial(RolloutEngine, pipelined=pipelined))
        patch.setattr(generate, "GenerateEngine", functools.partial(GenerateEngine, pipelined=pipelined))
        patch.setattr(InProcessEnvPool, "step", counted)
        # 16 slots of 2 episodes: several policy calls per tick, so a pipelined tick steps the env several times
        config = load_config(config_path, overrides or embedded(run__updates=3, es__population=16,
                                                                schedule__slots=16, env__eval_goals=8))
        result = train(config, run_dir=tmp_path / name)
    return result, steps


def _assert_same_run(serial, pipelined) -> None:
    assert theta_moved(serial.records) and same_bits(serial.params, pipelined.params)
    assert untimed(serial.records) == untimed(pipelined.records)
    for trace in sorted((serial.run_dir / "traces").iterdir()):
        assert trace.read_bytes() == (pipelined.run_dir / "traces" / trace.name).read_bytes()


@pytest.mark.slow
def test_pipelined_and_serial_ticks_record_the_same_run(tmp_path, monkeypatch):
    serial, serial_steps = _run(tmp_path, monkeypatch, "serial", pipelined=False)
    pipelined, pipelined_steps = _run(tmp_path, monkeypatch, "pipelined", pipelined=True)
    _assert_same_run(serial, pipelined)
    # the same env steps, split over more pool calls
    assert sum(serial_steps) == sum(pipelined_steps) and len(pipelined_steps) > len(serial_steps)


@pytest.mark.slow
def test_pipelined_and_serial_generate_ticks_record_the_same_run(tmp_path, monkeypatch):
    """configs/generate.yaml's policy, natural asynchrony with evaluations between: several versions' lanes in a
    tick, so the pipelined tick steps each lane's ended turns while it reads the next lane."""
    serial, serial_steps = _run(tmp_path, monkeypatch, "serial", False, GENERATE, GENERATE_SMALL)
    pipelined, pipelined_steps = _run(tmp_path, monkeypatch, "pipelined", True, GENERATE, GENERATE_SMALL)
    _assert_same_run(serial, pipelined)
    assert sum(serial_steps) == sum(pipelined_steps) and len(pipelined_steps) > len(serial_steps)


@pytest.mark.slow
@pytest.mark.parametrize("collective", [False, True])
def test_a_collective_pool_is_stepped_on_the_loops_own_thread(tmp_path, monkeypatch, collective):
    """A multi-process job's env pool is a collective (``ProcessRowsPool.collective``): stepped from the host worker
    beside the loop's own collectives (reading sharded scores), the processes could call them in different orders
    and hang. Such a pool is stepped on the loop's thread; any other on the host worker."""
    import threading

    from envs.webshop_bridge.pool import InProcessEnvPool

    threads = set()
    step = InProcessEnvPool.step

    def recorded(pool, actions, timeout=None):
        threads.add(threading.current_thread() is threading.main_thread())
        return step(pool, actions, timeout)

    monkeypatch.setattr(InProcessEnvPool, "step", recorded)
    monkeypatch.setattr(InProcessEnvPool, "collective", collective, raising=False)
    config = load_config(None, embedded(run__updates=1, es__population=8, schedule__slots=8, env__eval_goals=2))
    train(config, run_dir=tmp_path / "run")
    assert threads == {collective}  # True: every step on the main (loop) thread; False: every one on the worker
