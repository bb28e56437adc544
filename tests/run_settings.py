"""Run settings the training tests share: ``--set`` lists for small runs, reading a run's records, and a run killed
after a checkpoint (for resume tests)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

#: No live progress display and no plots (tests read the records).
QUIET = ["run.progress=false", "run.plots=false"]

#: A minimal random-weights run: a 30-product synthetic shop, 4 members of one episode each, 2 evaluation goals.
SMALL_RANDOM = ["model.source=random", "env.num_products=30", "es.population=4", "schedule.slots=4",
                "env.tasks_per_member=1", "env.eval_goals=2", *QUIET]


def tiny_random(*, updates: int, eval_every: int, checkpoint_every: int, population: int, eval_goals: int,
                max_steps: int, quiet: bool = True) -> list[str]:
    """A tiny random-weights model on a 100-product synthetic shop: 4 slots, 2 episodes per member, σ = lr = 0.05 on
    the NES scale (the es section's default scale before it became the library's, llm)."""
    return ["model.source=random", f"run.updates={updates}", f"run.eval_every={eval_every}",
            f"run.checkpoint_every={checkpoint_every}", f"es.population={population}", "schedule.slots=4",
            f"env.eval_goals={eval_goals}", "env.tasks_per_member=2", "env.num_products=100",
            f"env.max_steps={max_steps}", *(QUIET if quiet else []), "es.sigma=0.05", "es.learning_rate=0.05",
            "es.scale=nes"]


def embedded(**changes: Any) -> list[str]:
    """The shipped (embedded) policy on the packaged real WebShop set: rank-2 noise on its matrices and norm scales
    (σ 0.2, lr 0.25, NES scale), compact prompts sampled at temperature 0.5, a checkpoint at every version.
    ``changes``: keys with ``.`` written as ``__`` (``run__updates=5``)."""
    settings: dict[str, Any] = {
        "model.source": "embedded", "run.updates": 3, "run.eval_every": 10, "run.checkpoint_every": 1,
        "es.population": 4, "es.rank": 2, "es.sigma": 0.2, "es.learning_rate": 0.25, "es.scale": "nes",
        "es.scope": "all", "es.include": "['norm/scale$']", "schedule.slots": 4, "env.eval_goals": 2,
        "env.tasks_per_member": 2, "env.data": "webshop_small", "env.max_steps": 10, "agent.prompt_style": "compact",
        "agent.temperature": 0.5, "run.progress": "false", "run.plots": "false"}
    settings.update({key.replace("__", "."): value for key, value in changes.items()})
    return [f"{key}={value}" for key, value in settings.items()]


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of a run directory's metrics.jsonl, in file order."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def es_config_of(config: Any):
    """The ES update's config a run of ``config`` uses (its es section, seed and length)."""
    from esjax.train.parts import build_es_config

    return build_es_config(config.es, config.run.seed, config.run.updates)


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of a run's checkpoints, oldest first."""
    return sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


def killed_after(source: Path, step: int, run_dir: Path) -> Path:
    """A copy of the run directory ``source`` as a run killed right after its checkpoint ``step`` left it: later
    checkpoints gone, and the traces of evaluations not finished at ``step`` (the resumed run writes them again)."""
    from esjax.rundir.checkpoint import read_loop_state

    shutil.copytree(source, run_dir)
    for later in checkpoint_steps(run_dir):
        if later > step:
            shutil.rmtree(run_dir / "checkpoints" / str(later))
    loop = read_loop_state(run_dir, step)
    finished = set(loop["evaluated_versions"]) - {ev["version"] for ev in loop["evals"]}
    for path in (run_dir / "traces").iterdir():
        if int(path.stem.removeprefix("eval-v")) not in finished:
            path.unlink()
    return run_dir


def resumes_are_bit_identical(reference, records, tmp_path, steps: list[int] | None = None) -> None:
    """The finished run ``reference``, killed after each of its checkpoints but the last (or after each of
    ``steps``) and resumed, ends with the same θ, the same records (``records``: the reference's, untimed) and the
    same trace files."""
    from conftest import same_bits

    from esjax.config import load_config
    from esjax.rundir.metrics import untimed
    from esjax.train.session import train

    for step in checkpoint_steps(reference.run_dir)[:-1] if steps is None else steps:
        run_dir = killed_after(reference.run_dir, step, tmp_path / f"from-{step}")
        resumed = train(load_config(run_dir / "config.yaml"), run_dir=run_dir, resume=True)
        assert same_bits(resumed.params, reference.params)
        assert untimed(read_records(run_dir)) == records, f"records differ after resuming from {step}"
        for path in sorted((reference.run_dir / "traces").iterdir()):
            assert (run_dir / "traces" / path.name).read_bytes() == path.read_bytes(), (step, path.name)
