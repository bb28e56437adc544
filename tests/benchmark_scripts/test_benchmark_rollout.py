"""benchmarks/rollout.py runs end to end on a tiny random model and reports consistent accounting."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    spec = importlib.util.spec_from_file_location("bench_rollout", ROOT / "benchmarks" / "rollout.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_rollout_benchmark_quick(tmp_path):
    module = _benchmark()
    result = module.main(["--quick", "--config", str(ROOT / "configs" / "synthetic.yaml"),
                          "--json", str(tmp_path / "r.json")])
    assert result["updates"] == 1 and result["env_steps"] > 0 and result["calls"] > 0
    assert 0 < result["padding_efficiency"] <= 1
    assert result["floor_seconds"] > 0 and result["loop_vs_floor"] > 0
    assert sum(result["shapes"].values()) == result["calls"]
    assert result["programs"] >= len(result["shapes"])
    assert (tmp_path / "r.json").is_file()


@pytest.mark.slow
def test_simulated_device_runs_the_loops_host_work_and_leaves_the_real_programs_in_place():
    import esjax.train.parts as parts
    import esjax.train.session as session
    from esjax.loop.rollout import RolloutEngine

    module = _benchmark()
    trainer = session.Trainer
    result = module.main(["--quick", "--config", str(ROOT / "configs" / "synthetic.yaml"), "--simulate-device", "2"])
    assert result["env_steps"] > 0 and result["calls"] > 0 and result["padded_rows"] >= result["calls"]
    # the device is busy exactly 2 ms per padded row, and the loop cannot finish before it
    assert result["device_busy_seconds"] == pytest.approx(0.002 * result["padded_rows"])
    assert 0 < result["loop_vs_floor"] <= 1
    assert result["host_us_per_env_step"] > 0
    assert set(result["host_wall_us_per_env_step_by_part"]) == {"prepare", "model (host part)", "env", "other",
                                                                 "of which on the host worker"}
    # the pipelined tick steps the env and builds next prompts on its host worker, off the loop's own thread
    assert result["host_wall_us_per_env_step_by_part"]["of which on the host worker"] > 0
    assert result["serial"]["host_wall_us_per_env_step_by_part"]["of which on the host worker"] == 0
    assert 0 < result["loop_thread_us_per_env_step"] < result["host_us_per_env_step"]
    assert result["pipelined"] and not result["serial"]["pipelined"]
    assert result["serial"]["env_steps"] == result["env_steps"]  # the same run, serial and pipelined
    assert parts.RolloutEngine is RolloutEngine and session.Trainer is trainer  # the trainer's names put back


@pytest.mark.slow
def test_simulated_device_in_generate_mode_writes_replies_that_step_the_env():
    import esjax.loop.generate_rollout as generate
    from esjax.loop.generate_rollout import GenerateEngine

    module = _benchmark()
    result = module.main(["--quick", "--config", str(ROOT / "configs" / "generate-tiny.yaml"),
                          "--simulate-device", "1", "--decode-ms", "0.5", "--reply", "click[buy now]"])
    assert result["mode"] == "generate" and result["decode_calls"] > 0 and result["prefill_rows"] > 0
    # every reply is a complete action, so turns end and the env steps
    assert result["env_steps"] > 0 and result["decode_steps"] >= result["decode_calls"]
    # the device is busy exactly its simulated prefill and decode time, and the loop cannot finish before it
    assert result["device_busy_seconds"] == pytest.approx(0.001 * result["prefill_rows"]
                                                          + 0.0005 * result["decode_steps"])
    assert 0 < result["loop_vs_floor"] <= 1 and result["loop_thread_us_per_decode_step"] > 0
    serial = result["serial"]  # the same run with the serial tick: the same work
    assert result["pipelined"] and not serial["pipelined"]
    assert (serial["env_steps"], serial["decode_steps"]) == (result["env_steps"], result["decode_steps"])
    assert generate.GenerateEngine is GenerateEngine  # the trainer builds the real engine again
