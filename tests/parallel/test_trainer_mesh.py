"""The trainer on a simulated 8-device CPU mesh ends where the single-device run ends."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from conftest import theta_moved
from run_settings import tiny_random

TINY = tiny_random(updates=3, eval_every=3, checkpoint_every=3, population=8, eval_goals=4, max_steps=5)
MESHES = ((2, 4), (8, 1))

# Both meshes in one child process of 8 simulated devices (one interpreter, shop and policy for both runs).
SCRIPT = """
import sys, jax, numpy as np
from esjax.config import load_config
from esjax.train.session import train
assert len(jax.devices()) == 8
out, base = sys.argv[1], sys.argv[2:]
for data, model in MESHES:
    name = f"{out}/mesh{data}x{model}"
    result = train(load_config(None, [*base, f"mesh.data={data}", f"mesh.model={model}"]), run_dir=name)
    leaves = jax.tree.leaves(result.params)
    if model > 1:
        spec = [str(x.sharding.spec) for x in leaves if x.ndim >= 2]
        assert any("model" in s for s in spec), spec  # θ stays sharded on the mesh
    np.savez(name + ".npz", *[np.asarray(x) for x in leaves])
""".replace("MESHES", repr(MESHES))


def _leaves(path: Path) -> list[np.ndarray]:
    data = np.load(path)
    return [data[k] for k in sorted(data.files, key=lambda s: int(s.split("_")[1]))]


def test_mesh_runs_match_single_device(tmp_path, python_child):
    from esjax.config import load_config
    from esjax.train.session import train

    assert len(jax.devices()) == 1  # this process: the single-device run
    result = train(load_config(None, [*TINY, "mesh.data=1", "mesh.model=1"]), run_dir=tmp_path / "single")
    assert theta_moved(result.records)
    single = [np.asarray(x) for x in jax.tree.leaves(result.params)]
    python_child(SCRIPT, tmp_path, *TINY, devices=8, timeout=900)
    for data, model in MESHES:
        sharded = _leaves(tmp_path / f"mesh{data}x{model}.npz")
        assert len(sharded) == len(single)
        for a, b in zip(single, sharded):
            np.testing.assert_allclose(a, b, atol=1e-5)
