"""Config validation: every user mistake is one line naming the key, before anything compiles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from esjax.config import ConfigError, config_from_dict, config_to_yaml, load_config, parse_override

REPO = Path(__file__).resolve().parents[1]


def test_defaults_and_round_trip(tmp_path):
    config = load_config(None)
    path = tmp_path / "resolved.yaml"
    path.write_text(config_to_yaml(config))
    assert load_config(path) == config


def test_override_parses_yaml_values():
    assert parse_override("es.sigma=0.5") == ("es.sigma", 0.5)
    assert parse_override("run.name=abc") == ("run.name", "abc")
    assert parse_override("es.include=[a, b]") == ("es.include", ["a", "b"])
    config = load_config(None, ["es.sigma=0.5", "schedule.kind=sync"])
    assert config.es.sigma == 0.5 and config.schedule.kind == "sync"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["es.population=7"], "es.population"),  # odd N with antithetic sampling
        (["schedule.max_lag=-1"], "schedule.max_lag"),
        (["es.rank=0"], "es.rank"),
        (["es.sigma=abc"], "es.sigma"),
        (["es.sigmaa=0.1"], "es.sigmaa"),  # unknown key
        (["model.source=hf", "model.path=/"], "model.path"),  # folder without config.json
        (["schedule.kind=controlled", "schedule.lag=3", "schedule.max_lag=1"], "schedule.lag"),
        (["es.sigma_schedule=cosine"], "es.sigma_final"),
        (["env.data=/nonexistent/folder"], "env.data"),
    ],
)
def test_bad_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    message = str(info.value)
    assert key in message and "\n" not in message


def test_bad_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("es: {population: [1\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        config_from_dict([1, 2], "x.yaml")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--set", "es.population=7"], "es.population"),
        (["--set", "es.rank=0"], "es.rank"),
        (["--set", "schedule.max_lag=-2"], "schedule.max_lag"),
        (["--set", "model.source=hf", "--set", "model.path=/"], "model.path"),
        (["--set", "nosuch.key=1"], "nosuch"),
        (["--set", "broken"], "broken"),
    ],
)
def test_cli_exits_with_one_line_and_no_traceback(args, key):
    proc = subprocess.run([sys.executable, "-m", "esjax.run", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and key in lines[0] and lines[0].startswith("error: ")


CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(REPO / "configs")) for p in CONFIGS])
def test_every_shipped_config_validates(path, tmp_path):
    from esjax.config import read_yaml

    raw = read_yaml(path)
    overrides = []
    if raw.get("model", {}).get("source") == "hf":  # real checkpoints live on GPU hosts: stand in a folder
        (tmp_path / "config.json").write_text("{}")
        overrides.append(f"model.path={tmp_path}")
    data = raw.get("env", {}).get("data", "synthetic")
    if data != "synthetic" and not Path(data).exists():
        overrides.append("env.data=synthetic")
    config = load_config(path, overrides)
    assert config.run.updates >= 1


def test_extends_merges_and_detects_cycles(tmp_path):
    (tmp_path / "base.yaml").write_text("es: {sigma: 0.5, rank: 2}\nrun: {updates: 7}\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nes: {rank: 3}\n")
    config = load_config(tmp_path / "child.yaml")
    assert (config.es.sigma, config.es.rank, config.run.updates) == (0.5, 3, 7)
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")
