"""Multi-host fault: in a 2-process jax.distributed job exchanging results every tick (the replicated
coordinator's collective, esjax.parallel.multihost), one process is SIGKILLed; the survivor must exit with a
clear error within a bounded time instead of hanging in the collective."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from reliability import record

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT = 3
BOUND = 60  # seconds from the kill to the survivor's exit

_TICKS = textwrap.dedent("""
    import time
    from esjax.parallel import multihost
    from esjax.loop.types import Member, Result
    me = multihost.initialize().process_index
    print("joined", flush=True)
    for tick in range(100000):  # each process owns the even / odd job ids
        got = multihost.exchange_results([Result(2 * tick + me, Member(0, 2 * tick + me), 0.0)])
        if tick == 3:
            print("exchanging", len(got), flush=True)
        time.sleep(0.02)
    print("survived", flush=True)
""")


def test_sigkilled_peer_stops_the_survivor_within_a_bounded_time(tmp_path, child_env, port):
    logs = [(tmp_path / f"out{p}.txt", tmp_path / f"err{p}.txt") for p in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", _TICKS], cwd=REPO, stdout=logs[p][0].open("w"),
                              stderr=logs[p][1].open("w"),
                              env=child_env(ESJAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", ESJAX_NUM_PROCESSES="2",
                                            ESJAX_PROCESS_ID=str(p), ESJAX_INIT_TIMEOUT="120",
                                            ESJAX_HEARTBEAT_TIMEOUT=str(HEARTBEAT)))
             for p in range(2)]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all("exchanging 2" in logs[p][0].read_text() for p in range(2)):
            assert all(proc.poll() is None for proc in procs), [logs[p][1].read_text()[-2000:] for p in range(2)]
            time.sleep(0.1)
        assert all("exchanging 2" in logs[p][0].read_text() for p in range(2)), "the job never formed"
        killed_at = time.monotonic()
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        procs[0].wait(timeout=BOUND + 60)
        exit_after = time.monotonic() - killed_at
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out0, err0 = logs[0][0].read_text(), logs[0][1].read_text()
    assert procs[0].returncode != 0 and "survived" not in out0
    assert exit_after < BOUND, exit_after
    clear = [line for line in err0.splitlines() if "another task died" in line or "heartbeat" in line.lower()]
    assert clear, err0[-3000:]
    record("multihost-dead-peer", area="multi-host",
           fault="one process of a 2-process jax.distributed job SIGKILLed while both exchange results every tick",
           injection="two CPU processes run multihost.exchange_results in a loop "
                     f"(ESJAX_HEARTBEAT_TIMEOUT={HEARTBEAT}); the test SIGKILLs process 1",
           expected=f"process 0 exits non-zero with an error naming the dead peer within {BOUND} s, no hang",
           observed=f"process 0 exited with code {procs[0].returncode} within {BOUND} s of the kill; its stderr "
                    "says the distributed service detected that another task died / stopped heartbeating",
           accepted_lost="n/a (no coordinator state in this job; a trainer resumes from its last checkpoint)",
           test="tests/parallel/test_reliability_multihost.py::test_sigkilled_peer_stops_the_survivor_within_a_bounded_time")
