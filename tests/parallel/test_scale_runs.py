"""Scale-out end to end: a 3-update bounded-staleness run (tiny decoder, model-derived fitness, lag-0 and
lag-1 members) ends with the same θ on one device, on 8 simulated devices as (data=2, model=4) and (8, 1),
and on two processes × 2 devices with JAX's distributed runtime — and the sharded update keeps θ sharded.

Each configuration runs in its own subprocess (device counts are fixed when JAX starts). XLA's CPU backend
optimization is turned down in those subprocesses: it halves compile time and changes no result here (the
reference runs under the same flags).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, python_child) -> dict[str, np.ndarray]:
    """θ after the 3-update run on a single device (one process, no distributed runtime)."""
    out = tmp_path_factory.mktemp("ref") / "ref.npz"
    proc = python_child(["-m", "esjax.parallel.smoke", "--mesh", "data=1,model=1", "--out", out], fast=True,
                        timeout=300)
    (line,) = _json_lines(proc.stdout)
    assert line["version"] == 3 and line["lag_hist"][1] > 0  # stale members were applied
    return _load(out)


_MESH_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from esjax.es.noise import NoiseSpec, pair_noise
    from esjax.model.sharding import make_mesh
    from esjax.parallel import per_device_bytes, update_memory
    from esjax.parallel.smoke import deterministic_run
    out = {}
    for data, model in [(2, 4), (8, 1)]:
        mesh = make_mesh(data, model)
        r = deterministic_run(mesh)
        np.savez(f"{sys.argv[1]}/{data}x{model}.npz", **{k.replace('/', '.'): v for k, v in r.params_numpy().items()})
        total = sum(int(x.nbytes) for x in jax.tree.leaves(r.state.params))
        info = {"total_bytes": total, "max_device_bytes": max(per_device_bytes(r.state.params).values()),
                "specs": {k: list(v.sharding.spec) for k, v in
                          [("up", r.state.params["layers"]["mlp"]["up_proj"]["kernel"]),
                           ("embed", r.state.params["embed"]["embedding"])]},
                "lags": [rec.cohort.lags.tolist() for rec in r.records]}
        if model > 1:
            info["memory"] = update_memory(r.sharded, 4)
            # noise drawn straight into a sharded layout equals the single-device draw, bit for bit
            spec = NoiseSpec(seed=3, mode="full")
            draw = lambda: pair_noise(spec, "layers/mlp/up_proj/kernel", (2, 32, 48), 5, 7)
            sharded = jax.jit(draw, out_shardings=NamedSharding(mesh, P(None, "data", "model")))()
            single = jax.jit(draw, out_shardings=jax.sharding.SingleDeviceSharding(jax.devices()[0]))()
            info["noise_bit_identical"] = bool(np.array_equal(np.asarray(sharded), np.asarray(single)))
            info["noise_shards"] = len({s.device for s in sharded.addressable_shards})
        out[f"{data}x{model}"] = info
    print(json.dumps(out))
""")


def test_sharded_meshes_match_single_device_and_keep_params_sharded(reference, tmp_path, python_child):
    proc = python_child(_MESH_SCRIPT, tmp_path, devices=8, fast=True, timeout=600)
    (info,) = _json_lines(proc.stdout)
    for name in ("2x4", "8x1"):
        got = _load(tmp_path / f"{name}.npz")
        assert _max_diff(got, reference) <= TOL, name
        assert any(1 in lags for lags in info[name]["lags"])  # cohorts mixed lag-0 and lag-1 members
    tp = info["2x4"]
    assert tp["specs"]["up"] == [None, None, "model"]
    assert tp["specs"]["embed"] == ["model", None]
    # θ sharded 4 ways over 'model': no device holds more than ~1/4 (+ the small replicated norms)
    assert tp["max_device_bytes"] < tp["total_bytes"] / 3
    mem = tp["memory"]
    assert mem["params_sharded_like_input"]
    assert mem["argument_bytes"] < tp["total_bytes"] / 3  # the update's inputs per device: a shard of θ
    assert mem["output_bytes"] < tp["total_bytes"] / 3  # ... and its outputs: no full replica of θ
    assert mem["temp_bytes"] < 2 * tp["total_bytes"]
    assert tp["noise_bit_identical"] and tp["noise_shards"] == 8
    assert info["8x1"]["max_device_bytes"] == info["8x1"]["total_bytes"]  # pure data parallel: replicated θ


def test_two_processes_match_one_process_and_share_a_checkpoint(reference, tmp_path, child_env, port):
    """Capacity 1 per exchange round: ticks where a process finished several rows take several rounds."""
    run_dir, out = tmp_path / "run", tmp_path / "mp.npz"
    procs = []
    for pid in range(2):
        env = child_env(fast=True, ESJAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", ESJAX_NUM_PROCESSES="2",
                   ESJAX_PROCESS_ID=str(pid), ESJAX_CPU_DEVICES="2", ESJAX_INIT_TIMEOUT="60",
                   ESJAX_HEARTBEAT_TIMEOUT="30")
        cmd = [sys.executable, "-m", "esjax.parallel.smoke", "--distributed", "--mesh", "data=2,model=2",
               "--checkpoint-dir", str(run_dir), "--out", str(out), "--exchange-capacity", "1"]
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outputs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=400)
            outputs.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rc, _, stderr in outputs:
        assert rc == 0, stderr[-3000:]
    lines = [_json_lines(stdout)[0] for _, stdout, _ in outputs]
    assert [line["process"] for line in lines] == [0, 1]
    assert all(line["processes"] == 2 and line["devices"] == 4 for line in lines)
    assert lines[0]["checksum"] == lines[1]["checksum"]  # both replicas hold the same θ
    assert lines[0]["owned_rows"] == [0, 1, 2] and lines[1]["owned_rows"] == [3, 4, 5]
    assert _max_diff(_load(out), reference) <= TOL
    # one shared orbax checkpoint at step 3, written by both processes (the run restored and compared it)
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [3]
