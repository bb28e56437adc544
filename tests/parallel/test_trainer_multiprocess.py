"""The trainer as a multi-process job: ``python -m esjax.run`` started as 2 jax.distributed processes × 4 simulated
CPU devices ends with the θ and the metrics of one process driving 8 devices; killing one process mid-run and
resuming both from the run directory finishes with the same θ as the uninterrupted job."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
from conftest import REPO, free_port
from run_settings import read_records

from esjax.rundir.metrics import untimed
from esjax.train.parts import load_run

# The embedded policy on the packaged real WebShop data (a random model scores 0 everywhere and θ would not move).
TINY = ["run.updates=3", "run.eval_every=3", "run.checkpoint_every=1", "es.population=8", "schedule.slots=4",
        "env.eval_goals=4", "env.tasks_per_member=2", "env.max_steps=5", "run.progress=false", "run.plots=false",
        "mesh.data=8", "mesh.model=1"]


def _settings(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def _job(child_env, argv: list[str], tmp_path: Path, name: str, heartbeat: int = 100) -> list[subprocess.Popen]:
    """``python -m esjax.run *argv`` as 2 processes of one distributed job (4 CPU devices each)."""
    port = free_port()
    procs = []
    for p in range(2):
        env = child_env(fast=True, ESJAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", ESJAX_NUM_PROCESSES="2",
                        ESJAX_PROCESS_ID=str(p), ESJAX_CPU_DEVICES="4", ESJAX_INIT_TIMEOUT="120",
                        ESJAX_HEARTBEAT_TIMEOUT=str(heartbeat))
        procs.append(subprocess.Popen([sys.executable, "-m", "esjax.run", *argv], cwd=REPO, env=env,
                                      stdout=(tmp_path / f"{name}{p}.out").open("w"),
                                      stderr=(tmp_path / f"{name}{p}.err").open("w")))
    return procs


def _wait(procs: list[subprocess.Popen], tmp_path: Path, name: str, timeout: float = 900) -> None:
    for p, proc in enumerate(procs):
        rc = proc.wait(timeout=timeout)
        assert rc == 0, f"process {p} of {name} exited {rc}:\n" + (tmp_path / f"{name}{p}.err").read_text()[-3000:]


def _final(run_dir: Path) -> tuple[int, list[np.ndarray]]:
    """The version and θ of the run's latest checkpoint, restored in this (single-device) process."""
    _, _, params, version = load_run(run_dir)
    return version, [np.asarray(x) for x in jax.tree.leaves(params)]


def _records(run_dir: Path) -> list[dict]:
    return untimed(read_records(run_dir))


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)


def test_two_processes_match_one_process_and_resume_after_a_kill(tmp_path, python_child, child_env):
    one = tmp_path / "one"
    python_child(["-m", "esjax.run"], *_settings(*TINY), "--run-dir", one, devices=8, fast=True, timeout=900)

    two = tmp_path / "two"
    # plots on here only: run.plots adds files and changes no record, and the primary alone draws them
    _wait(_job(child_env, [*_settings(*TINY, "mesh.distributed=true", "run.plots=true"), "--run-dir", str(two)],
               tmp_path, "two"), tmp_path, "two")
    assert (two / "summary.md").is_file() and (two / "plots").is_dir()  # the primary wrote the run's files
    v1, theta1 = _final(one)
    v2, theta2 = _final(two)
    assert v1 == v2 == 3
    _same(theta1, theta2)
    assert _records(one) == _records(two)

    # Kill process 1 once the first checkpoint is on disk; process 0 is stopped by the job's heartbeat.
    killed = tmp_path / "killed"
    procs = _job(child_env, [*_settings(*TINY, "mesh.distributed=true"), "--run-dir", str(killed)], tmp_path,
                 "killed", heartbeat=5)
    deadline = time.monotonic() + 600
    while not (killed / "checkpoints" / "1").is_dir() and time.monotonic() < deadline:
        assert procs[1].poll() is None, (tmp_path / "killed1.err").read_text()[-3000:]
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGKILL)
    assert procs[0].wait(timeout=120) != 0  # the survivor does not hang in a collective
    procs[1].wait()
    done = [int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit()]
    assert max(done) < 3, "the job finished before the kill: nothing was resumed"
    _wait(_job(child_env, ["--resume", str(killed)], tmp_path, "resumed"), tmp_path, "resumed")
    v3, theta3 = _final(killed)
    assert v3 == 3
    _same(theta2, theta3)
    assert _records(killed) == _records(two)


def _build_md_two_process_commands() -> list[str]:
    """The two shell command lines of BUILD.md's "Several processes" recipe, continuation lines joined."""
    section = (REPO / "BUILD.md").read_text().split("**Several processes**", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    return [" ".join(line.split()) for line in lines]


def test_build_md_two_process_recipe_as_written_trains_like_one_process(tmp_path, python_child, child_env):
    """BUILD.md's two-process command lines, run as written (only the port and the run directory replaced), train
    the main job's policy: θ moves, and the records equal one process driving 8 devices with the same settings."""
    commands = _build_md_two_process_commands()
    assert len(commands) == 2 and all("python -m esjax.run --config configs/default.yaml" in c for c in commands)
    two, port = tmp_path / "two", free_port()
    procs = [subprocess.Popen(["bash", "-c", command.replace("127.0.0.1:8476", f"127.0.0.1:{port}")
                               .replace("runs/two", str(two))], cwd=REPO, env=child_env(fast=True),
                              stdout=(tmp_path / f"recipe{p}.out").open("w"),
                              stderr=(tmp_path / f"recipe{p}.err").open("w")) for p, command in enumerate(commands)]
    _wait(procs, tmp_path, "recipe")
    argv = commands[0].split("python -m esjax.run ", 1)[1].replace("--set mesh.distributed=true ", "").split()
    one = tmp_path / "one"
    python_child(["-m", "esjax.run"], *[a if a != "runs/two" else str(one) for a in argv], devices=8, fast=True,
                 timeout=900)
    records = _records(two)
    assert any(r["kind"] == "update" and r["update_norm"] > 0 for r in records), "θ did not move"
    assert [r["goals"] for r in records if r["kind"] == "eval"] == [20, 20]  # env.eval_goals as asked
    assert records == _records(one)
    _same(_final(two)[1], _final(one)[1])
    chatter = [line for p in range(2) for stream in ("out", "err")
               for line in (tmp_path / f"recipe{p}.{stream}").read_text().splitlines() if "[Gloo]" in line]
    assert not chatter, chatter[:3]  # collective set-up messages are silenced
