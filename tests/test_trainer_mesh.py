"""The trainer on a simulated 8-device CPU mesh ends where the single-device run ends."""

from __future__ import annotations

from pathlib import Path

import numpy as np

TINY = ["model.source=random", "run.updates=3", "run.eval_every=3", "run.checkpoint_every=3", "es.population=8",
        "schedule.slots=4", "env.eval_goals=4", "env.tasks_per_member=2", "env.num_products=100",
        "env.max_steps=5", "run.progress=false", "es.sigma=0.05", "es.learning_rate=0.05",
        "es.scale=nes"]  # the es section's default scale before it became the library's (llm)

SCRIPT = """
import sys, jax, numpy as np
from esjax.config import load_config
from esjax.trainer import train
result = train(load_config(None, sys.argv[3:]), run_dir=sys.argv[1])
leaves = jax.tree.leaves(result.params)
if len(jax.devices()) > 1 and result.params["embed"]["embedding"].sharding.mesh.shape["model"] > 1:
    spec = [str(x.sharding.spec) for x in leaves if x.ndim >= 2]
    assert any("model" in s for s in spec), spec  # θ stays sharded on the mesh
np.savez(sys.argv[2], *[np.asarray(x) for x in leaves])
"""


def _run(python_child, tmp_path: Path, name: str, devices: int, mesh: tuple[int, int]) -> list[np.ndarray]:
    out = tmp_path / f"{name}.npz"
    python_child(SCRIPT, tmp_path / name, out, *TINY, f"mesh.data={mesh[0]}", f"mesh.model={mesh[1]}",
                 devices=devices, timeout=900)
    data = np.load(out)
    return [data[k] for k in sorted(data.files, key=lambda s: int(s.split("_")[1]))]


def test_mesh_runs_match_single_device(tmp_path, python_child):
    single = _run(python_child, tmp_path, "single", 1, (1, 1))
    for mesh in ((2, 4), (8, 1)):
        sharded = _run(python_child, tmp_path, f"mesh{mesh[0]}x{mesh[1]}", 8, mesh)
        for a, b in zip(single, sharded):
            np.testing.assert_allclose(a, b, atol=1e-5)
