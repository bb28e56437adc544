"""Storage faults: SIGKILL inside a checkpoint save leaves the previous checkpoint loadable (and the run
resumes to the same result); a read-only or full run directory stops the run with a one-line error and the
last complete checkpoint intact."""

from __future__ import annotations

import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import same_bits
from reliability import record
from run_settings import embedded, read_records

from esjax.config import load_config
from esjax.rundir.checkpoint import Checkpointer, StorageError
from esjax.rundir.metrics import read_metrics, untimed
from esjax.train.parts import load_run
from esjax.train.session import train

REPO = Path(__file__).resolve().parents[2]
# The embedded policy on the packaged real WebShop data, stepping its norm scales (the main job's step until 5 Dec):
# members' fitness differs, so θ moves at every update and "θ bit-identical after the fault" compares something
# (a random model's θ never moves).
BASE = embedded()


def _cli_args(run_dir: Path) -> list[str]:
    args = ["--run-dir", str(run_dir)]
    for item in BASE:
        args += ["--set", item]
    return args


def _history(records, upto=None):
    keys = ("version", "lag_hist", "fitness_mean", "fitness_max", "fitness_std", "accepted")
    return [{k: r[k] for k in keys} for r in records
            if r["kind"] == "update" and (upto is None or r["version"] <= upto)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return train(load_config(None, BASE), run_dir=tmp_path_factory.mktemp("reference"))


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 500) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not path.exists():
        time.sleep(0.05)
    tail = proc.stderr.read()[-2000:] if proc.stderr and proc.poll() is not None else ""
    assert path.exists(), f"{path} never appeared (rc={proc.poll()}): {tail}"


def test_sigkill_inside_checkpoint_save_keeps_the_previous_one(reference, tmp_path):
    run_dir = tmp_path / "killed"
    cmd = [sys.executable, str(REPO / "tests" / "reliability_hooks.py"), "stall-in-save", "2", "--",
           *_cli_args(run_dir)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(run_dir / "STALLED_IN_SAVE", proc)
        partial = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert "2.orbax-checkpoint-tmp" in partial and "2" not in partial  # killed mid-write of step 2
    checkpointer = Checkpointer(run_dir)
    try:
        assert checkpointer.steps() == [1]
    finally:
        checkpointer.close()
    _, _, params, version = load_run(run_dir)
    assert version == 1
    # Everything accepted up to the surviving checkpoint is there, and the run resumes to the same end.
    assert _history(read_records(run_dir), upto=1) == _history(reference.records, upto=1)
    resumed = train(load_config(run_dir / "config.yaml"), run_dir=run_dir, resume=True)
    assert not same_bits(reference.params, _params_at(reference, 1, tmp_path))  # θ moved: the comparison counts
    assert resumed.version == 3 and same_bits(resumed.params, reference.params)
    assert _history(resumed.records) == _history(reference.records)
    assert untimed(read_records(run_dir)) == untimed(reference.records)  # record for record, nothing twice
    record("storage-sigkill-in-save", area="storage", fault="trainer SIGKILLed inside Checkpointer.save of step 2",
           injection="tests/reliability_hooks.py stalls orbax's JSON item write of step 2 (inside its temporary "
                     "folder); the test SIGKILLs the trainer there",
           expected="only the temporary folder is left; checkpoint 1 loads; resume ends where an uninterrupted "
                    "run ends",
           observed=f"folders {partial}; steps() = [1]; load_run -> version {version}; resumed run reached "
                    f"version {resumed.version} with θ bit-identical and metrics.jsonl record for record equal "
                    "(timing aside) to the reference run",
           accepted_lost="no: history up to version 1 kept, versions 2-3 recomputed identically",
           test="tests/rundir/test_reliability_storage.py::test_sigkill_inside_checkpoint_save_keeps_the_previous_one")


@pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("nsenter") is None,
                    reason="needs unshare/nsenter for a private read-only bind mount")
def test_read_only_run_directory_stops_with_one_line(tmp_path):
    run_dir = tmp_path / "ro"
    run_dir.mkdir()
    inner = (f"mount --bind {run_dir} {run_dir} && exec {sys.executable} -m esjax.run "
             + " ".join(_cli_args(run_dir)))
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            f"mount --bind {run_dir} {run_dir}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("mount namespaces are not permitted here")
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", inner], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(run_dir / "checkpoints" / "1", proc)
        # unshare and sh exec into python, so proc.pid is the trainer; change its view of the run dir only.
        # A read-only bind mount over the run dir (a remount is refused while files are open for writing):
        # from now on nothing new can be created there.
        remount = subprocess.run(["nsenter", "-t", str(proc.pid), "-m", "mount", "--bind", "-o", "ro", str(run_dir),
                                  str(run_dir)], capture_output=True, text=True)
        assert remount.returncode == 0, (remount.stderr, proc.poll())
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert proc.returncode == 2, err[-3000:]
    assert lines[-1].startswith("error: ") and "Read-only file system" in lines[-1], err[-3000:]
    assert "Traceback" not in err
    _, _, params, version = load_run(run_dir)
    assert version >= 1 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
    saved = version
    records = read_records(run_dir)
    assert [r["version"] for r in records if r["kind"] == "update"][:saved] == list(range(1, saved + 1))
    record("storage-read-only", area="storage", fault="run directory becomes read-only mid-run",
           injection="trainer started in a private mount namespace; after checkpoint 1 the test mounts a "
                     "read-only bind of the run dir over it (nsenter … mount --bind -o ro)",
           expected="one-line `error:` naming the problem, exit code 2, no traceback; last checkpoint intact",
           observed=f"exit code {proc.returncode}; stderr ends with one line mentioning 'Read-only file system'; "
                    f"latest checkpoint loads at version {saved}",
           accepted_lost=f"no: metrics and checkpoint hold every update up to version {saved}",
           test="tests/rundir/test_reliability_storage.py::test_read_only_run_directory_stops_with_one_line")


def test_full_disk_stops_with_one_line(reference, monkeypatch, tmp_path):
    """ENOSPC-like: the kernel refuses writes past a file-size limit (RLIMIT_FSIZE, enforced even for root)."""
    run_dir = tmp_path / "full"
    original_save = Checkpointer.save
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)

    def save(self, step, es_state, loop_state):
        original_save(self, step, es_state, loop_state)
        if step == 1:  # from now on no file may grow past 1 KiB: the next metrics line or checkpoint fails
            resource.setrlimit(resource.RLIMIT_FSIZE, (1024, limits[1]))

    monkeypatch.setattr(Checkpointer, "save", save)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # CPython ignores it already; make sure
    try:
        with pytest.raises(StorageError) as info:
            train(load_config(None, BASE), run_dir=run_dir)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    message = str(info.value)
    assert "\n" not in message and "File too large" in message and str(run_dir) in message
    assert isinstance(info.value, StorageError)
    _, _, params, version = load_run(run_dir)
    assert version == 1 and same_bits(params, _params_at(reference, 1, tmp_path))
    # the write that hit the limit may leave a torn last line; readers (and a resume) skip it
    assert _history(read_metrics(run_dir / "metrics.jsonl"), upto=1) == _history(reference.records, upto=1)
    record("storage-full-disk", area="storage", fault="disk full: writes fail after checkpoint 1",
           injection="RLIMIT_FSIZE lowered to 1 KiB right after checkpoint 1 is saved (the kernel fails "
                     "further writes with EFBIG, as for ENOSPC)",
           expected="StorageError with a one-line message naming the run dir; last checkpoint intact",
           observed=f"StorageError: '{message.split('(')[1].split(')')[0]}'; latest checkpoint loads at version "
                    f"{version} and equals the reference run's θ at version 1",
           accepted_lost="no: checkpoint and metrics hold the accepted history up to version 1",
           test="tests/rundir/test_reliability_storage.py::test_full_disk_stops_with_one_line")


def _params_at(reference, version: int, tmp_path: Path):
    """θ of the reference run at ``version``, from its own checkpoint."""
    copy = tmp_path / "reference-copy"
    shutil.copytree(reference.run_dir, copy)
    for step in (copy / "checkpoints").iterdir():
        if step.name.isdigit() and int(step.name) > version:
            shutil.rmtree(step)
    _, _, params, _ = load_run(copy)
    return params
