"""The trainer end to end on a tiny random policy: determinism, SIGKILL + resume, checkpoint fallback,
eval and export, and real WebShop data."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import reward_by_trace, same_bits, theta_moved, uneven_episodes
from run_settings import tiny_random

from esjax.config import load_config
from esjax.rundir.directory import resume_config
from esjax.rundir.metrics import untimed
from esjax.train.parts import load_run
from esjax.train.session import train

REPO = Path(__file__).resolve().parents[2]

TINY = tiny_random(updates=4, eval_every=2, checkpoint_every=1, population=8, eval_goals=6, max_steps=6)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    return train(load_config(None, [*TINY, "run.plots=true"]), run_dir=run_dir)


def test_run_directory_holds_everything(reference_run):
    run_dir = reference_run.run_dir
    for name in ("config.yaml", "run.json", "metrics.jsonl", "summary.md", "plots/score.png", "plots/staleness.png",
                 "plots/throughput.png"):
        assert (run_dir / name).is_file(), name
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["seed"] == 0 and meta["jax"] == jax.__version__
    updates = [r for r in reference_run.records if r["kind"] == "update"]
    evals = [r for r in reference_run.records if r["kind"] == "eval"]
    assert [r["version"] for r in updates] == [1, 2, 3, 4]
    assert [r["version"] for r in evals] == [0, 2, 4]
    assert all(sum(r["cohort_lag_hist"]) == 8 for r in updates)  # every cohort has exactly N members
    assert all(len(r["cohort_lag_hist"]) <= 2 for r in updates)  # K = 1
    assert reference_run.version == 4
    png = (run_dir / "plots" / "score.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def _digest(params) -> str:
    import hashlib

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


class ThetaHistory:
    """θ_v of every version v as the ES update made it (a digest), read through the trainer's hooks (θ_0 at the first
    tick, θ_v+1 when each update is applied): the reference that the parameters a member is rolled out with are
    checked against (independent of any ``params_at``). ``current``: the version θ is at now; ``ticks``: ticks done."""

    def __init__(self) -> None:
        from esjax.train.hooks import Hooks

        self.digests: dict[int, str] = {}
        self.current = self.ticks = 0
        self.hooks = Hooks()
        self.hooks.on_tick(self._ticked)
        self.hooks.on_version(self._versioned)

    def _ticked(self, trainer, tick) -> None:
        self.ticks += 1
        if tick.version not in self.digests:  # θ_0: no update is applied before the first tick ends
            self.digests[tick.version] = _digest(trainer.params)

    def _versioned(self, trainer, record) -> None:
        self.current = record.version + 1
        self.digests[self.current] = _digest(trainer.params)


def test_stale_members_are_rolled_out_with_their_own_versions_parameters(tmp_path, monkeypatch):
    """A member dispatched at version v acts with θ_v + σ_v·ε_(v,i), also when θ has moved on since: every policy
    call is recorded (the members' versions, σ and a digest of the base θ passed) and checked against θ_v as the
    update made it and σ_v of the schedule. If stale rows ran the newest θ (or σ), async ES would silently be
    sync ES and every comparison of two runs of the same code would still agree. Episodes end after uneven step
    counts (else a tiny random policy runs every episode to max_steps in lockstep and no row is ever stale)."""
    from run_settings import es_config_of

    import esjax.loop.rollout as rollout

    theta = ThetaHistory()
    reward_by_trace(monkeypatch, rollout.RolloutEngine)
    uneven_episodes(monkeypatch, rollout.RolloutEngine)
    calls = []
    dispatch = rollout.dispatch_scores

    def recording(model_config, params, prompts, cand_ids, perturbation, **kwargs):
        calls.append((np.asarray(perturbation.versions).tolist(), np.asarray(perturbation.active).tolist(),
                      float(perturbation.sigma), _digest(params), theta.current, theta.ticks))
        return dispatch(model_config, params, prompts, cand_ids, perturbation, **kwargs)

    monkeypatch.setattr(rollout, "dispatch_scores", recording)
    config = load_config(None, [*TINY, "run.updates=3", "run.eval_every=3", "run.checkpoint_every=3",
                                "es.sigma_schedule=linear", "es.sigma_final=0.01", "schedule.kind=async",
                                "schedule.max_lag=1"])
    result = train(config, run_dir=tmp_path / "run", hooks=theta.hooks)
    history = theta.digests
    assert theta_moved(result.records) and len(set(history.values())) == 4  # θ_0 … θ_3 all differ
    sigma_at = es_config_of(config).sigma_at
    stale = 0
    for versions, active, sigma, digest, current, _ in calls:
        (v,) = set(versions)  # one call serves one version
        assert digest == history[v], f"a row of version {v} ran with another θ (current version {current})"
        if any(active):
            assert sigma == pytest.approx(float(sigma_at(v)), rel=1e-6), (v, sigma)
            stale += v < current
    assert stale > 0, "no train row was rolled out after its version was superseded: nothing was checked"
    versions_by_tick = {}  # ticks whose live train rows span versions: an engine passing one θ to all would show
    for versions, active, *_, tick in calls:
        if any(active):
            versions_by_tick.setdefault(tick, set()).update(versions)
    assert any(len(vs) > 1 for vs in versions_by_tick.values()), "no tick served two versions: nothing was checked"


def test_evaluations_write_episode_traces(reference_run):
    """run.traces: eval (the default): traces/eval-v<version>.jsonl per evaluation, one line per goal."""
    from esjax.rundir.traces import SNIPPET_CHARS, read_traces
    from esjax.train.parts import load_task

    run_dir = reference_run.run_dir
    shop = load_task(load_config(run_dir / "config.yaml").env).data
    goals = list(shop.split("test"))[:6]
    evals = [r for r in reference_run.records if r["kind"] == "eval"]
    assert sorted(p.name for p in (run_dir / "traces").iterdir()) == [f"eval-v{r['version']}.jsonl" for r in evals]
    for record in evals:
        lines = read_traces(run_dir / "traces" / f"eval-v{record['version']}.jsonl")
        assert [line["position"] for line in lines] == list(range(6))
        assert [line["goal"] for line in lines] == goals and {line["version"] for line in lines} == {record["version"]}
        assert [line["instruction"] for line in lines] == [shop.goals[g].instruction_text for g in goals]
        assert 100 * np.mean([line["reward"] for line in lines]) == pytest.approx(record["score"])
        assert np.mean([line["success"] for line in lines]) == pytest.approx(record["success_rate"])
        for line in lines:
            assert 1 <= line["steps"] == len(line["actions"]) <= 6 and line["failure"] is None
            assert line["end"] in ("bought", "max_steps", "no_action")
            assert all(action and 0 < len(page) <= SNIPPET_CHARS for action, page in line["actions"])
            assert not any(page.startswith("Instruction") for _, page in line["actions"])  # said once per line
            assert ("reward_info" in line) == (line["end"] == "bought")
        assert record["score_ci_low"] <= record["score"] <= record["score_ci_high"]
        assert 0 <= record["success_ci_low"] <= record["success_rate"] <= record["success_ci_high"] <= 1


def test_rerun_is_bit_identical(reference_run, tmp_path):
    # run.traces and run.plots only add files: the run itself is the same with them off
    again = train(load_config(None, [*TINY, "run.traces=none"]), run_dir=tmp_path / "again")
    assert theta_moved(reference_run.records) and same_bits(reference_run.params, again.params)
    assert untimed(reference_run.records) == untimed(again.records)
    assert not (tmp_path / "again" / "traces").exists() and not (tmp_path / "again" / "plots").exists()
    assert (tmp_path / "again" / "summary.md").is_file()


def _run_cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          **kwargs)


def test_sigkill_then_resume_is_bit_identical(reference_run, tmp_path):
    run_dir = tmp_path / "killed"
    cmd = [sys.executable, "-m", "esjax.run", "--run-dir", str(run_dir)]
    for item in TINY:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 500
    try:
        while time.time() < deadline and proc.poll() is None:
            if (run_dir / "checkpoints" / "2").is_dir():
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    # resumed in this process (its programs are compiled already); the CLI's --resume is
    # test_corrupt_latest_checkpoint_falls_back's
    resumed = train(resume_config(run_dir), run_dir=run_dir, resume=True)
    assert theta_moved(reference_run.records)  # θ moved: the comparisons below can fail
    assert resumed.version == 4 and same_bits(reference_run.params, resumed.params)
    _, _, params, version = load_run(run_dir)
    assert version == 4
    assert same_bits(reference_run.params, params)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert untimed(records) == untimed(reference_run.records)  # no record lost or duplicated


def test_corrupt_latest_checkpoint_falls_back(reference_run, tmp_path):
    import shutil

    run_dir = tmp_path / "corrupt"
    shutil.copytree(reference_run.run_dir, run_dir)
    latest = run_dir / "checkpoints" / "4"
    for path in latest.rglob("*"):
        if path.is_file() and path.name != "commit_success.txt":
            path.write_bytes(b"corrupted")
    with pytest.warns(RuntimeWarning, match="falling back to the previous checkpoint"):
        _, _, _, version = load_run(run_dir)
    assert version == 3
    resumed = _run_cli("esjax.run", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "falling back to the previous checkpoint" in resumed.stderr
    _, _, params, version = load_run(run_dir)
    assert version == 4 and theta_moved(reference_run.records) and same_bits(reference_run.params, params)


def test_eval_and_export_of_a_run(reference_run, tmp_path, capsys):
    from esjax.cli import eval as eval_cli
    from esjax.cli import export as export_cli
    from esjax.rundir.traces import read_traces

    # both entry points in this process (the run's programs are compiled already); each as its own process:
    # tests/config/test_config.py::test_cli_exits_with_one_line_and_no_traceback
    traces = tmp_path / "eval-traces.jsonl"
    capsys.readouterr()
    assert eval_cli.main(["--run-dir", str(reference_run.run_dir), "--json", "--traces", str(traces)]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out.strip().splitlines()[-1])
    last_eval = [r for r in reference_run.records if r["kind"] == "eval"][-1]
    assert result["goals"] == 6 and result["score"] == pytest.approx(last_eval["score"])
    # per goal: index, reward, success flag; the intervals of the run's record; the run's episodes, traced
    run_lines = read_traces(reference_run.run_dir / "traces" / f"eval-v{last_eval['version']}.jsonl")
    assert result["goal_indices"] == [line["goal"] for line in run_lines]
    assert result["rewards"] == [line["reward"] for line in run_lines]
    assert result["success"] == [line["success"] for line in run_lines]
    assert result["score_ci_low"] == pytest.approx(last_eval["score_ci_low"])
    assert read_traces(traces) == [{k: v for k, v in line.items() if k != "version"} for line in run_lines]
    assert f"traces of 6 episodes written to {traces}" in out.err

    export_dir = tmp_path / "hf"
    assert export_cli.main(["--run-dir", str(reference_run.run_dir), "--out", str(export_dir)]) == 0
    # the export carries the run's env and agent settings: evaluating it with no flags reproduces the run's
    # final evaluation exactly (same 100-product shop, goals, step cap and prompt style), and says so
    settings = json.loads((export_dir / "esjax.json").read_text())
    assert settings["config"]["env"]["num_products"] == 100 and settings["config"]["env"]["max_steps"] == 6
    assert settings["exported_from"]["run_eval"]["score"] == last_eval["score"]
    capsys.readouterr()
    assert eval_cli.main(["--model", str(export_dir), "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert result["goals"] == 6 and result["score"] == last_eval["score"]
    assert f"settings from {export_dir / 'esjax.json'}: env.data=synthetic, env.num_products=100" in captured.err
    assert "env.max_steps=6" in captured.err and "agent.prompt_style=compact" in captured.err
    assert eval_cli.main(["--model", str(export_dir), "--json", "--goals", "3"]) == 0  # a flag still wins
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["goals"] == 3
    assert "overridden: env.eval_goals=3 (--goals)" in captured.err
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from esjax.model.decoder import forward
    from esjax.model.hf import load_pretrained

    model = transformers.AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32)
    tokens = np.array([[3, 17, 42, 7, 99, 5]])
    with torch.no_grad():
        ref = model(torch.tensor(tokens)).logits.numpy()
    pre = load_pretrained(export_dir)
    ours, _ = forward(pre.config, reference_run.params, jax.numpy.asarray(tokens))
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4)


def test_export_settings_keep_the_embedded_policys_prompt_style(tmp_path):
    """The embedded policy has a chat template but is trained on the compact prompt: reloaded as an HF model,
    ``prompt_style: auto`` would pick chat. The export records the style the run used, and eval reads it."""
    from esjax.cli.eval import read_run_settings
    from esjax.cli.export import run_settings
    from esjax.train.parts import build_policy, resolve_prompt_style

    config = load_config(None, ["model.source=embedded", "agent.prompt_style=auto", "env.max_steps=5"])
    policy = build_policy(config.model, None, config.run.seed)
    assert policy.chat_template is not None and resolve_prompt_style(config.agent, policy, "embedded") == "compact"
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "esjax.json").write_text(json.dumps({"format": 1, "config": run_settings(config, policy)}))
    base, _, path = read_run_settings(tmp_path)
    reloaded = load_config(None, ["model.source=hf", f"model.path={tmp_path}"], base=base, base_source=str(path))
    # not chat, although the model has a template
    assert resolve_prompt_style(reloaded.agent, policy, reloaded.model.source) == "compact"
    assert reloaded.env.max_steps == 5 and reloaded.env.data == config.env.data
    without = load_config(None, ["model.source=hf", f"model.path={tmp_path}"])
    # what eval did before the export kept settings
    assert resolve_prompt_style(without.agent, policy, without.model.source) == "chat"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_runs_on_real_webshop_data(kind, tmp_path):
    overrides = [*TINY, "env.data=webshop_small", f"schedule.kind={kind}", "run.updates=2",
                 "run.checkpoint_every=2", "run.eval_every=2"]
    result = train(load_config(None, overrides), run_dir=tmp_path / kind)
    updates = [r for r in result.records if r["kind"] == "update"]
    assert result.version == 2 and len(updates) == 2
    if kind == "sync":
        assert all(r["cohort_lag_hist"] == [8] for r in updates)
