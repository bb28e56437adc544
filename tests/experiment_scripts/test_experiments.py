"""The staleness study end to end at tiny settings: grid (2 cells × 1 seed, 2 updates, random tiny policy),
resumability, sharding, report (table + figures with real numbers) and the wall-clock study."""

from __future__ import annotations

import re

import pytest
from run_settings import tiny_random

from experiments import report, staleness_grid, wallclock
from experiments.lib.grid import all_cells, select_cells

TINY = tiny_random(updates=2, eval_every=1, checkpoint_every=100, population=8, eval_goals=6, max_steps=6,
                   quiet=False)


def _grid_args(out, *extra):
    args = ["--quick", "--out", str(out), "--cells", "sync,async-K1", "--seeds", "1", *extra]
    for item in TINY:
        args += ["--set", item]
    return args


def test_cells_cover_the_grid():
    names = [c.name for c in all_cells()]
    assert len(names) == len(set(names))
    assert {"sync", "async-K1", "async-K2", "extreme-lag", "k8-p0.5", "k1-p0.1", "k2-p1"} <= set(names)
    assert {"async-G4", "delay4", "delay8", "all-stale-k1"} <= set(names)  # the paper's named cells
    assert len([c for c in all_cells()
                if c.family in ("controlled", "all_stale") and c.origin == "ours"]) == 16
    assert [c.name for c in select_cells("k4-*")] == ["k4-p0.1", "k4-p0.25", "k4-p0.5", "k4-p1"]
    runs = staleness_grid.plan(all_cells(), (0, 1, 2), (0, 1))
    shards = [staleness_grid.plan(all_cells(), (0, 1, 2), (i, 3)) for i in range(3)]
    assert sorted((c.name, s) for sh in shards for c, s in sh) == sorted((c.name, s) for c, s in runs)
    with pytest.raises(SystemExit):
        select_cells("nope")


def test_grid_report_and_wallclock(tmp_path, capsys):
    out, results = tmp_path / "runs", tmp_path / "results"
    assert staleness_grid.main(_grid_args(out)) == 0
    for cell in ("sync", "async-K1"):
        run_dir = out / "synthetic" / cell / "seed0"
        assert (run_dir / "summary.md").is_file() and (run_dir / "grid.json").is_file()
        # compacted for committing: records kept, traces gzipped, no checkpoints or plots
        assert (run_dir / "metrics.jsonl").is_file() and (run_dir / "config.yaml").is_file()
        assert not (run_dir / "checkpoints").exists() and not (run_dir / "plots").exists()
        traces = sorted(p.name for p in (run_dir / "traces").iterdir())
        assert traces and all(name.endswith(".jsonl.gz") for name in traces), traces
    capsys.readouterr()
    assert staleness_grid.main(_grid_args(out)) == 0  # finished cells are skipped
    assert "2 finished, 0 to run" in capsys.readouterr().out

    assert report.main(["--runs", str(out), "--out", str(results)]) == 0
    text = (results / "staleness.md").read_text()
    table = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    for cell in ("sync", "async-K1"):
        assert re.search(r"\| 0 \| -?\d+\.\d \|", rows[cell]), rows[cell]  # seed 0, a numeric final score
    final = text.split("### final score", 1)[1].split("###", 1)[0]
    # Δ vs sync is a number; one paired seed cannot decide anything
    assert re.search(r"\| async-K1 \| 1 \(0\) \| [+-]\d+\.\d\d \|.*\| inconclusive \|", final)
    assert "not run" in rows["delay4"] and "k4-p0.1" not in rows  # k4-p0.1 repeats delay4: listed only if run
    assert "The published findings, tested here" in text and "Natural async ≈ sync" in text
    assert "holds" not in text
    for name in ("staleness_curves.png", "staleness_heatmap.png", "staleness_wallclock.png"):
        assert (results / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name

    assert wallclock.main(["--runs", str(out), "--out", str(results), "--updates", "20", "--seeds", "1"]) == 0
    wall = (results / "wallclock.md").read_text()
    for g in (4, 16, 64):
        assert re.search(rf"\| 8 \| {g} \| async K=1 \| \d+ \| \d+ \| \d\.\d\d \| \d\.\d\d \| \d+\.\d\d×", wall), g
    assert "Real loop" in wall and "| sync | 1 |" in wall
    assert (results / "wallclock.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_jobs_runs_every_shard_once(tmp_path, capfd):
    """``--jobs 2`` starts the two shard processes itself; together they list every run exactly once."""
    args = ["--quick", "--out", str(tmp_path), "--cells", "sync,async-*", "--seeds", "2", "--list"]
    assert staleness_grid.main([*args, "--jobs", "2"]) == 0
    listed = sorted(line.split(None, 1)[1] for line in capfd.readouterr().out.splitlines() if line.startswith("todo"))
    expected = sorted(f"{c}  seed{s}" for c in ("sync", "async-G4", "async-K1", "async-K2") for s in (0, 1))
    assert listed == expected
    with pytest.raises(SystemExit):
        staleness_grid.main([*args, "--jobs", "2", "--shard", "0/2"])


def test_baselines_table_names_each_es_run_and_its_commit(tmp_path):
    """experiments/eval_real_webshop.py: reference rows and the shipped policy on real test goals, one row per ES
    run labelled with its directory and the commit in its run.json, the paired Δ line, and a header that says
    which command wrote the file (so a regenerated table needs no hand-written note)."""
    import json

    from experiments import eval_real_webshop

    runs = []
    for seed, (before, after) in enumerate([(60.0, 62.5), (60.0, 61.0)]):
        run = tmp_path / "async-K1" / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"git_commit": f"{seed}abcdef0123"}))
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"kind": "eval", "version": v, "score": s, "success_rate": 0.02, "goals": 3}) + "\n"
            for v, s in ((0, before), (2, after))))
        runs.append(str(run))
    md = tmp_path / "baselines.md"
    out = eval_real_webshop.main(["--goals", "3", "--runs", *runs, "--markdown", str(md)])
    text = md.read_text()
    assert text.startswith("# Baselines on WebShop's real held-out goals")
    assert "```bash\npython experiments/eval_real_webshop.py --goals 3 --runs" in text
    assert "| after ES: async-K1/seed0 @ 0abcdef (v2; before: 60.0) | 62.5 | 2.0% |" in text
    assert "async-K1/seed1 @ 1abcdef" in text
    assert out["es_delta"]["per_run"] == [2.5, 1.0] and "(2 of 2 runs improve)" in text
    names = [r["policy"] for r in out["rows"]]
    assert names[:5] == ["random clicking", "rule: first hit, buy",
                         "rule: first hit + options named in the instruction, buy",
                         "oracle (knows the target product)", "shipped policy (greedy)"]
    assert out["rows"][3]["score"] > out["rows"][0]["score"]  # the oracle beats random clicking on real goals


def _study_run(root, setting, seed, before, after, named=None):
    """A finished learning-study run directory as the study writes it (records only)."""
    import json

    run_dir = root / setting / f"seed{seed}"
    run_dir.mkdir(parents=True)
    evals = [{"kind": "eval", "version": v, "score": s, "success_rate": r}
             for v, s, r in ((0, before, 0.01), (30, after, 0.03))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    (run_dir / "run.json").write_text(json.dumps({"git_commit": "0123456789abcdef"}))
    behaviour = {"option_clicks_per_item_page": 0.5, "item_pages_with_option_click": 0.25,
                 "item_pages_per_episode": 1.0, "step_cap_hits": 0.0}
    if named is not None:
        behaviour["option_clicks_named_in_instruction"] = named
    (run_dir / "behaviour.json").write_text(json.dumps({"0": behaviour, "30": behaviour}))
    (run_dir / "study.json").write_text(json.dumps({"setting": setting, "seed": seed, "seconds": 300.0}))


def test_learning_study_report_reads_the_records_alone(tmp_path):
    from experiments import learning_study

    for seed, after in ((1000, 66.0), (1001, 68.0), (1002, 64.0)):
        _study_run(tmp_path, "norms", seed, 64.0, after, named=0.4)
    _study_run(tmp_path, "kernels-r1-s0.03", 1000, 64.0, 65.5)  # one seed, recorded before the named measure
    text = learning_study.report(tmp_path)
    norms = next(line for line in text.splitlines() if line.startswith("| norms |"))
    # deltas +2, +4, 0: mean +2, t interval 2 ± 4.303 · 2 / sqrt(3)
    assert "| 1000,1001,1002 | 64.0 → 66.0 | **+2.0** [-3.0, +7.0] | +2.0 +4.0 +0.0 |" in norms
    assert "| 5.0 | 0123456 |" in norms  # minutes per run, commit
    kernels = next(line for line in text.splitlines() if line.startswith("| kernels-r1-s0.03 |"))
    assert "(one seed)" in kernels
    rows = [line for line in text.splitlines() if line.startswith("| kernels-r1-s0.03 |")]
    assert "n/a" in rows[1] and "40% → 40%" in [line for line in text.splitlines() if line.startswith("| norms |")][1]


def test_every_learning_study_setting_loads_on_its_base_config():
    from esjax.config import load_config
    from experiments import learning_study

    for name, (_, overrides) in learning_study.SETTINGS.items():
        config = load_config(learning_study.base_of(name), [*overrides, *learning_study.common_of(name)])
        assert config.env.eval_split == "eval"  # settings are chosen on the eval split, never the test goals
        assert (config.agent.mode == "generate") == name.startswith("gen-"), name
        assert (config.env.task == "babyai") == name.startswith("babyai-"), name
