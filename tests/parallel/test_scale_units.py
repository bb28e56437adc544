"""Scale-out pieces without a mesh run: result encoding, the single-process exchange, mesh parsing,
distributed settings from the environment, and bounded failure when a peer is missing or dies."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from esjax.loop.types import Member, Result
from esjax.model.sharding import MeshError, mesh_shape, pad_rows_to, parse_mesh
from esjax.parallel import multihost
from esjax.parallel.multihost import DistributedConfig, DistributedError, decode_results, encode_results

REPO = Path(__file__).resolve().parents[2]


def _results() -> list[Result]:
    return [Result(7, Member(3, 1), 0.1 + 0.2, 1.5), Result(2, Member(2, 0), -1e-300, 0.0),
            Result(5, Member(3, 0), math.inf, 2.25)]


def test_results_round_trip_bit_exactly_through_int32_rows():
    rows = encode_results(_results(), capacity=5)
    assert rows.shape == (5, 8) and rows.dtype.name == "int32"
    assert decode_results(rows) == _results()  # float64 fitness/duration survive exactly (0.1 + 0.2 too)
    with pytest.raises(ValueError, match="capacity"):
        encode_results(_results(), capacity=2)


def test_single_process_exchange_sorts_and_rejects_duplicate_owners():
    results = _results()
    assert [r.job_id for r in multihost.exchange_results(results, capacity=1)] == [2, 5, 7]
    assert multihost.exchange_results([]) == []
    with pytest.raises(DistributedError, match="more than one process"):
        multihost.exchange_results(results + results[:1])


def test_mesh_parsing_and_errors():
    assert parse_mesh("data=2,model=4") == {"data": 2, "model": 4}
    assert parse_mesh("model=2") == {"data": 0, "model": 2}
    assert mesh_shape(0, 2, 8) == (4, 2)
    for bad in ("data=2,pipe=2", "data=x", "model=0"):
        with pytest.raises(MeshError):
            parse_mesh(bad)
    with pytest.raises(MeshError, match="8 are available"):
        mesh_shape(3, 2, 8)


def test_pad_rows_to_the_data_axis():
    class _Mesh:
        shape = {"data": 4, "model": 2}

    assert pad_rows_to(30, _Mesh()) == 32
    assert pad_rows_to(3, _Mesh(), multiple=3) == 12


def test_distributed_config_from_env():
    env = {"ESJAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "ESJAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2",
           "ESJAX_LOCAL_DEVICE_IDS": "0,1", "ESJAX_INIT_TIMEOUT": "30"}
    cfg = DistributedConfig.from_env(env)
    assert (cfg.coordinator_address, cfg.num_processes, cfg.process_id) == ("10.0.0.1:1234", 4, 2)
    assert cfg.local_device_ids == (0, 1) and cfg.init_timeout == 30 and cfg.heartbeat_timeout == 100
    assert DistributedConfig.from_env({}, process_id=1).process_id == 1
    with pytest.raises(DistributedError, match="ESJAX_NUM_PROCESSES"):
        DistributedConfig.from_env({"ESJAX_NUM_PROCESSES": "two"})
    with pytest.raises(DistributedError, match="process_id"):
        DistributedConfig.from_env(env, process_id=4)


def test_setup_builds_the_mesh_from_a_config_section():
    from esjax.config import MeshSection
    from esjax.parallel import setup

    mesh, info = setup(MeshSection(data=0, model=1))
    assert dict(mesh.shape) == {"data": info.device_count, "model": 1} and info.process_count == 1


_JOIN = textwrap.dedent("""
    import os, sys, time
    from esjax.parallel import multihost
    from esjax.loop.types import Member, Result
    multihost.initialize()
    print("joined", flush=True)
    if multihost.process_info().process_index == 1:
        os._exit(0)  # a peer dying without a goodbye
    for tick in range(10000):
        multihost.exchange_results([Result(tick, Member(0, tick), 0.0)])
        time.sleep(0.05)
    print("survived", flush=True)
""")


def test_missing_peer_fails_initialize_within_the_timeout(python_child, port):
    start = time.monotonic()
    proc = python_child(_JOIN, env={"ESJAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "ESJAX_NUM_PROCESSES": "2",
                                    "ESJAX_PROCESS_ID": "0", "ESJAX_INIT_TIMEOUT": "3"}, timeout=120, check=False)
    assert proc.returncode != 0 and "joined" not in proc.stdout
    assert "DistributedError" in proc.stderr and "did not form within 3 s" in proc.stderr
    assert time.monotonic() - start < 60


def test_dead_peer_stops_the_survivor_instead_of_hanging(child_env, port):
    procs = [subprocess.Popen([sys.executable, "-c", _JOIN], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=child_env(ESJAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", ESJAX_NUM_PROCESSES="2",
                                            ESJAX_PROCESS_ID=str(pid), ESJAX_INIT_TIMEOUT="60",
                                            ESJAX_HEARTBEAT_TIMEOUT="3"))
             for pid in range(2)]
    try:
        out0, err0 = procs[0].communicate(timeout=120)
        procs[1].communicate(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert "joined" in out0 and "survived" not in out0
    assert procs[0].returncode != 0
    assert "another task died" in err0 or "stopped sending heartbeats" in err0
