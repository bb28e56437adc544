"""benchmarks/rollout.py runs end to end on a tiny random model and reports consistent accounting."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_rollout_benchmark_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_rollout", ROOT / "benchmarks" / "rollout.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    result = module.main(["--quick", "--config", str(ROOT / "configs" / "synthetic.yaml"),
                          "--json", str(tmp_path / "r.json")])
    assert result["updates"] == 1 and result["env_steps"] > 0 and result["calls"] > 0
    assert 0 < result["padding_efficiency"] <= 1
    assert result["floor_seconds"] > 0 and result["loop_vs_floor"] > 0
    assert sum(result["shapes"].values()) == result["calls"]
    assert result["programs"] >= len(result["shapes"])
    assert (tmp_path / "r.json").is_file()
