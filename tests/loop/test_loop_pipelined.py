"""The pipelined tick (env steps and next prompts of each call's rows while later calls compute) changes nothing
a run records: the embedded policy on real WebShop, serial and pipelined, gives the same records, traces and θ."""

from __future__ import annotations

import functools

import pytest
from conftest import same_bits, theta_moved
from run_settings import embedded

import esjax.train.parts as parts
from esjax.config import load_config
from esjax.loop.rollout import RolloutEngine
from esjax.rundir.metrics import untimed
from esjax.train.session import train


def _run(tmp_path, monkeypatch, name: str, pipelined: bool):
    steps = []
    original = RolloutEngine._step

    def counted(engine, actions, replay=False):
        steps.append(sum(a is not None for a in actions))
        return original(engine, actions, replay)

    with monkeypatch.context() as patch:
        patch.setattr(parts, "RolloutEngine", functools.partial(RolloutEngine, pipelined=pipelined))
        patch.setattr(RolloutEngine, "_step", counted)
        # 16 slots of 2 episodes: several policy calls per tick, so a pipelined tick steps the env several times
        config = load_config(None, embedded(run__updates=3, es__population=16, schedule__slots=16,
                                            env__eval_goals=8))
        result = train(config, run_dir=tmp_path / name)
    return result, steps


@pytest.mark.slow
def test_pipelined_and_serial_ticks_record_the_same_run(tmp_path, monkeypatch):
    serial, serial_steps = _run(tmp_path, monkeypatch, "serial", pipelined=False)
    pipelined, pipelined_steps = _run(tmp_path, monkeypatch, "pipelined", pipelined=True)
    assert theta_moved(serial.records) and same_bits(serial.params, pipelined.params)
    assert untimed(serial.records) == untimed(pipelined.records)
    for trace in sorted((tmp_path / "serial" / "traces").iterdir()):
        assert trace.read_bytes() == (tmp_path / "pipelined" / "traces" / trace.name).read_bytes()
    # the same env steps, split over more pool calls
    assert sum(serial_steps) == sum(pipelined_steps) and len(pipelined_steps) > len(serial_steps)
