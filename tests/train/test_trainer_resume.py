"""Versions, checkpoints and resume of the trainer, checked at every checkpoint rather than where a kill lands.

For three schedules (natural async, controlled staleness, all-stale) a small run with a checkpoint at every
version is trained once without interruption. Then:

* every version 1..updates has exactly one update record labelled with its own version — also when results
  held back for k updates come due together and one tick applies several updates (a cascade) — with the
  evaluations and checkpoints the config asks for, each checkpoint at a consistent point (θ and the
  coordinator at its version, no finished-but-unreported job);
* resuming from **every** checkpoint (later ones deleted, as if the run had been killed right after it)
  ends with θ bit-identical and ``metrics.jsonl`` record for record equal (timing fields aside) to the
  uninterrupted run, one record per (kind, version), wall times non-decreasing;
* resuming the finished run changes nothing;
* every dispatched job ends accepted, discarded or cancelled, and the last record carries those totals.

The policy is the embedded default (a ~1 MB model) on the WebShop data it was trained for (the packaged
1,000-product set), stepping the norm scales (``run_settings.embedded``: σ 0.2): its fitness varies from member
to member, so θ moves at every update and a bit-for-bit comparison means something (the tiny random model
earns reward 0 everywhere, so its θ never moves; the test asserts that fitness varied).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, interrupt_after_first_update, same_bits, theta_moved
from reliability import record
from run_settings import checkpoint_steps, embedded, killed_after, read_records

from esjax.config import config_to_yaml, load_config
from esjax.rundir.checkpoint import read_loop_state
from esjax.rundir.metrics import untimed
from esjax.rundir.traces import read_traces
from esjax.train.session import train

UPDATES = 5
POPULATION = 4
TASKS = 2
BASE = embedded(run__updates=UPDATES, run__eval_every=2, run__keep_checkpoints=100, es__population=POPULATION,
                env__tasks_per_member=TASKS, env__eval_goals=4)
SCHEDULES = {
    "async": ["schedule.kind=async", "schedule.max_lag=1"],
    "controlled": ["schedule.kind=controlled", "schedule.lag=2", "schedule.stale_fraction=0.5", "schedule.max_lag=2"],
    "all_stale": ["schedule.kind=all_stale", "schedule.lag=2", "schedule.max_lag=2"],
}


def _config(kind: str):
    return load_config(None, [*BASE, *SCHEDULES[kind]])


def _trace_files(run_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((run_dir / "traces").iterdir())}


@pytest.fixture(scope="module", params=list(SCHEDULES))
def reference(request, tmp_path_factory):
    kind = request.param
    result = train(_config(kind), run_dir=tmp_path_factory.mktemp(f"reference-{kind}"))
    return kind, result


def test_every_version_is_its_own_step(reference):
    """The regression test of the update cascade: one update record, evaluation and checkpoint per version."""
    kind, result = reference
    records = result.records
    updates = [r for r in records if r["kind"] == "update"]
    assert result.version == UPDATES
    assert [r["version"] for r in updates] == list(range(1, UPDATES + 1))
    assert [r["version"] for r in records if r["kind"] == "eval"] == [0, 2, 4, 5]  # eval_every 2, and the end
    assert checkpoint_steps(result.run_dir) == list(range(1, UPDATES + 1))  # checkpoint_every 1
    assert all(sum(r["cohort_lag_hist"]) == POPULATION for r in updates)
    if kind == "all_stale":  # results held for k = 2 updates come due together: several updates in one tick
        assert max(Counter(r["tick"] for r in updates).values()) >= 2
        assert all(r["cohort_lag_hist"] == [0, 0, POPULATION] for r in updates[2:])
    # non-vacuous: members' fitness differed (so θ moved), and bit-identity below compares something
    assert any(r["fitness_std"] > 0 for r in updates), (
        "every member earned the same reward: pick a policy / env setting where fitness varies, or the resume "
        "test compares nothing")
    for step in checkpoint_steps(result.run_dir):
        loop = read_loop_state(result.run_dir, step)
        assert loop["coordinator"]["version"] == step  # θ and the coordinator at the checkpoint's version
        finished_unreported = [j for j, data in loop["jobs"].items() if len(data["rewards"]) == TASKS]
        assert finished_unreported == []  # a consistent point: every finished job reported


def test_resume_from_every_checkpoint_is_bit_identical(reference, tmp_path):
    kind, result = reference
    reference_records = read_records(result.run_dir)
    steps = checkpoint_steps(result.run_dir)
    assert steps == list(range(1, UPDATES + 1)) and theta_moved(reference_records)
    for step in steps:
        run_dir = killed_after(result.run_dir, step, tmp_path / f"from-{step}")
        resumed = train(load_config(run_dir / "config.yaml"), run_dir=run_dir, resume=True)
        assert resumed.version == UPDATES
        assert same_bits(resumed.params, result.params), f"{kind}: θ differs after resuming from {step}"
        assert _trace_files(run_dir) == _trace_files(result.run_dir), f"{kind}: traces differ after resuming"
        records = read_records(run_dir)
        assert untimed(records) == untimed(reference_records), f"{kind}: records differ after resuming from {step}"
        keys = Counter((r["kind"], r["version"]) for r in records if r["kind"] != "event")
        assert max(keys.values()) == 1
        walls = [r["wall_time"] for r in records]
        assert walls == sorted(walls), f"{kind}: wall_time goes back after resuming from {step}"
        assert resumed.totals == result.totals
    bought = [line for path in (result.run_dir / "traces").iterdir() for line in read_traces(path)
              if line["end"] == "bought"]
    assert bought and all({"r_type", "r_att", "r_option", "r_price"} <= set(line["reward_info"]) for line in bought)
    assert all(line["reward"] == line["reward_info"]["reward"] for line in bought)
    schedule = ", ".join(item.removeprefix("schedule.") for item in SCHEDULES[kind][1:])
    record(f"storage-resume-every-checkpoint-{kind}", area="storage",
           fault=f"run killed right after any one of its checkpoints ({kind} schedule: {schedule})",
           injection=f"a {UPDATES}-update run (N={POPULATION}, checkpoint every version) is copied once per "
                     "checkpoint with the later checkpoints deleted, then resumed "
                     "(esjax.train.session.train(resume=True))",
           expected="final θ bit-identical and metrics.jsonl record for record equal (timing fields aside) to the "
                    "uninterrupted run; one record per (kind, version); wall_time non-decreasing",
           observed=f"all {len(steps)} resumes (from checkpoints {steps[0]}..{steps[-1]}) end at version "
                    f"{UPDATES} with θ bit-identical, {len(reference_records)} records equal to the reference run's "
                    "and the same final totals",
           accepted_lost="no: every checkpoint is a consistent point (all finished jobs reported, θ and "
                         "coordinator at its version); what came after it is recomputed identically",
           test=f"tests/train/test_trainer_resume.py::test_resume_from_every_checkpoint_is_bit_identical[{kind}]")


def test_resuming_a_finished_run_changes_nothing(reference, tmp_path):
    _, result = reference
    run_dir = tmp_path / "finished"
    shutil.copytree(result.run_dir, run_dir)
    before = (run_dir / "metrics.jsonl").read_bytes()
    resumed = train(load_config(run_dir / "config.yaml"), run_dir=run_dir, resume=True)
    assert (run_dir / "metrics.jsonl").read_bytes() == before  # no evaluation or record appended
    assert resumed.version == UPDATES and same_bits(resumed.params, result.params)
    assert checkpoint_steps(run_dir) == checkpoint_steps(result.run_dir)


def test_every_dispatched_job_is_accounted_for(reference):
    _, result = reference
    end = result.records[-1]
    assert end["kind"] == "end" and end["version"] == UPDATES
    totals = result.totals
    assert {k: end[k] for k in totals} == totals  # the last record carries the coordinator's final totals
    assert totals["in_flight"] == totals["held"] == 0
    assert totals["accepted"] == POPULATION * UPDATES == sum(totals["lag_hist"])
    assert totals["dispatched"] == totals["accepted"] + totals["discarded"] + totals["cancelled"]
    assert totals["discarded"] == sum(totals["discarded_by"].values())
    assert [r for r in result.records if r["kind"] == "end"] == [end]


# ------------------------------------------------------------------------------------------- stops between versions
EVERY_TICK = ["run.checkpoint_every=1000", "run.checkpoint_minutes=0.000001"]  # a checkpoint at the end of every tick


def test_resume_from_a_tick_end_checkpoint_is_bit_identical(tmp_path):
    """``run.checkpoint_minutes`` checkpoints at the end of a tick, between versions (with in-flight jobs, held
    results and evaluations in progress). With a cadence that fires every tick, each version's checkpoint is its
    last tick; resuming from a sample of them (version 0's, mid-evaluation, and a later one) ends bit-identical to
    the uninterrupted run (every version's checkpoint is resumed from in the tests above)."""
    config = load_config(None, [*BASE, *SCHEDULES["async"], *EVERY_TICK])
    result = train(config, run_dir=tmp_path / "reference")
    reference_records = read_records(result.run_dir)
    assert theta_moved(reference_records)
    steps = checkpoint_steps(result.run_dir)
    assert steps == list(range(UPDATES + 1))  # version 0 too: long before checkpoint_every would have saved
    assert read_loop_state(result.run_dir, 0)["episodes"]  # a tick end with episodes in flight
    for step in (0, UPDATES - 2):
        run_dir = killed_after(result.run_dir, step, tmp_path / f"from-{step}")
        resumed = train(load_config(run_dir / "config.yaml"), run_dir=run_dir, resume=True)
        assert same_bits(resumed.params, result.params), f"θ differs after resuming from tick-end checkpoint {step}"
        assert untimed(read_records(run_dir)) == untimed(reference_records), f"records differ after {step}"
        assert _trace_files(run_dir) == _trace_files(result.run_dir)


def test_sigint_mid_run_checkpoints_the_tick_and_the_resume_is_bit_identical(tmp_path, child_env):
    """Ctrl-C (SIGINT) sent to a real ``python -m esjax.run`` child long before its first checkpoint: it finishes
    the tick, writes a checkpoint there, prints the resume command and exits 130; resuming ends where an
    uninterrupted run of the same config ends, θ bit for bit and records equal."""
    overrides = [*BASE, *SCHEDULES["async"], "run.checkpoint_every=1000", "run.checkpoint_minutes=null",
                 f"run.updates={UPDATES + 3}"]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config_to_yaml(load_config(None, overrides)))
    run_dir = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "esjax.run", "--config", str(config_file), "--run-dir",
                             str(run_dir)], env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    err = interrupt_after_first_update(proc, run_dir)  # checkpoint_every 1000: the SIGINT checkpoint is the only one
    assert proc.returncode == 130, err[-2000:]
    steps = checkpoint_steps(run_dir)
    assert len(steps) == 1 and 1 <= steps[0] < UPDATES + 3, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert any(line.startswith("SIGINT: writing a checkpoint at the end of this tick") for line in lines)
    assert lines[-2].startswith(f"interrupted at version {steps[0]}; latest checkpoint: version {steps[0]} ")
    assert lines[-1] == f"resume with: python -m esjax.run --resume {run_dir}"
    resumed = train(load_config(run_dir / "config.yaml"), run_dir=run_dir, resume=True)
    reference = train(load_config(config_file), run_dir=tmp_path / "reference")
    assert theta_moved(reference.records) and same_bits(resumed.params, reference.params)
    assert untimed(read_records(run_dir)) == untimed(read_records(reference.run_dir))
