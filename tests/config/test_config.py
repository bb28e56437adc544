"""Config validation: every user mistake is one line naming the key, before anything compiles."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from esjax.config import ConfigError, config_from_dict, config_to_yaml, load_config, parse_override

REPO = Path(__file__).resolve().parents[2]


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
        (["schedule.kind=controlled", "schedule.lag=3", "schedule.max_lag=1", "schedule.stale_fraction=0.5"],
         "schedule.lag"),
        (["es.sigma_schedule=cosine"], "es.sigma_final"),
        (["es.learning_rate_schedule=linear"], "es.learning_rate_final"),
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
    ("module", "args", "key"),
    [
        ("esjax.run", ["--set", "es.population=7"], "es.population"),
        ("esjax.run", ["--set", "broken"], "broken"),
        ("esjax.eval", ["--run-dir", "/nonexistent/run"], "/nonexistent/run: does not exist"),
        ("esjax.eval", ["--run-dir", "/"], "/config.yaml: not a run directory"),
        ("esjax.eval", ["--model", "/nonexistent"], "--model /nonexistent: not a directory"),
        ("esjax.run", ["--resume", "/nothere"], "/nothere: does not exist"),
        ("esjax.export", ["--run-dir", "/nonexistent/run", "--out", "/nonexistent/hf"],
         "/nonexistent/run: does not exist"),
    ],
)
def test_cli_exits_with_one_line_and_no_traceback(module, args, key):
    """Each entry point as its own process (exit code, nothing else on stderr); more keys: in process below."""
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and key in lines[0] and lines[0].startswith("error: ")


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--set", "es.rank=0"], "es.rank"),
        (["--set", "schedule.max_lag=-2"], "schedule.max_lag"),
        (["--set", "model.source=hf", "--set", "model.path=/"], "model.path"),
        (["--set", "nosuch.key=1"], "nosuch"),
    ],
)
def test_cli_errors_are_one_line_in_process(args, key, capsys):
    code, err = _cli(args, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and key in lines[0] and lines[0].startswith("error: "), err


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


def test_hasty_config_is_the_main_job_its_committed_seed_runs_recorded():
    """configs/hasty.yaml pins the main job of 5-8 Dec 2026 (experiments/results/main-job/): the same ES, schedule,
    shop, agent and budget as its seed runs' recorded config.yaml, on the policy that was embedded as the default
    then and ships as ``hasty`` now -- so editing configs/default.yaml cannot change that result's recipe."""
    recorded = load_config(REPO / "experiments" / "results" / "main-job" / "seed0" / "config.yaml")
    hasty = load_config(REPO / "configs" / "hasty.yaml", ["run.seed=0"])
    for section in ("es", "schedule", "env", "agent", "mesh"):
        assert getattr(hasty, section) == getattr(recorded, section), section
    assert (hasty.run.updates, hasty.run.eval_every) == (recorded.run.updates, recorded.run.eval_every)
    assert (recorded.model.source, recorded.model.embedded) == ("embedded", "default")
    assert (hasty.model.source, hasty.model.embedded) == ("embedded", "hasty")


def test_extends_merges_and_detects_cycles(tmp_path):
    (tmp_path / "base.yaml").write_text("es: {sigma: 0.5, rank: 2}\nrun: {updates: 7}\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nes: {rank: 3}\n")
    config = load_config(tmp_path / "child.yaml")
    assert (config.es.sigma, config.es.rank, config.run.updates) == (0.5, 3, 7)
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


# ------------------------------------------------------------------------------------------------ bad inputs
# Each bad input: `error: <one line naming the file (the parent for an inherited key) and the key>`, exit code 2,
# and no run directory left behind. In-process through the CLI's own wrapper (run_cli), so the cases are cheap.

PARENT_BAD = "es: {population: 8, sigmaa: 0.1}\n"


def _cli(argv, capsys):
    from esjax.cli.common import run_cli
    from esjax.cli.run import main

    with pytest.raises(SystemExit) as info:
        run_cli(main, argv)
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "key", "blamed"),
    [
        pytest.param(b"", "empty", "cfg.yaml", id="empty-file"),
        pytest.param(b"# only a comment\n", "empty", "cfg.yaml", id="comment-only-file"),
        pytest.param(b"extends: missing.yaml\nrun: {updates: 3}\n", "extends", "cfg.yaml", id="extends-missing"),
        pytest.param(b"es: {sigma: 1e400}\n", "es.sigma", "cfg.yaml", id="sigma-inf"),
        pytest.param(b"es: {learning_rate: .nan}\n", "es.learning_rate", "cfg.yaml", id="lr-nan"),
        pytest.param(b"run: {updates: 1e30}\n", "run.updates", "cfg.yaml", id="updates-1e30"),
        pytest.param(b"es: {population: 1e12}\n", "es.population", "cfg.yaml", id="population-1e12-float"),
        pytest.param(b"es: {population: 1000000000000}\n", "es.population", "cfg.yaml", id="population-too-big"),
        pytest.param(b"run: {updates: 100000000000}\n", "run.updates", "cfg.yaml", id="updates-too-big"),
        pytest.param(b"schedule: {slots: 100000}\nenv: {tasks_per_member: 100000}\n", "schedule.slots", "cfg.yaml",
                     id="episodes-too-many"),
        pytest.param(b"run: {seed: -1}\n", "run.seed", "cfg.yaml", id="negative-seed"),
        pytest.param(b"schedule: {kind: extreme_lag, stale_fraction: 1.0, max_lag: 4}\n", "schedule.stale_fraction",
                     "cfg.yaml", id="extreme-lag-p1"),
        pytest.param(b"schedule: {kind: extreme_lag, stale_fraction: 0.25, max_lag: 0}\n", "schedule.max_lag",
                     "cfg.yaml", id="extreme-lag-K0"),
        pytest.param(b"schedule: {kind: controlled, lag: 0, stale_fraction: 0.5, max_lag: 2}\n", "schedule.lag",
                     "cfg.yaml", id="controlled-lag0"),
        pytest.param(b"schedule: {kind: controlled, lag: 2, stale_fraction: 0.0, max_lag: 2}\n",
                     "schedule.stale_fraction", "cfg.yaml", id="controlled-p0"),
        pytest.param(b"es: {population: 4}\nschedule: {kind: controlled, lag: 1, stale_fraction: 0.1, max_lag: 1}\n",
                     "schedule.stale_fraction", "cfg.yaml", id="controlled-no-stale-member"),
        pytest.param(b"schedule: {kind: all_stale, lag: 2, max_lag: 2, stale_fraction: 0.5}\n",
                     "schedule.stale_fraction", "cfg.yaml", id="all-stale-p"),
        pytest.param(b"schedule: {kind: async, lag: 2, max_lag: 2}\n", "schedule.lag", "cfg.yaml", id="async-lag"),
        pytest.param(b"schedule: {kind: sync, stale_fraction: 0.5}\n", "schedule.stale_fraction", "cfg.yaml",
                     id="sync-p"),
        pytest.param(b"schedule: {kind: controlled, lag: 2, max_lag: 2}\n", "schedule.stale_fraction", "cfg.yaml",
                     id="controlled-without-p"),
        pytest.param(b"schedule: {kind: warp}\n", "schedule.kind", "cfg.yaml", id="unknown-schedule-kind"),
        pytest.param(b"es: {optimizer: {kind: sgd, b1: 0.8}}\n", "es.optimizer.b1", "cfg.yaml", id="sgd-b1"),
        pytest.param(b"es: {optimizer: lion}\n", "es.optimizer", "cfg.yaml", id="unknown-optimizer"),
        pytest.param(b"extends: parent.yaml\nschedule: {kind: sync}\n", "es.sigmaa", "parent.yaml",
                     id="bad-key-in-parent-with-schedule"),
        pytest.param(b"es: {include: ['[(']}\n", "es.include", "cfg.yaml", id="bad-regex"),
        pytest.param(b"es: {exclude: ['ok', '*bad']}\n", "es.exclude", "cfg.yaml", id="bad-regex-exclude"),
        pytest.param(b"run: {name: \"caf\xe9\"}\n", "UTF-8", "cfg.yaml", id="not-utf8"),
        pytest.param(b"extends: parent.yaml\nrun: {updates: 3}\n", "es.sigmaa", "parent.yaml", id="bad-key-in-parent"),
        pytest.param(b"extends: parent.yaml\nes: {sigma: 0.5}\n", "es.sigmaa", "parent.yaml",
                     id="bad-key-in-parent-overridden-section"),
        pytest.param(b"env: {data: DATAFILE}\n", "env.data", "cfg.yaml", id="data-is-a-file"),
        pytest.param(b"run: {updates: '12'}\n", "run.updates", "cfg.yaml", id="str-to-int"),
        pytest.param(b"run: {updates: true}\n", "run.updates", "cfg.yaml", id="bool-to-int"),
        pytest.param(b"es: {population: 8.0}\n", "es.population", "cfg.yaml", id="float-to-int"),
        pytest.param(b"es: {sigma: '0.1'}\n", "es.sigma", "cfg.yaml", id="str-to-float"),
        pytest.param(b"es: {sigma: true}\n", "es.sigma", "cfg.yaml", id="bool-to-float"),
        pytest.param(b"run: {progress: 1}\n", "run.progress", "cfg.yaml", id="int-to-bool"),
        pytest.param(b"es: {sigma: 0.1}\nrun: {seed: 1}\nes: {rank: 2}\n", "'es'", "cfg.yaml", id="duplicated-section"),
        pytest.param(b"es:\n  sigma: 0.1\n  sigma: 0.2\n", "es.sigma", "cfg.yaml", id="duplicated-key"),
    ],
)
def test_bad_config_inputs_are_one_line_and_exit_2(text, key, blamed, tmp_path, capsys):
    data_file = tmp_path / "products.json"
    data_file.write_text("[]")
    (tmp_path / "parent.yaml").write_text(PARENT_BAD)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_bytes(text.replace(b"DATAFILE", str(data_file).encode()))
    run_dir = tmp_path / "run"
    code, err = _cli(["--config", str(cfg), "--run-dir", str(run_dir)], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert key in lines[0] and f"{tmp_path / blamed}:" in lines[0], lines[0]
    assert "Traceback" not in err
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["es.population=8.0"], "es.population"),
        (["run.updates=true"], "run.updates"),
        (["run.updates='12'"], "run.updates"),
        (["es.sigma=1e400"], "es.sigma"),
        (["es.include=['[(']"], "es.include"),
    ],
)
def test_bad_overrides_blame_the_override(args, key, capsys):
    code, err = _cli([x for a in args for x in ("--set", a)], capsys)
    assert code == 2 and err.count("\n") == 1 and key in err and f"--set {args[-1]}" in err, err


@pytest.mark.parametrize(
    ("override", "unknown", "suggested"),
    [
        ("es.sigmma=0.1", "es.sigmma", "es.sigma"),  # a typo: the sibling spelled alike
        ("es.learning_rte=0.1", "es.learning_rte", "es.learning_rate"),
        ("schedule.maxlag=2", "schedule.maxlag", "schedule.max_lag"),
        ("run.sigma=0.1", "run.sigma", "es.sigma"),  # the right name in the wrong section
        ("ess.sigma=0.1", "ess", "es"),  # a misspelled section
        ("es={sigmaa: 0.1}", "es.sigmaa", "es.sigma"),  # inside a section given as a mapping
    ],
)
def test_unknown_keys_suggest_the_closest_known_key(override, unknown, suggested, capsys):
    code, err = _cli(["--set", override], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"--set {override}: unknown key {unknown!r}; did you mean {suggested!r}?" in err, err


def test_unknown_key_in_a_file_suggests_and_blames_the_file(tmp_path):
    (tmp_path / "parent.yaml").write_text("schedule: {kind: sync, slot: 4}\n")
    (tmp_path / "cfg.yaml").write_text("extends: parent.yaml\nes: {sigma: 0.05}\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "cfg.yaml")
    assert str(info.value) == f"{tmp_path / 'parent.yaml'}: unknown key 'schedule.slot'; did you mean 'schedule.slots'?"
    with pytest.raises(ConfigError) as info:  # nothing close: no suggestion
        load_config(None, ["nosuch.key=1"])
    assert str(info.value) == "--set nosuch.key=1: unknown key 'nosuch'"


def test_yaml_numbers_and_strict_types_that_stay_valid(tmp_path):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("es: {sigma: 1e-3, learning_rate: 2, include: ['norm/scale$']}\nrun: {updates: 12}\n")
    config = load_config(cfg)
    assert config.es.sigma == 0.001 and isinstance(config.es.sigma, float)
    assert config.es.learning_rate == 2.0 and config.es.include == ("norm/scale$",) and config.run.updates == 12
    assert load_config(None, ["es.sigma=5e-2"]).es.sigma == 0.05
    (tmp_path / "all-defaults.yaml").write_text("{}\n")
    assert load_config(tmp_path / "all-defaults.yaml") == load_config(None)


def test_run_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("not a directory")
    code, err = _cli(["--set", "model.source=random", "--run-dir", str(target)], capsys)
    assert code == 2 and err.count("\n") == 1 and "--run-dir" in err and str(target) in err, err
    assert target.read_text() == "not a directory"
    code, err = _cli(["--set", "model.source=random", "--run-dir", str(target / "sub")], capsys)
    assert code == 2 and err.count("\n") == 1 and "Not a directory" in err and "--run-dir" in err, err


def test_a_failed_start_leaves_no_run_directory(tmp_path, capsys):
    """Bad input found while building the parts (after the run directory was made) removes it again."""
    empty = tmp_path / "no-data"
    empty.mkdir()
    run_dir = tmp_path / "deep" / "run"
    code, err = _cli(["--set", "model.source=random", "--set", f"env.data={empty}", "--run-dir", str(run_dir)], capsys)
    assert code == 2 and err.count("\n") == 1 and "env.data" in err, err
    assert not (tmp_path / "deep").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="needs a private read-only mount (Linux unshare)")
@pytest.mark.parametrize("which", ["new", "existing"])
def test_read_only_run_directory_at_start_is_one_line(which, tmp_path):
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare for a private read-only mount")
    mount = tmp_path / "ro"
    mount.mkdir()
    run_dir = mount / "run" if which == "new" else mount
    inner = (f"mount -t tmpfs -o ro none {mount} && exec {sys.executable} -m esjax.run --set model.source=random "
             f"--run-dir {run_dir}")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            f"mount -t tmpfs -o ro none {mount}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("mount namespaces are not permitted here")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "Read-only file system" in lines[0] and str(run_dir) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_readme_sigma_overrides_keep_the_step_size():
    """With es.scale=nes σ divides the step (g = Σ w ε / (N σ)): a README command that sets es.sigma must set the
    learning rate too, keeping the config's learning_rate / sigma, so the example does not change the step size."""
    import shlex

    commands = [line.split("#")[0] for line in (REPO / "README.md").read_text().splitlines()
                if line.startswith("python -m esjax.run ") and "es.sigma" in line]
    assert commands, "the README shows how to change σ safely"
    for command in commands:
        argv = shlex.split(command)[3:]
        config_path = argv[argv.index("--config") + 1]
        overrides = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
        base, changed = load_config(REPO / config_path), load_config(REPO / config_path, overrides)
        assert any(o.startswith("es.learning_rate=") for o in overrides), command
        assert changed.es.sigma != base.es.sigma and base.es.scale == "nes"
        assert changed.es.learning_rate / changed.es.sigma == pytest.approx(base.es.learning_rate / base.es.sigma)


# ------------------------------------------------------------------------------------- kinds: schedule, es.optimizer
# Each schedule kind and each optimizer is its own section model, selected by `kind`: a key of another kind is
# rejected naming the file, the key and the kinds that have it; the JSON schema shows each kind's keys.


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("schedule: {kind: async, lag: 2}\n",
                     "schedule.lag: not a key of schedule kind 'async' (only controlled and all_stale have it; async "
                     "has kind, max_lag, slots)", id="async-lag"),
        pytest.param("schedule: {lag: 2}\n",  # no kind: the default kind, async
                     "schedule.lag: not a key of schedule kind 'async' (only controlled and all_stale have it; async "
                     "has kind, max_lag, slots)", id="default-kind-lag"),
        pytest.param("schedule: {kind: sync, stale_fraction: 0.5}\n",
                     "schedule.stale_fraction: not a key of schedule kind 'sync' (only controlled and extreme_lag "
                     "have it; sync has kind, max_lag, slots)", id="sync-p"),
        pytest.param("schedule: {kind: all_stale, lag: 2, max_lag: 2, stale_fraction: 0.5}\n",
                     "schedule.stale_fraction: not a key of schedule kind 'all_stale' (only controlled and "
                     "extreme_lag have it; all_stale has kind, max_lag, slots, lag)", id="all-stale-p"),
        pytest.param("schedule: {kind: extreme_lag, stale_fraction: 0.25, max_lag: 4, lag: 2}\n",
                     "schedule.lag: not a key of schedule kind 'extreme_lag' (only controlled and all_stale have it; "
                     "extreme_lag has kind, max_lag, slots, stale_fraction)", id="extreme-lag-lag"),
        pytest.param("schedule: {kind: controlled, stale_fraction: 0.1, max_lag: 4}\n",
                     "schedule.lag: required for schedule kind 'controlled'", id="controlled-without-k"),
        pytest.param("schedule: {kind: warp}\n",
                     "schedule.kind: unknown kind 'warp'; expected 'sync', 'async', 'controlled', 'all_stale' or "
                     "'extreme_lag'", id="unknown-kind"),
        pytest.param("schedule: {kind: sync, slot: 4}\n", "unknown key 'schedule.slot'; did you mean 'schedule.slots'?",
                     id="no-kind-has-it"),
        pytest.param("es: {optimizer: {kind: sgd, b1: 0.8}}\n",
                     "es.optimizer.b1: not a key of es.optimizer kind 'sgd' (only adam has it; sgd has kind)",
                     id="sgd-b1"),
        pytest.param("es: {optimizer: {b2: 0.9}}\n",  # no kind: the default optimizer, sgd
                     "es.optimizer.b2: not a key of es.optimizer kind 'sgd' (only adam has it; sgd has kind)",
                     id="default-optimizer-b2"),
        pytest.param("es: {optimizer: {kind: adam, b_2: 0.9}}\n",
                     "unknown key 'es.optimizer.b_2'; did you mean 'es.optimizer.b2'?", id="adam-typo"),
        pytest.param("es: {optimizer: {kind: adam, b1: 1.0}}\n",
                     "es.optimizer.b1: Input should be less than 1 (got 1.0)", id="adam-b1-range"),
        pytest.param("es: {optimizer: lion}\n", "es.optimizer: unknown kind 'lion'; expected 'sgd' or 'adam'",
                     id="unknown-optimizer"),
    ],
)
def test_a_key_of_another_kind_is_rejected_naming_file_and_key(text, message, tmp_path):
    (tmp_path / "cfg.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "cfg.yaml")
    assert str(info.value) == f"{tmp_path / 'cfg.yaml'}: {message}"


def test_kind_errors_blame_the_file_or_override_that_set_the_key(tmp_path):
    (tmp_path / "parent.yaml").write_text("schedule: {kind: controlled, lag: 2, stale_fraction: 0.5, max_lag: 2}\n")
    (tmp_path / "cfg.yaml").write_text("extends: parent.yaml\nschedule: {kind: async}\n")
    with pytest.raises(ConfigError) as info:  # the inherited lag is the parent's, the kind that rejects it the child's
        load_config(tmp_path / "cfg.yaml")
    assert str(info.value).startswith(f"{tmp_path / 'parent.yaml'}: schedule.lag: not a key of schedule kind 'async'")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "parent.yaml", ["schedule.kind=extreme_lag"])
    assert str(info.value).startswith(f"{tmp_path / 'parent.yaml'}: schedule.lag: not a key of schedule kind "
                                      "'extreme_lag'")
    with pytest.raises(ConfigError) as info:
        load_config(None, ["schedule.kind=controlled", "schedule.lag=2", "schedule.max_lag=2"])
    assert str(info.value) == ("--set schedule.kind=controlled: schedule.stale_fraction: required for schedule kind "
                               "'controlled'")
    with pytest.raises(ConfigError) as info:
        load_config(None, ["es.optimizer.eps=1e-6"])
    assert str(info.value) == ("--set es.optimizer.eps=1e-6: es.optimizer.eps: not a key of es.optimizer kind 'sgd' "
                               "(only adam has it; sgd has kind)")


def test_each_kind_holds_only_its_keys_and_round_trips(tmp_path):
    cases = {
        "sync": ({"kind": "sync", "max_lag": 0}, {"kind": "sync", "max_lag": 0, "slots": 8}),
        "async": ({}, {"kind": "async", "max_lag": 1, "slots": 8}),
        "controlled": ({"kind": "controlled", "lag": 4, "stale_fraction": 0.1, "max_lag": 4},
                       {"kind": "controlled", "max_lag": 4, "slots": 8, "lag": 4, "stale_fraction": 0.1}),
        "all_stale": ({"kind": "all_stale", "lag": 2, "max_lag": 2},
                      {"kind": "all_stale", "max_lag": 2, "slots": 8, "lag": 2}),
        "extreme_lag": ({"kind": "extreme_lag", "stale_fraction": 0.25, "max_lag": 32},
                        {"kind": "extreme_lag", "max_lag": 32, "slots": 8, "stale_fraction": 0.25}),
    }
    for kind, (section, dumped) in cases.items():
        config = config_from_dict({"schedule": section})
        assert config.schedule.kind == kind and config.model_dump(mode="json")["schedule"] == dumped
        path = tmp_path / f"{kind}.yaml"
        path.write_text(config_to_yaml(config))
        assert load_config(path) == config
    adam = load_config(None, ["es.optimizer=adam"])
    assert adam.es.optimizer == load_config(None, ["es.optimizer={kind: adam, b1: 0.9}"]).es.optimizer
    assert (adam.es.optimizer.kind, adam.es.optimizer.b1, adam.es.optimizer.b2, adam.es.optimizer.eps) == (
        "adam", 0.9, 0.999, 1e-8)
    assert adam.model_dump(mode="json")["es"]["optimizer"] == "adam"  # at its defaults: the name, as config.yaml had it
    assert load_config(None).model_dump(mode="json")["es"]["optimizer"] == "sgd"
    tuned = load_config(None, ["es.optimizer={kind: adam, b2: 0.99}"])
    assert tuned.model_dump(mode="json")["es"]["optimizer"] == {"kind": "adam", "b1": 0.9, "b2": 0.99, "eps": 1e-8}
    path = tmp_path / "adam.yaml"
    path.write_text(config_to_yaml(tuned))
    assert load_config(path) == tuned


def test_run_directories_written_before_the_kinds_still_load(tmp_path):
    """config.yaml files written before per-kind sections hold every schedule key, unused ones at their neutral
    value (lag: 0, stale_fraction: 0.0): they load (resume, eval, export) and mean the same schedule; any other
    value of a key the kind does not use is still an error."""
    old = {
        "sync": "{kind: sync, max_lag: 0, lag: 0, stale_fraction: 0.0, slots: 16}",
        "async": "{kind: async, max_lag: 1, lag: 0, stale_fraction: 0.0, slots: 16}",
        "controlled": "{kind: controlled, max_lag: 4, lag: 4, stale_fraction: 0.1, slots: 16}",
        "all_stale": "{kind: all_stale, max_lag: 1, lag: 1, stale_fraction: 0.0, slots: 4}",
        "extreme_lag": "{kind: extreme_lag, max_lag: 32, lag: 0, stale_fraction: 0.25, slots: 16}",
    }
    for kind, section in old.items():
        path = tmp_path / f"{kind}.yaml"
        path.write_text(f"es: {{population: 16, optimizer: sgd}}\nschedule: {section}\n")
        config = load_config(path)
        fields = type(config.schedule).model_fields
        own = {key: value for key, value in yaml.safe_load(section).items() if key in fields}
        assert config.schedule.kind == kind and config == config_from_dict({"es": {"population": 16}, "schedule": own})
    assert load_config(None, ["schedule.kind=all_stale", "schedule.lag=1", "schedule.stale_fraction=1.0"]).schedule \
        == load_config(None, ["schedule.kind=all_stale", "schedule.lag=1"]).schedule  # p = 1: all_stale's own
    for bad in (["schedule.lag=1"], ["schedule.kind=sync", "schedule.stale_fraction=0.1"], ["schedule.lag=false"]):
        with pytest.raises(ConfigError, match="not a key of schedule kind"):
            load_config(None, bad)


def test_json_schema_shows_each_kinds_keys():
    from esjax.config import Config

    schema = Config.model_json_schema()
    schedule = schema["properties"]["schedule"]
    assert schedule["discriminator"]["propertyName"] == "kind"
    assert set(schedule["discriminator"]["mapping"]) == {"sync", "async", "controlled", "all_stale", "extreme_lag"}
    keys = {kind: set(schema["$defs"][ref.split("/")[-1]]["properties"])
            for kind, ref in schedule["discriminator"]["mapping"].items()}
    assert keys["async"] == keys["sync"] == {"kind", "max_lag", "slots"}
    assert keys["controlled"] == {"kind", "max_lag", "slots", "lag", "stale_fraction"}
    assert keys["all_stale"] == {"kind", "max_lag", "slots", "lag"}
    assert keys["extreme_lag"] == {"kind", "max_lag", "slots", "stale_fraction"}
    assert set(schema["$defs"]["ControlledSchedule"]["required"]) == {"lag", "stale_fraction"}
    optimizer = schema["$defs"]["ESSection"]["properties"]["optimizer"]
    assert set(optimizer["discriminator"]["mapping"]) == {"sgd", "adam"}
    assert set(schema["$defs"]["AdamOptimizer"]["properties"]) == {"kind", "b1", "b2", "eps"}
    assert set(schema["$defs"]["SGDOptimizer"]["properties"]) == {"kind"}


# ------------------------------------------------------------------------------------------------- ES defaults


def test_es_section_defaults_are_the_library_defaults():
    """One set of ES defaults: a config without an es section builds exactly ESConfig()'s update."""
    from run_settings import es_config_of

    from esjax.es import ESConfig, NoiseSpec

    built, library = es_config_of(load_config(None)), ESConfig(noise=NoiseSpec(seed=0))
    assert float(built.sigma_at(0)) == pytest.approx(library.sigma, rel=1e-7)
    assert dataclasses.replace(built, sigma=library.sigma) == library
    assert (library.sigma, library.learning_rate, library.scale, library.shaping, library.optimizer) == (
        1.5e-3, 7.5e-4, "llm", "centered_ranks", "sgd")


def test_optimizer_settings_reach_the_update():
    """adam at optax's defaults is passed by name (a value: configs built again share compiled programs); other
    settings as one optax transformation per distinct setting, whose state has adam's structure."""
    import jax
    import optax
    from run_settings import es_config_of

    assert es_config_of(load_config(None, ["es.optimizer=adam"])).optimizer == "adam"
    assert es_config_of(load_config(None, ["es.optimizer={kind: adam, eps: 1e-8}"])).optimizer == "adam"
    tuned = ["es.optimizer={kind: adam, b1: 0.5, eps: 1e-6}", "es.learning_rate=0.1"]
    first, again = es_config_of(load_config(None, tuned)), es_config_of(load_config(None, tuned))
    assert first == again and first.optimizer is again.optimizer
    params = {"w": jax.numpy.ones(3)}
    grads = {"w": jax.numpy.asarray([1.0, -2.0, 0.5])}
    ours = first.get_optimizer()
    reference = optax.adam(0.1, b1=0.5, eps=1e-6)
    got = ours.update(grads, ours.init(params), params)[0]["w"]
    want = reference.update(grads, reference.init(params), params)[0]["w"]
    assert jax.numpy.allclose(got, want)
    assert jax.tree_util.tree_structure(ours.init(params)) == jax.tree_util.tree_structure(
        es_config_of(load_config(None, ["es.optimizer=adam"])).get_optimizer().init(params))


def test_adam_settings_act_over_several_steps():
    """One Adam step is ≈ −lr·sign(g) whatever b1, b2 and eps are; over several steps with changing gradients
    each setting shows: ours equals optax.adam with the same settings, and differs from optax's defaults."""
    import jax
    import numpy as np
    import optax
    from run_settings import es_config_of

    ours = es_config_of(load_config(None, ["es.optimizer={kind: adam, b1: 0.5, b2: 0.9, eps: 0.1}",
                                              "es.learning_rate=0.1"])).get_optimizer()
    reference, default = optax.adam(0.1, b1=0.5, b2=0.9, eps=0.1), optax.adam(0.1)
    params = {"w": jax.numpy.ones(3)}
    grads = [{"w": jax.numpy.asarray(g)} for g in ([1.0, -2.0, 0.5], [-0.3, 0.1, 2.0], [0.2, 0.2, -1.0],
                                                   [1.5, -0.5, 0.0])]
    states = [t.init(params) for t in (ours, reference, default)]
    for g in grads:
        steps = []
        for k, t in enumerate((ours, reference, default)):
            step, states[k] = t.update(g, states[k], params)
            steps.append(np.asarray(step["w"]))
        np.testing.assert_allclose(steps[0], steps[1], rtol=1e-6)
    assert not np.allclose(steps[0], steps[2], rtol=1e-2)  # the settings matter after a few steps


# The main job's resolved ES section (published numbers depend on it): pinned, so a change of the defaults can never
# move it silently.
DEFAULT_JOB_ES = {
    "population": 32, "antithetic": True, "mode": "lowrank", "rank": 1, "sigma": 0.05, "sigma_final": None,
    "sigma_schedule": "constant", "learning_rate": 0.02, "learning_rate_final": None,
    "learning_rate_schedule": "constant", "scale": "nes", "shaping": "centered_ranks",
    "optimizer": "sgd", "weight_decay": 0.0, "anchor_decay": 0.0, "scope": "matrices", "include": ["/kernel$"],
    "exclude": [],
}


def test_main_job_resolves_to_its_published_es_values():
    dumped = load_config(REPO / "configs" / "default.yaml").model_dump(mode="json")
    assert dumped["es"] == DEFAULT_JOB_ES
    assert dumped["schedule"] == {"kind": "async", "max_lag": 1, "slots": 32}


def test_goal_set_is_templated_or_human_and_synthetic_still_loads_as_templated(tmp_path):
    """env.goals names WebShop's goal sets by what they are; 'synthetic' (its old value, which never meant the
    synthetic shop) loads as 'templated', so an old run directory's config.yaml still loads and resumes."""
    from esjax.cli.eval import _settings_line
    from esjax.train.parts import build_task

    old = tmp_path / "config.yaml"
    old.write_text("env:\n  data: webshop_small\n  num_products: 500\n  goals: synthetic\n")
    config = load_config(old)
    assert config.env.goals == "templated" and "goals: templated" in config_to_yaml(config)
    assert load_config(None, ["env.data=webshop_small", "env.goals=synthetic"]).env.goals == "templated"
    assert load_config(REPO / "configs" / "default.yaml").env.goals == "templated"
    with pytest.raises(ConfigError, match="env.goals"):
        load_config(None, ["env.goals=generated"])
    assert build_task(config.env).goal_label() == "templated"
    assert build_task(load_config(None, ["env.data=synthetic"]).env).goal_label() == "synthetic-shop"
    # keys that do not apply to the dataset are not printed as settings: num_products on WebShop data, the
    # WebShop goal set on the synthetic shop
    base = {"env": {"data": "webshop_small", "num_products": 500, "goals": "synthetic"}}
    line = _settings_line(config, base, {}, tmp_path / "esjax.json")
    assert "env.goals=templated" in line and "num_products" not in line
    synthetic = load_config(None, ["env.data=synthetic", "env.num_products=500"])
    line = _settings_line(synthetic, {"env": {"data": "synthetic", "num_products": 500, "goals": "synthetic"}}, {},
                          tmp_path / "esjax.json")
    assert "env.num_products=500" in line and "env.goals" not in line


def test_console_script_prints_the_same_one_line_as_the_module():
    """``esjax-run`` (the installed console script) and ``python -m esjax.run`` report a bad config alike."""
    script = shutil.which("esjax-run")
    if script is None:
        pytest.skip("esjax-run is not installed (pip install -e .)")
    args = ["--set", "es.population=7"]
    outputs = [subprocess.run(argv + args, capture_output=True, text=True, cwd=REPO, timeout=120)
               for argv in ([script], [sys.executable, "-m", "esjax.run"])]
    assert [p.returncode for p in outputs] == [2, 2]
    assert outputs[0].stderr == outputs[1].stderr and outputs[0].stderr.startswith("error: ")
    assert len(outputs[0].stderr.strip().splitlines()) == 1 and "Traceback" not in outputs[0].stderr


def test_every_user_facing_error_shares_one_base_and_prints_one_line(capsys):
    """Config, model folder, mesh, checkpoint, multi-process and missing-extra errors all derive from EsjaxError,
    and run_cli prints each as one ``error:`` line with exit code 2."""
    from envs.webshop_bridge.errors import DataError
    from esjax.cli.common import run_cli
    from esjax.errors import EsjaxError, UserError
    from esjax.model.config import ModelConfigError
    from esjax.model.hf import ModelFileError
    from esjax.model.sharding import MeshError
    from esjax.parallel.envpool_ray import RayUnavailable
    from esjax.parallel.multihost import DistributedError
    from esjax.rundir.checkpoint import CheckpointError, StorageError
    from esjax.rundir.directory import RunDirError

    classes = [ConfigError, ModelConfigError, ModelFileError, MeshError, CheckpointError, StorageError,
               DistributedError, RayUnavailable, UserError, RunDirError]
    assert all(issubclass(cls, EsjaxError) for cls in classes)
    for cls in [*classes, DataError]:
        def main(argv, cls=cls):
            raise cls("path/to/thing: what is wrong\nmore detail") if cls is not DataError else cls("path", "bad")
        with pytest.raises(SystemExit) as exit_info:
            run_cli(main, [])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, cls


def test_learning_rate_schedule_steps_by_version_and_constant_keeps_its_optimizer_state():
    """es.learning_rate_schedule makes α a function of the update count (= the version), as σ's schedule is; a
    constant α stays a float, so the optimizer state of every run and checkpoint without a schedule is unchanged."""
    import jax
    import jax.numpy as jnp
    from run_settings import es_config_of

    for optimizer in ("sgd", "adam"):
        cosine = es_config_of(load_config(None, ["es.learning_rate=0.01", "es.learning_rate_final=0.001",
                                                 "es.learning_rate_schedule=cosine", f"es.optimizer={optimizer}",
                                                 "run.updates=10"]))
        assert float(cosine.learning_rate(0)) == pytest.approx(0.01)
        assert float(cosine.learning_rate(5)) == pytest.approx(0.0055)
        assert float(cosine.learning_rate(10)) == pytest.approx(0.001)
        assert float(cosine.learning_rate(20)) == pytest.approx(0.001)  # held after the run's updates
        tx = cosine.get_optimizer()
        params = {"w": jnp.zeros(3)}
        state = tx.init(params)
        sizes = []
        for _ in range(11):
            step, state = jax.jit(tx.update)({"w": jnp.ones(3)}, state, params)
            sizes.append(float(jnp.abs(step["w"][0])))
        if optimizer == "sgd":  # the step is α_t itself
            np.testing.assert_allclose(sizes, [float(cosine.learning_rate(t)) for t in range(11)], rtol=1e-6)
        assert sizes[0] > sizes[5] > sizes[10] > 0
    constant = es_config_of(load_config(None, ["es.learning_rate=0.01"]))
    assert constant.learning_rate == 0.01
    assert jax.tree_util.tree_structure(constant.get_optimizer().init({"w": jnp.zeros(3)})) == \
        jax.tree_util.tree_structure(optax_sgd_state())


def optax_sgd_state():
    import jax.numpy as jnp
    import optax

    return optax.sgd(0.01).init({"w": jnp.zeros(3)})
