"""The learning study: which ES settings move the shipped policy on real WebShop, chosen on the eval split.

Each named setting is a list of config overrides on top of ``configs/hasty.yaml`` (issue 31's main job, pinned: the
settings were written against it, and configs/default.yaml may move to another policy); every (setting, seed) is one
trainer run, greedy-evaluated on WebShop's **eval** split (goals 500–1,499 after the seed-233 shuffle; the
first ``env.eval_goals`` of them) before and after training. The 500 test goals are never touched here: they
score only a setting a study freezes (into ``configs/default.yaml``, run with seeds 0–7).

Runs go in ``OUT/<setting>/seed<s>/``. A finished run keeps its records (``config.yaml``, ``run.json``,
``metrics.jsonl``, ``summary.md``, ``behaviour.json``: what the greedy agent did before and after, measured from
the evaluation traces, which are kept gzipped, and ``study.json``) and drops its checkpoints. A run directory
holding ``study.json`` is done and skipped; any other is run again from the start, so the study can be stopped and
continued::

    python -m experiments.learning_study --settings norms,norms-N32 --seeds 1000,1001,1002
    python -m experiments.learning_study --list
    python -m experiments.learning_study --report           # the tables of learning.md, from the records alone

Runs are ordered seed-major (every setting at the first seed, then at the next) so a study cut short still
compares every setting on the same seeds. All runs of one process share its compiled programs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from esjax.rundir.stats import mean_interval
from experiments.lib import REPO, RESULTS
from experiments.lib.records import compact_run

DEFAULT_OUT = RESULTS / "learning"
BASE = REPO / "configs" / "hasty.yaml"
#: Settings named ``gen-...`` tune generate mode (issue 36): overrides on top of this config instead.
GENERATE_BASE = REPO / "configs" / "generate.yaml"
#: Settings named ``babyai-...`` choose the BabyAI setting (issue 55, item 4): overrides on top of this config.
BABYAI_BASE = REPO / "configs" / "babyai.yaml"


def base_of(setting: str) -> Path:
    if setting.startswith("babyai-"):
        return BABYAI_BASE
    return GENERATE_BASE if setting.startswith("gen-") else BASE


#: Every run of the study: the eval split, no plots, no mid-run evaluation (before and after only).
COMMON = ["env.eval_split=eval", "run.plots=false", "run.progress=false", "run.traces=eval",
          "run.checkpoint_every=1000", "run.keep_checkpoints=1"]
#: WebShop's eval goals per evaluation (BabyAI keeps its config's ``env.eval_goals``).
WEBSHOP_EVAL = ["env.eval_goals=500"]


def common_of(setting: str) -> list[str]:
    return COMMON if setting.startswith("babyai-") else [*COMMON, *WEBSHOP_EVAL]

NORMS = ["es.scope=all", "es.include=['norm/scale$']", "es.exclude=[]"]
KERNELS = ["es.scope=matrices", "es.include=['/kernel$']", "es.exclude=[]"]
EVERY_MATRIX = ["es.scope=matrices", "es.include=[]", "es.exclude=[]"]

#: name -> (what it tests, overrides). ``updates`` defaults to configs/hasty.yaml's 30.
SETTINGS: dict[str, tuple[str, list[str]]] = {
    "norms": ("configs/default.yaml as shipped (norm scales, σ 0.2, lr 0.25, N 16, 16 goals, 30 updates)", NORMS),
    "norms-N32": ("N = 32 (16 antithetic pairs), 32 slots", [*NORMS, "es.population=32", "schedule.slots=32"]),
    "norms-goals32": ("32 train goals per member", [*NORMS, "env.tasks_per_member=32"]),
    "norms-lr0.5": ("learning rate 0.5", [*NORMS, "es.learning_rate=0.5"]),
    "norms-sigma0.1": ("σ 0.1", [*NORMS, "es.sigma=0.1"]),
    "norms-60u-sigma-cos": ("60 updates, σ cosine 0.2 → 0.05", [*NORMS, "run.updates=60", "es.sigma_final=0.05",
                                                                "es.sigma_schedule=cosine"]),
    "norms-60u": ("60 updates (σ and lr constant)", [*NORMS, "run.updates=60"]),
    "norms-T0.1": ("sampling temperature 0.1 in training rollouts (near the greedy evaluation)",
                   [*NORMS, "agent.temperature=0.1"]),
    "norms-adam": ("Adam (lr 0.02)", [*NORMS, "es.optimizer=adam", "es.learning_rate=0.02"]),
    "norms-zscore": ("z-score shaping instead of centered ranks", [*NORMS, "es.shaping=z_score"]),
    "norms-T1": ("sampling temperature 1.0 in training rollouts", [*NORMS, "agent.temperature=1.0"]),
    "kernels-r1-s0.01": ("every kernel, low-rank r = 1, σ 0.01, lr 0.002",
                         [*KERNELS, "es.rank=1", "es.sigma=0.01", "es.learning_rate=0.002"]),
    "kernels-r1-s0.03": ("every kernel, low-rank r = 1, σ 0.03, lr 0.003",
                         [*KERNELS, "es.rank=1", "es.sigma=0.03", "es.learning_rate=0.003"]),
    "kernels-r1-s0.05": ("every kernel, low-rank r = 1, σ 0.05, lr 0.005",
                         [*KERNELS, "es.rank=1", "es.sigma=0.05", "es.learning_rate=0.005"]),
    "kernels-r1-s0.03-lr0.006": ("every kernel, low-rank r = 1, σ 0.03, lr 0.006 (twice the step)",
                                 [*KERNELS, "es.rank=1", "es.sigma=0.03", "es.learning_rate=0.006"]),
    "kernels-r1-s0.05-lr0.01": ("every kernel, low-rank r = 1, σ 0.05, lr 0.01 (twice σ 0.05's step)",
                                [*KERNELS, "es.rank=1", "es.sigma=0.05", "es.learning_rate=0.01"]),
    "kernels-r1-s0.05-lr0.02": ("every kernel, r = 1, σ 0.05, lr 0.02 (twice the frozen step)",
                                [*KERNELS, "es.rank=1", "es.sigma=0.05", "es.learning_rate=0.02"]),
    "kernels-r1-s0.05-lr0.01-60u": ("every kernel, r = 1, σ 0.05, lr 0.01, 60 updates (the frozen step, twice as long)",
                                    [*KERNELS, "es.rank=1", "es.sigma=0.05", "es.learning_rate=0.01",
                                     "run.updates=60"]),
    "kernels-r1-s0.05-lr0.02-N32": ("every kernel, r = 1, σ 0.05, lr 0.02, N = 32 (16 antithetic pairs), 32 slots",
                                    [*KERNELS, "es.rank=1", "es.sigma=0.05", "es.learning_rate=0.02",
                                     "es.population=32", "schedule.slots=32"]),
    "kernels-r4-s0.03": ("every kernel, low-rank r = 4, σ 0.03, lr 0.003",
                         [*KERNELS, "es.rank=4", "es.sigma=0.03", "es.learning_rate=0.003"]),
    "attn-r1-s0.03": ("attention kernels only (q, k, v, o), r = 1, σ 0.03, lr 0.003",
                      ["es.scope=matrices", "es.include=['attn/.*/kernel$']", "es.exclude=[]", "es.rank=1",
                       "es.sigma=0.03", "es.learning_rate=0.003"]),
    "mlp-r1-s0.03": ("MLP kernels only (gate, up, down), r = 1, σ 0.03, lr 0.003",
                     ["es.scope=matrices", "es.include=['mlp/.*/kernel$']", "es.exclude=[]", "es.rank=1",
                      "es.sigma=0.03", "es.learning_rate=0.003"]),
    "qk-full-s0.02": ("query and key kernels, full-rank (dense) noise, σ 0.02, lr 0.002",
                      ["es.scope=matrices", "es.include=['attn/(q|k)_proj/kernel$']", "es.exclude=[]",
                       "es.mode=full", "es.sigma=0.02", "es.learning_rate=0.002"]),
    "kernels-r4-s0.01": ("every kernel, low-rank r = 4, σ 0.01, lr 0.002",
                         [*KERNELS, "es.rank=4", "es.sigma=0.01", "es.learning_rate=0.002"]),
    "kernels-r1-s0.003": ("every kernel, low-rank r = 1, σ 0.003, lr 0.0005",
                          [*KERNELS, "es.rank=1", "es.sigma=0.003", "es.learning_rate=0.0005"]),
    # Issue 54: weight-matrix ES from the strong policy (run with --policy experiments/results/learning-v2/policies/
    # strong --out experiments/results/past-teacher/study); "main" is configs/hasty.yaml's setting (every kernel,
    # rank 1, σ 0.05, lr 0.02, N 32, 16 goals per member, 30 updates, natural async K = 1, sampled rows T 0.5).
    "main": ("issue 31's main job, configs/hasty.yaml (kernels r 1, σ 0.05, lr 0.02, N 32, 16 goals, 30 updates)",
             []),
    "main-lr0.01": ("half the step: lr 0.01", ["es.learning_rate=0.01"]),
    "main-lr0.005": ("a quarter of the step: lr 0.005", ["es.learning_rate=0.005"]),
    "main-s0.02-lr0.004": ("small σ 0.02, lr 0.004 (lr / σ as lr 0.01 at σ 0.05)",
                           ["es.sigma=0.02", "es.learning_rate=0.004"]),
    "main-s0.01-lr0.002": ("smaller σ 0.01, lr 0.002", ["es.sigma=0.01", "es.learning_rate=0.002"]),
    "main-r4-lr0.01": ("rank 4 noise, lr 0.01", ["es.rank=4", "es.learning_rate=0.01"]),
    "main-N64-lr0.01": ("N 64 (32 antithetic pairs, 64 slots), lr 0.01",
                        ["es.population=64", "schedule.slots=64", "es.learning_rate=0.01"]),
    "main-goals32-lr0.01": ("32 goals per member (every member of a version on the same goals), lr 0.01",
                            ["env.tasks_per_member=32", "es.learning_rate=0.01"]),
    "main-goals64-lr0.01": ("64 goals per member, lr 0.01", ["env.tasks_per_member=64", "es.learning_rate=0.01"]),
    "main-noanti-lr0.01": ("no antithetic pairs (32 independent members), lr 0.01",
                           ["es.antithetic=false", "es.learning_rate=0.01"]),
    "main-sync-lr0.01": ("synchronous barrier, lr 0.01: every member of a cohort on its version's goals, so fitness "
                         "relative to θ's own reward there ranks the members alike (centered ranks)",
                         ["schedule.kind=sync", "es.learning_rate=0.01"]),
    "main-adam-lr0.001": ("Adam, lr 0.001", ["es.optimizer=adam", "es.learning_rate=0.001"]),
    "main-60u-lr0.01": ("60 updates at lr 0.01 (σ and lr constant)", ["run.updates=60", "es.learning_rate=0.01"]),
    "main-60u-decay": ("60 updates, lr cosine 0.01 → 0.001 and σ cosine 0.05 → 0.02",
                       ["run.updates=60", "es.learning_rate=0.01", "es.learning_rate_final=0.001",
                        "es.learning_rate_schedule=cosine", "es.sigma_final=0.02", "es.sigma_schedule=cosine"]),
    "main-zscore-lr0.01": ("z-score shaping instead of centered ranks, lr 0.01",
                           ["es.shaping=z_score", "es.learning_rate=0.01"]),
    # Issue 55, item 4: ES on BabyAI (configs/babyai.yaml: the embedded BabyAI policy, every kernel, r 1, σ 0.05,
    # lr 0.01, N 16, 4 train instances per member, 20 updates, natural async K = 1, 200 eval instances), run with
    # --out experiments/results/babyai/study.
    "babyai-base": ("configs/babyai.yaml as first written (N 16, 4 instances per member, lr 0.01, 20 updates)", []),
    "babyai-g16": ("16 instances per member", ["env.tasks_per_member=16"]),
    "babyai-g16-lr0.02": ("16 instances per member, lr 0.02", ["env.tasks_per_member=16", "es.learning_rate=0.02"]),
    "babyai-N32-g8": ("N 32 (32 slots), 8 instances per member",
                      ["es.population=32", "schedule.slots=32", "env.tasks_per_member=8"]),
    "babyai-g16-s0.02-lr0.004": ("16 instances per member, σ 0.02, lr 0.004",
                                 ["env.tasks_per_member=16", "es.sigma=0.02", "es.learning_rate=0.004"]),
    # The policy's kernels have entries of SD 0.05-0.10 (norm 18.8): σ 0.05 perturbs them by about their own size, and
    # lr / σ = 0.2 moves them by ~5 (a quarter of their norm) per update. Smaller steps, or the 320 norm scales:
    "babyai-norms-g8": ("norm scales only (320 parameters), σ 0.2, lr 0.25 (the first WebShop recipe), 8 instances",
                        [*NORMS, "es.sigma=0.2", "es.learning_rate=0.25", "env.tasks_per_member=8"]),
    "babyai-s0.01-adam-g8": ("every kernel, σ 0.01, Adam lr 0.001 (~0.3 per update), 8 instances",
                             ["es.sigma=0.01", "es.optimizer=adam", "es.learning_rate=0.001",
                              "env.tasks_per_member=8"]),
    "babyai-s0.01-lr0.0003-g8": ("every kernel, σ 0.01, lr 0.0003 (lr / σ 0.03: ~0.7 per update), 8 instances",
                                 ["es.sigma=0.01", "es.learning_rate=0.0003", "env.tasks_per_member=8"]),
    "babyai-norms-g8-lr0.1": ("norm scales only, σ 0.1, lr 0.1, 8 instances",
                              [*NORMS, "es.sigma=0.1", "es.learning_rate=0.1", "env.tasks_per_member=8"]),
    "babyai-N32-g8-T0.05": ("N 32, 8 instances, near-greedy training rollouts (T 0.05): fitness is what the greedy "
                            "evaluation scores, loops included", ["es.population=32", "schedule.slots=32",
                                                                  "env.tasks_per_member=8", "agent.temperature=0.05"]),
    "babyai-N32-g8-lr0.005": ("N 32, 8 instances, lr 0.005 (half the step)",
                              ["es.population=32", "schedule.slots=32", "env.tasks_per_member=8",
                               "es.learning_rate=0.005"]),
    "babyai-80u": ("N 16, 4 instances, 80 updates (four times as many steps of configs/babyai.yaml's size)",
                   ["run.updates=80"]),
    "babyai-80u-lr0.005": ("N 16, 4 instances, 80 updates at lr 0.005", ["run.updates=80", "es.learning_rate=0.005"]),
    # Generate mode (issue 36), on configs/generate.yaml (the provisional generative policy; σ 0.05 breaks it):
    "gen-base": ("configs/generate.yaml as shipped (σ 0.02, lr 0.0005, N 32 × 8 goals, temperature 0.3)", []),
    "gen-lr0.0003": ("lr 0.0003 (a third of the step: two probe-2 trials rose by v10 and fell by v20)",
                     ["es.learning_rate=0.0003"]),
    "gen-goals16": ("16 train goals per member (less noisy fitness)", ["env.tasks_per_member=16"]),
    "gen-s0.005": ("σ 0.005, lr 0.0005", ["es.sigma=0.005", "es.learning_rate=0.0005"]),
    "matrices-r1-s0.01": ("every weight matrix incl. the tied embedding, r = 1, σ 0.01, lr 0.002",
                          [*EVERY_MATRIX, "es.rank=1", "es.sigma=0.01", "es.learning_rate=0.002"]),
}


def run_dir_of(out: Path, setting: str, seed: int) -> Path:
    return out / setting / f"seed{seed}"


def is_finished(run_dir: Path) -> bool:
    """The study's own marker, written last (after the trainer's summary.md and the compacted records)."""
    return (run_dir / "study.json").is_file()


def run_task(run_dir: Path):
    """The task of a run directory (its saved ``config.yaml``'s ``env.task``)."""
    from esjax.config import load_config
    from esjax.task import task_class

    config = load_config(run_dir / "config.yaml")
    return task_class(config.env.task)(config.env)


def measure_behaviour(run_dir: Path) -> dict:
    """Behaviour before/after from the evaluation traces (plain or gzipped) into ``behaviour.json``: the run's task's
    measures (:meth:`esjax.task.Task.behaviour`)."""
    from esjax.rundir.traces import first_and_last_traces

    task = run_task(run_dir)
    out = {str(v): task.behaviour(lines) for v, lines in first_and_last_traces(run_dir / "traces").items()}
    (run_dir / "behaviour.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def finish_records(run_dir: Path) -> dict:
    """:func:`measure_behaviour`, then the run compacted (:func:`records.compact_run`: traces gzipped, checkpoints and
    plots dropped)."""
    out = measure_behaviour(run_dir)
    compact_run(run_dir)
    return out


def run_one(setting: str, seed: int, run_dir: Path, policy: Path | None = None) -> dict:
    from esjax.config import load_config
    from esjax.train.session import train

    overrides = [*SETTINGS[setting][1], *common_of(setting), f"run.seed={seed}", f"run.name={setting}-seed{seed}"]
    if policy is not None:  # a candidate starting policy (an HF folder) instead of the embedded one
        overrides += ["model.source=hf", f"model.path={policy}"]
    base = base_of(setting)
    config = load_config(base, overrides)
    overrides.append(f"run.eval_every={config.run.updates}")
    config = load_config(base, overrides)
    started = time.perf_counter()
    result = train(config, run_dir=run_dir, resume=False, overrides=overrides)
    seconds = time.perf_counter() - started
    finish_records(run_dir)
    evals = [r for r in result.records if r.get("kind") == "eval"]
    status = {"setting": setting, "task": config.env.task, "seed": seed, "seconds": seconds,
              "before": evals[0]["score"],
              "after": evals[-1]["score"], "overrides": overrides}
    (run_dir / "study.json").write_text(json.dumps(status, indent=1) + "\n")
    return status


#: WebShop's measures in the report (records written before study.json named its task are WebShop's); other tasks
#: report their own :attr:`esjax.task.Task.behaviour_rows`.
BEHAVIOUR_KEYS = (("option_clicks_per_item_page", "option clicks / item page", "{:.2f}"),
                  ("item_pages_with_option_click", "item pages with an option click", "{:.0%}"),
                  ("option_clicks_named_in_instruction", "option clicks the instruction names", "{:.0%}"),
                  ("item_pages_per_episode", "item pages / episode", "{:.2f}"),
                  ("step_cap_hits", "step-cap hits", "{:.1%}"))


def collect(out: Path) -> dict[str, list[dict]]:
    """Every finished run under ``out``, by setting: seed, scores, success, seconds, commit, behaviour."""
    from esjax.rundir.metrics import read_metrics

    found: dict[str, list[dict]] = {}
    for status_file in sorted(out.glob("*/seed*/study.json")):
        run_dir = status_file.parent
        status = json.loads(status_file.read_text())
        evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
        info = json.loads((run_dir / "run.json").read_text())
        behaviour = json.loads((run_dir / "behaviour.json").read_text())
        versions = sorted(behaviour, key=int)
        found.setdefault(status["setting"], []).append({
            "seed": status["seed"], "before": evals[0]["score"], "after": evals[-1]["score"],
            "success_before": evals[0]["success_rate"], "success_after": evals[-1]["success_rate"],
            "seconds": status["seconds"], "commit": (info.get("git_commit") or "?")[:7],
            "task": status.get("task", "webshop"),
            "behaviour": (behaviour[versions[0]], behaviour[versions[-1]])})
    return found


def behaviour_rows(tasks: list[str]) -> tuple[tuple[str, str, str], ...]:
    """The behaviour rows of the named tasks (each task's :attr:`esjax.task.Task.behaviour_rows`, in order)."""
    from esjax.task import task_class

    rows: dict[str, tuple[str, str, str]] = {}
    for name in tasks:
        rows.update({row[0]: row for row in task_class(name).behaviour_rows})
    return tuple(rows.values())


def report(out: Path) -> str:
    """learning.md's tables, regenerated from the run records under ``out`` alone."""
    found = collect(out)
    order = [name for name in SETTINGS if name in found] + sorted(set(found) - set(SETTINGS))
    lines = ["| setting | seeds | before → after (mean) | Δ mean [95% CI] | per seed Δ | success before → after | "
             "min / run | commit |", "|---|---|---|---|---|---|---|---|"]
    for name in order:
        runs = sorted(found[name], key=lambda r: r["seed"])
        deltas = np.array([r["after"] - r["before"] for r in runs])
        _, low, high = mean_interval(deltas.tolist())
        ci = f"[{low:+.1f}, {high:+.1f}]" if len(runs) >= 2 else "(one seed)"
        seeds = ",".join(str(r["seed"]) for r in runs)
        commits = ",".join(sorted({r["commit"] for r in runs}))
        lines.append(f"| {name} | {seeds} | {np.mean([r['before'] for r in runs]):.1f} → "
                     f"{np.mean([r['after'] for r in runs]):.1f} | **{deltas.mean():+.1f}** {ci} | "
                     f"{' '.join(f'{d:+.1f}' for d in deltas)} | "
                     f"{100 * np.mean([r['success_before'] for r in runs]):.1f}% → "
                     f"{100 * np.mean([r['success_after'] for r in runs]):.1f}% | "
                     f"{np.mean([r['seconds'] for r in runs]) / 60:.1f} | {commits} |")
    tasks = sorted({r["task"] for runs in found.values() for r in runs})
    rows = BEHAVIOUR_KEYS if tasks in ([], ["webshop"]) else behaviour_rows(tasks)
    lines += ["", "What the greedy agent did before → after (means over the setting's seeds, from the evaluation "
                  f"traces; the {' and '.join(tasks) or 'webshop'} task's measures):", "",
              "| setting | " + " | ".join(label for _, label, _ in rows) + " |",
              "|---|" + "---|" * len(rows)]
    for name in order:
        runs = found[name]
        cells = []
        for key, _, fmt in rows:
            if not all(key in r["behaviour"][0] for r in runs):  # runs recorded before the measure existed
                cells.append("n/a")
                continue
            before = np.mean([r["behaviour"][0][key] for r in runs])
            after = np.mean([r["behaviour"][1][key] for r in runs])
            cells.append(f"{fmt.format(before)} → {fmt.format(after)}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated setting names")
    parser.add_argument("--seeds", default="1000,1001,1002", help="comma-separated seeds (>= 1000: never the "
                                                                 "Done-means seeds 0-7)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--policy", type=Path, help="start from this HF policy folder instead of the embedded one")
    parser.add_argument("--list", action="store_true", help="print the runs and their state, then exit")
    parser.add_argument("--report", action="store_true", help="print the tables of every finished run under --out")
    parser.add_argument("--remeasure", action="store_true", help="measure every finished run's behaviour.json again "
                                                                 "from its committed traces (after a measure changed)")
    args = parser.parse_args(argv)
    if args.remeasure:
        for status_file in sorted(args.out.glob("*/seed*/study.json")):
            measure_behaviour(status_file.parent)
    if args.report or args.remeasure:
        print(report(args.out), end="")
        return 0
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        raise SystemExit(f"--settings: unknown {', '.join(unknown)} (known: {', '.join(SETTINGS)})")
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [(name, seed) for seed in seeds for name in names]
    if args.list:
        for name, seed in runs:
            print(f"{'done' if is_finished(run_dir_of(args.out, name, seed)) else 'todo'}  {name}  seed{seed}")
        return 0
    todo = [(n, s) for n, s in runs if not is_finished(run_dir_of(args.out, n, s))]
    print(f"learning study: {len(runs)} runs, {len(todo)} to run", flush=True)
    for i, (name, seed) in enumerate(todo, 1):
        run_dir = run_dir_of(args.out, name, seed)
        if run_dir.exists():  # an interrupted run starts over (its records would be partial)
            shutil.rmtree(run_dir)
        try:
            status = run_one(name, seed, run_dir, args.policy)
        except Exception as err:  # one broken run must not stop the study: record it and go on
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "failed.json").write_text(json.dumps({"setting": name, "seed": seed, "error": repr(err)}) + "\n")
            print(f"[{i}/{len(todo)}] {name} seed{seed}: FAILED {err!r}", flush=True)
            continue
        print(f"[{i}/{len(todo)}] {name} seed{seed}: {status['before']:.1f} -> {status['after']:.1f} "
              f"({status['after'] - status['before']:+.1f}) in {status['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
