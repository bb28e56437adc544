"""Statistics and cell definitions of the staleness study (esjax.rundir.stats, experiments/lib/runs.py,
experiments/lib/grid.py, experiments/report.py): paired TOST verdicts, Holm, the power / seed-count computation, the
report end to end on fake run directories, and the paper's named cells and the real-WebShop preset. No training:
everything here runs in seconds."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import yaml

from esjax.loop.staleness import stale_count
from esjax.rundir.stats import (
    fieller_ratio,
    holm,
    mean_interval,
    paired_test,
    seeds_needed,
    seeds_normal,
    tost_power,
    verdict,
)
from experiments import report, staleness_grid
from experiments.lib.grid import DATASETS, PRESETS, all_cells, paper_cells, select_cells
from experiments.lib.published import PUBLISHED_LABEL
from experiments.lib.runs import compare_with_sync, paired_delta, scan_grid

# ---------------------------------------------------------------------------------------------------------
# TOST, Holm, verdicts
# ---------------------------------------------------------------------------------------------------------


def _grid(deltas: dict[str, list[float]], base: list[float] | None = None) -> dict[str, list[dict]]:
    """Minimal runs (seed, final, auc) for compare_with_sync: sync at ``base``, each cell at base + Δ."""
    n = max(len(d) for d in deltas.values())
    base = base or [50.0 + 3 * i for i in range(n)]
    grid = {"sync": [{"seed": i, "final": b, "auc": b} for i, b in enumerate(base)]}
    for name, d in deltas.items():
        grid[name] = [{"seed": i, "final": base[i] + x, "auc": base[i] + x / 2} for i, x in enumerate(d)]
    return grid


def test_paired_test_values_by_hand():
    t = paired_test([1.0, 2.0, 3.0, 4.0], margin=3.0)
    # mean 2.5, SD sqrt(5/3) = 1.2910, SE 0.6455, t(0.95, 3) = 2.3534, t(0.975, 3) = 3.1824
    assert t["n"] == 4 and t["mean"] == pytest.approx(2.5) and t["sd"] == pytest.approx(1.290994, abs=1e-6)
    assert t["low90"] == pytest.approx(2.5 - 2.353363 * 0.645497, abs=1e-5)
    assert t["high95"] == pytest.approx(2.5 + 3.182446 * 0.645497, abs=1e-5)
    # scipy's one-sample t tests as the reference: Δ = 0 two-sided, Δ > −3, Δ < +3
    assert t["p_diff"] == pytest.approx(0.0304663, abs=1e-6)  # t = 3.873 on 3 df
    assert t["p_lower"] == pytest.approx(0.0016979, abs=1e-6)  # t = (2.5 + 3) / 0.6455 = 8.52
    assert t["p_upper"] == pytest.approx(0.2475127, abs=1e-6)  # t = (2.5 − 3) / 0.6455 = −0.775
    assert t["p_tost"] == t["p_upper"]
    from scipy import stats

    x = [1.0, 2.0, 3.0, 4.0]
    assert t["p_diff"] == pytest.approx(stats.ttest_1samp(x, 0.0).pvalue)
    assert t["p_lower"] == pytest.approx(stats.ttest_1samp(x, -3.0, alternative="greater").pvalue)
    assert t["p_upper"] == pytest.approx(stats.ttest_1samp(x, 3.0, alternative="less").pvalue)


def test_fieller_ratio_by_hand():
    """ρ = mean(num) / mean(den) with Fieller's 95% interval, on num = (1, 2, 3), den = (2, 3, 4): ā = 2, b̄ = 3,
    s_aa = s_ab = s_bb = 1, n = 3, t(0.975, 2) = 4.302653, t²/n = 6.170940; A = 9 − 6.170940 = 2.829060,
    B = 6 − 6.170940 = −0.170940, C = 4 − 6.170940 = −2.170940, √(B² − AC) = √6.170892 = 2.484129, so
    ρ ∈ [(B − 2.484129) / A, (B + 2.484129) / A] = [−0.938502, 0.817656] around 2/3."""
    ratio, low, high = fieller_ratio([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    assert ratio == pytest.approx(2 / 3)
    assert low == pytest.approx(-0.938502, abs=1e-6) and high == pytest.approx(0.817656, abs=1e-6)
    # The interval inverts the t test: at each bound, the t interval of numᵢ − ρ·denᵢ just touches 0 (from above
    # at the low bound, where the differences' mean is positive; from below at the high one).
    num, den = [10.1, 8.7, 9.9, 11.2, 7.8, 9.4], [9.0, 9.5, 8.1, 10.4, 8.8, 9.9]
    ratio, low, high = fieller_ratio(num, den)
    assert low < ratio < high
    assert mean_interval([a - low * b for a, b in zip(num, den)])[1] == pytest.approx(0.0, abs=1e-9)
    assert mean_interval([a - high * b for a, b in zip(num, den)])[2] == pytest.approx(0.0, abs=1e-9)


def test_fieller_ratio_with_a_constant_denominator_is_the_t_interval_scaled():
    """With no spread in den, Fieller's interval is the t interval of mean(num) divided by den: what the study
    report gave before it carried sync's gain's uncertainty."""
    _, low, high = fieller_ratio([1.0, 3.0, 1.0, 3.0], [2.0] * 4)
    _, t_low, t_high = mean_interval([1.0, 3.0, 1.0, 3.0])
    assert (low, high) == pytest.approx((t_low / 2, t_high / 2))


def test_fieller_ratio_is_unbounded_when_the_denominator_could_be_zero():
    ratio, low, high = fieller_ratio([1.0, 2.0, 1.5], [1.0, -1.0, 0.5])
    assert ratio == pytest.approx(4.5 / 0.5) and math.isnan(low) and math.isnan(high)
    assert all(math.isnan(v) for v in fieller_ratio([], []))
    assert math.isnan(fieller_ratio([1.0], [2.0])[1])
    with pytest.raises(ValueError):
        fieller_ratio([1.0, 2.0], [1.0])


def test_paired_delta_pairs_by_seed_not_by_position():
    """Runs come back in directory order and some seeds fail: Δ pairs each cell run with sync's run of the
    *same seed* (a zip by position would pair 3 with 1 below) and skips seeds one side lacks."""
    sync = [{"seed": s, "final": 10.0 * s} for s in (3, 1, 2, 5)]  # seed 4 missing in sync
    cell = [{"seed": s, "final": 10.0 * s + s} for s in (1, 4, 2, 3)]  # seed 5 missing in the cell
    d = paired_delta(cell, sync)
    assert d["seeds"] == [1, 2, 3] and d["diffs"] == [1.0, 2.0, 3.0]
    assert d["mean"] == pytest.approx(2.0)


def test_paired_test_with_zero_sd_is_decided_exactly():
    """A constant Δ has SE 0: the t statistics are undefined, the verdicts are not."""
    zero = paired_test([0.0, 0.0, 0.0], margin=1.5)
    assert (zero["sd"], zero["p_diff"], zero["p_lower"], zero["p_upper"], zero["p_tost"]) == (0.0, 1.0, 0.0, 0.0, 0.0)
    inside = paired_test([1.0, 1.0, 1.0], margin=1.5)  # different from 0, equivalent within ±1.5
    assert (inside["p_diff"], inside["p_lower"], inside["p_upper"], inside["p_tost"]) == (0.0, 0.0, 0.0, 0.0)
    above = paired_test([2.0, 2.0], margin=1.5)  # outside the margin: not equivalent
    assert (above["p_diff"], above["p_lower"], above["p_upper"], above["p_tost"]) == (0.0, 0.0, 1.0, 1.0)
    below = paired_test([-2.0, -2.0], margin=1.5)
    assert (below["p_lower"], below["p_upper"], below["p_tost"]) == (1.0, 0.0, 1.0)


def test_tost_p_below_alpha_iff_90ci_inside_margin():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 12))
        diffs = rng.normal(rng.uniform(-4, 4), rng.uniform(0.1, 5), n)
        t = paired_test(diffs.tolist(), margin=3.0, alpha=0.05)
        inside = t["low90"] > -3.0 and t["high90"] < 3.0
        assert (t["p_tost"] < 0.05) == inside


def test_verdicts_on_synthetic_paired_data():
    deltas = {
        "async-G4": [0.3, -0.2, 0.1, -0.1, 0.2, -0.3],  # tight around 0: equivalent
        "delay8": [-10.2, -9.8, -10.1, -9.9, -10.0, -10.3],  # clearly worse
        "delay4": [9.7, 10.2, 10.0, 9.9, 10.1, 10.4],  # clearly better
        "all-stale-k1": [8.0, -9.0, 7.0, -6.0, 10.0, -8.0],  # noisy: inconclusive, though its CI contains 0
        "async-K1": [0.1],  # one pair: inconclusive, not testable
    }
    tests = compare_with_sync(_grid(deltas), "final", margin=3.0)
    assert {n: t["verdict"] for n, t in tests.items()} == {
        "async-G4": "equivalent within m", "delay8": "worse", "delay4": "better",
        "all-stale-k1": "inconclusive", "async-K1": "inconclusive"}
    assert all(t["family"] == 4 for t in tests.values())  # the one-pair cell is no test
    assert math.isnan(tests["async-K1"]["p_diff_holm"]) and tests["async-K1"]["n"] == 1
    noisy = tests["all-stale-k1"]
    assert noisy["low95"] < 0 < noisy["high95"]  # a CI containing 0 ...
    assert noisy["p_tost_holm"] > 0.05  # ... is not equivalence
    # AUC: the fake curves move half as much; ±5 is still better / worse, ±0.15 still equivalent
    auc = compare_with_sync(_grid(deltas), "auc", margin=3.0)
    assert [auc[n]["verdict"] for n in ("async-G4", "delay8", "delay4")] == ["equivalent within m", "worse", "better"]
    assert auc["delay8"]["mean"] == pytest.approx(-5.025)


def test_equivalence_takes_precedence_over_a_tiny_detected_difference():
    # Δ ≈ −1 measured precisely: different from 0, but its whole 90% interval is inside ±3.
    tests = compare_with_sync(_grid({"delay4": [-1.0, -1.1, -0.9, -1.05, -0.95, -1.0]}), "final", 3.0)
    t = tests["delay4"]
    assert t["p_diff_holm"] < 0.05 and t["p_tost_holm"] < 0.05
    assert t["verdict"] == "equivalent within m"
    assert "detectably different from 0" in report._verdict_text(t, 3.0)
    # with a margin below |Δ| the same data are "worse"
    assert compare_with_sync(_grid({"delay4": [-1.0, -1.1, -0.9, -1.05, -0.95, -1.0]}), "final",
                                    0.5)["delay4"]["verdict"] == "worse"


def test_holm_against_hand_computation():
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> max(0.06, 0.04) = 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1 (0.5·2), monotone
    out = holm([0.01, float("nan"), 0.04])  # NaN: no test, not in the family (m = 2)
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert verdict(-2.0, 0.01, 0.2) == "worse" and verdict(2.0, 0.01, 0.2) == "better"
    assert verdict(2.0, 0.2, 0.2) == "inconclusive" and verdict(0.0, 0.9, 0.01) == "equivalent within m"


# ---------------------------------------------------------------------------------------------------------
# Power
# ---------------------------------------------------------------------------------------------------------


def test_seed_counts_match_the_reference_formula():
    # REFERENCES.md: α = 0.05, power 0.8, σ ≈ 6, m = 3 -> n ≈ (1.645 + 1.282)²·36/9 = 34.3
    assert seeds_normal(6.0, 3.0) == pytest.approx(34.255, abs=0.01)
    assert round(seeds_normal(6.0, 3.0)) == 34
    assert seeds_normal(3.0, 3.0) == pytest.approx(34.255 / 4, abs=0.01)  # halving σ cuts n by four
    # the exact t computation asks for a little more than the normal formula
    assert seeds_needed(6.0, 3.0) == 36
    assert tost_power(35, 6.0, 3.0) < 0.8 <= tost_power(36, 6.0, 3.0)
    assert seeds_needed(6.0, 3.0, alpha=0.05 / 4) > 36
    assert seeds_needed(0.0, 3.0) == 2 and seeds_needed(math.nan, 3.0) is None


@pytest.mark.parametrize("n", [3, 10, 36])
def test_tost_power_matches_simulation(n):
    rng = np.random.default_rng(n)
    from scipy import stats

    x = rng.normal(0.0, 6.0, (40_000, n))
    mean, se = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
    q = stats.t.ppf(0.95, n - 1)
    simulated = np.mean((mean - q * se > -3) & (mean + q * se < 3))
    assert tost_power(n, 6.0, 3.0) == pytest.approx(simulated, abs=0.01)


def test_power_rows_per_cell_and_overall():
    deltas = {"async-G4": [6.0, -6.0, 6.0, -6.0], "delay4": [3.0, -3.0, 3.0, -3.0]}
    tests = compare_with_sync(_grid(deltas), "final", 3.0)
    rows = {r["cell"]: r for r in report.power_rows(tests, 3.0)}
    assert rows["async-G4"]["sd"] == pytest.approx(math.sqrt(48.0))  # SD of ±6 over 4 seeds
    assert rows["async-G4"]["power_now"] == pytest.approx(tost_power(4, math.sqrt(48.0), 3.0))
    assert rows["async-G4"]["needed"] == seeds_needed(math.sqrt(48.0), 3.0)
    assert rows["async-G4"]["needed_holm"] == seeds_needed(math.sqrt(48.0), 3.0, alpha=0.025)
    overall = rows["overall (pooled SD)"]
    assert overall["sd"] == pytest.approx(math.sqrt((48.0 + 12.0) / 2)) and overall["df"] == 6
    assert overall["sd_upper"] > overall["sd"] and overall["needed_upper"] > overall["needed_holm"]


# ---------------------------------------------------------------------------------------------------------
# The report end to end on fake run directories
# ---------------------------------------------------------------------------------------------------------

SEEDS = range(6)
SYNC_FINAL = [55.0, 60.0, 52.0, 58.0, 61.0, 54.0]


def _write_run(run_dir, cell, seed, delta, *, updates=4, slots=16, versions=None, stale=(16, 0)):
    """A finished run as the trainer writes it: config.yaml, metrics.jsonl (eval at 0, 2, 4; one record per
    update), summary.md. Scores: initial 50 + seed, final sync's + Δ."""
    run_dir.mkdir(parents=True)
    config = {"run": {"seed": seed, "updates": updates, "eval_every": 2},
              "model": {"source": "random"}, "es": {"population": 16, "sigma": 0.2},
              "schedule": {"slots": slots}, "env": {"data": "webshop_small", "max_steps": 15, "eval_goals": 200}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    init, final = 50.0 + seed, SYNC_FINAL[seed] + delta
    mid = (init + final) / 2
    records = [{"kind": "eval", "version": v, "score": s, "success_rate": s / 200, "wall_time": float(v), "goals": 200}
               for v, s in ((0, init), (2, mid), (4, final))]
    for i, v in enumerate(versions or range(1, updates + 1)):
        records.append({"kind": "update", "version": v, "lag_hist": {"0": stale[0], "1": stale[1]},
                        "tick": 10 * (i + 1), "wall_time": float(v), "seconds": 1.0, "slot_utilization": 0.5,
                        "discarded": 0, "accepted": 16 * (i + 1), "durations": [1.0]})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (run_dir / "summary.md").write_text("# run\n")


@pytest.fixture()
def fake_runs(tmp_path):
    root = tmp_path / "runs"
    data = root / "webshop_small"
    cells = {"sync": [0.0] * 6,
             "async-G4": [0.3, -0.2, 0.1, -0.1, 0.2, -0.3],
             "delay8": [-10.2, -9.8, -10.1, -9.9, -10.0, -10.3],
             "delay4": [9.7, 10.2, 10.0, 9.9, 10.1, 10.4],
             "all-stale-k1": [8.0, -9.0, 7.0, -6.0, 10.0, -8.0]}
    for cell, deltas in cells.items():
        for seed in SEEDS:
            stale = (13, 3) if cell == "async-G4" else (16, 0)
            _write_run(data / cell / f"seed{seed}", cell, seed, deltas[seed], slots=4 if cell == "async-G4" else 16,
                       stale=stale)
    _write_run(data / "async-K1" / "seed0", "async-K1", 0, 0.5, stale=(6, 10))  # seeds 1..5 missing
    (data / "async-K1" / "seed1").mkdir()  # started, never finished
    (data / "async-K1" / "seed1" / "config.yaml").write_text("run: {seed: 1}\n")
    (data / "async-K2" / "seed0").mkdir(parents=True)
    (data / "async-K2" / "seed0" / "failed.json").write_text(json.dumps({"cell": "async-K2", "seed": 0,
                                                                         "error": "RuntimeError('boom')"}))
    # the cascade bug: version 4 written twice for a 4-update run, no update record for version 3
    _write_run(data / "extreme-lag" / "seed0", "extreme-lag", 0, -1.0, versions=[1, 2, 4, 4])
    return root


def test_scan_lists_failed_unfinished_excluded_and_missing(fake_runs):
    scan = scan_grid(fake_runs, "webshop_small")
    assert sorted(scan.grid) == ["all-stale-k1", "async-G4", "async-K1", "delay4", "delay8", "sync"]
    assert scan.expected_seeds == [0, 1, 2, 3, 4, 5]
    assert scan.failed == [("async-K2", 0, "RuntimeError('boom')")]
    assert scan.unfinished == [("async-K1", 1)]
    assert scan.excluded[0][:2] == ("extreme-lag", 0)
    assert any("repeat version(s) 4" in p for p in scan.excluded[0][2])
    assert scan.missing() == {"async-K1": [1, 2, 3, 4, 5], "async-K2": [0, 1, 2, 3, 4, 5],
                              "extreme-lag": [0, 1, 2, 3, 4, 5]}
    assert "k4-p0.5" in scan.not_run() and "sync" not in scan.not_run()
    g4 = scan.grid["async-G4"][0]
    assert g4["stale_fraction"] == pytest.approx(3 / 16) and g4["auc"] == pytest.approx((50 + 2 * 52.65 + 55.3) / 4)


def test_report_end_to_end(fake_runs, tmp_path, capsys):
    out = tmp_path / "results"
    assert report.main(["--runs", str(fake_runs), "--out", str(out), "--data", "webshop_small", "--margin", "3"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"async-G4\s+equivalent within ±3\s+Δ\s+\+0\.00", printed)
    assert re.search(r"delay8\s+worse\s+Δ -10\.05", printed) and re.search(r"delay4\s+better\s+Δ \+10\.05", printed)
    text = (out / "staleness.md").read_text()
    assert "holds" not in text and "contains 0 is not evidence" in text
    assert "CI contains 0" not in text and "(the CI contains 0)" not in text

    def section(title):
        part = text.split(f"## {title}", 1)[1]
        return part.split("\n## ", 1)[0]

    def rows(block):
        return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
                for line in block.splitlines() if line.startswith("| ") and not line.startswith("| cell")}

    results = rows(section("Results"))
    assert results["async-G4"][1] == "paper" and "G = 4 for N = 16" in results["async-G4"][2]
    assert "paper-like" in results["async-G4"][2] and "saturated" in results["async-K1"][2]
    assert "2 of 16 members exactly 8 updates late (paper: 3 of 30)" in results["delay8"][2]
    assert results["async-G4"][7] == "0.188" and results["async-K1"][7] == "0.625"  # stale shares
    assert results["async-G4"][3] == "0,1,2,3,4,5" and results["async-K1"][3] == "0"
    assert results["k1-p0.1"][4] == "not run" and results["k2-p1"][1] == "ours"
    assert "k4-p0.1" not in results  # the repeat of delay4 is not listed when not run

    left = section("Runs left out, missing seeds")
    assert "async-K2 seed 0: `RuntimeError('boom')`" in left and "async-K1 seed 1" in left
    assert "extreme-lag seed 0: update records repeat version(s) 4" in left
    assert "async-K1: 1,2,3,4,5" in left and "Cells not run:" in left

    comparison = section("Comparison with sync")
    final = rows(comparison.split("### final score", 1)[1].split("###", 1)[0])
    auc = rows(comparison.split("### AUC", 1)[1])
    assert final["async-G4"][-1] == "equivalent within ±3" and final["delay8"][-1] == "worse"
    assert final["delay4"][-1] == "better" and final["all-stale-k1"][-1] == "inconclusive"
    assert final["async-K1"][-1] == "inconclusive" and final["async-K1"][1] == "1 (0)"
    assert final["delay8"][2] == "-10.05"
    assert final["delay8"][3] == f"{np.std([-10.2, -9.8, -10.1, -9.9, -10, -10.3], ddof=1):.2f}"
    assert float(auc["delay8"][2]) == pytest.approx(-5.025, abs=0.006) and auc["async-G4"][-1] == "equivalent within ±3"

    power = section("Power")
    prow = rows(power.split("### final score", 1)[1].split("###", 1)[0])
    sd = float(np.std([8.0, -9.0, 7.0, -6.0, 10.0, -8.0], ddof=1))
    assert prow["all-stale-k1"][1] == f"{sd:.2f}" and prow["all-stale-k1"][2] == "6"
    assert prow["all-stale-k1"][4] == str(seeds_needed(sd, 3.0))
    assert prow["all-stale-k1"][5] == f"{seeds_normal(sd, 3.0):.1f}"
    assert prow["all-stale-k1"][6] == str(seeds_needed(sd, 3.0, alpha=0.05 / 4))
    assert "overall (pooled SD)" in prow and prow["async-K1"][1] == "—"

    published = section("Published numbers")
    assert PUBLISHED_LABEL in published
    assert re.search(r"\| delay-8 \(27 fresh \+ 3 delayed by exactly 8\) \| 22\.3 \| -3\.1 \| delay8 \|", published)
    findings = section("The published findings, tested here")
    assert "async-G4" in findings and "measured stale share 0.19" in findings
    assert "delay8** (published: delay-8 22.3 vs sync 25.4 success, -3.1): final score **worse**" in findings
    assert "final score **equivalent within ±3** (Δ +0.0, 90% CI [-0.2, +0.2], n = 6)" in findings
    for name in ("staleness_curves.png", "staleness_heatmap.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_seeds_option_and_margin(fake_runs, tmp_path):
    out = tmp_path / "results"
    assert report.main(["--runs", str(fake_runs), "--out", str(out), "--data", "webshop_small", "--seeds", "8",
                        "--margin", "0.1"]) == 0
    text = (out / "staleness.md").read_text()
    assert "sync: 6,7" in text  # expected seeds 0..7: sync lacks 6 and 7
    assert "equivalent within ±0.1" not in text.split("### final score", 1)[1].split("###", 1)[0]


# ---------------------------------------------------------------------------------------------------------
# Cells and presets
# ---------------------------------------------------------------------------------------------------------


def test_paper_cells_and_ours():
    cells = {c.name: c for c in all_cells()}
    paper = [c.name for c in paper_cells()]
    assert paper == ["sync", "async-G4", "async-K1", "delay4", "delay8", "all-stale-k1"]
    assert all(cells[n].origin == "paper" for n in paper)
    assert all(c.origin == "ours" for n, c in cells.items() if n not in paper)
    assert cells["async-G4"].overrides(16)[-1] == "schedule.slots=4"
    assert not any("slots" in o for o in cells["async-K1"].overrides(16))  # saturated: the preset's slots = N
    assert cells["delay4"].overrides(16) == ["schedule.kind=controlled", "schedule.lag=4", "schedule.max_lag=4",
                                             "schedule.stale_fraction=0.1"]
    assert cells["all-stale-k1"].overrides(16) == cells["k1-p1"].overrides(16)
    # round(0.1·N): 3 of 30 (the paper), 2 of 16 (our N), 1 of 8 (quick)
    assert [stale_count(cells["delay8"].p, n) for n in (30, 16, 8)] == [3, 2, 1]
    assert {c.name: c.same_as for c in cells.values() if c.same_as} == {
        "k4-p0.1": "delay4", "k8-p0.1": "delay8", "k1-p1": "all-stale-k1"}
    default = [c.name for c in select_cells(None)]
    assert "k4-p0.1" not in default and "delay4" in default and "k4-p0.25" in default
    assert [c.name for c in select_cells("paper")] == paper
    assert [c.name for c in select_cells("delay*,all-stale-*")] == ["delay4", "delay8", "all-stale-k1"]
    assert [c.name for c in select_cells("async-G4,k4-p0.1")] == ["async-G4", "k4-p0.1"]
    assert "async-G4" not in [c.name for c in select_cells("ours")]


def test_real_preset():
    real, quick = PRESETS["real"], PRESETS["quick"]
    assert set(real) == set(quick)
    assert real["data"] == "webshop_small" and real["cells"] == "paper"
    over = real["overrides"]
    for item in ("env.data=webshop_small", "env.max_steps=15", "es.sigma=0.05", "es.population=32", "schedule.slots=32",
                 "run.eval_every=5"):
        assert item in over, item
    # the real preset is configs/hasty.yaml's budget: its async-K1 cell resolves to that main job itself, evaluated
    # every 5 updates (experiments/protocol.md) instead of 15
    from esjax.config import config_to_yaml, load_config

    cell = next(c for c in all_cells() if c.name == "async-K1")
    base = DATASETS["webshop_small"]
    grid = yaml.safe_load(config_to_yaml(load_config(base, [*over, *cell.overrides(real["extreme_max_lag"])])))
    main_job = yaml.safe_load(config_to_yaml(load_config(base)))
    for key in ("progress", "eval_every"):
        grid["run"].pop(key), main_job["run"].pop(key)
    assert grid == main_job
    assert "env.max_steps=10" not in over and not any(o.startswith("env.num_products") for o in over)
    assert "env.max_steps=10" in quick["overrides"]
    assert "env.max_steps=10" in PRESETS["full"]["overrides"]


def test_real_preset_cli(tmp_path, capsys):
    assert staleness_grid.main(["--preset", "real", "--out", str(tmp_path), "--list"]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert listed[:6] == [["todo", n, "seed0"] for n in ("sync", "async-G4", "async-K1", "delay4", "delay8",
                                                          "all-stale-k1")]
    assert len(listed) == 6 * len(PRESETS["real"]["seeds"])
    with pytest.raises(SystemExit):
        staleness_grid.main(["--preset", "real", "--data", "synthetic", "--out", str(tmp_path), "--list"])
    with pytest.raises(SystemExit):
        staleness_grid.main(["--preset", "real", "--quick", "--out", str(tmp_path), "--list"])
    # a finished run of another preset in the same place is refused, not skipped as done
    done = tmp_path / "webshop_small" / "sync" / "seed0"
    done.mkdir(parents=True)
    (done / "summary.md").write_text("# run\n")
    (done / "grid.json").write_text(json.dumps({"preset": "quick"}))
    with pytest.raises(SystemExit, match="another preset"):
        staleness_grid.main(["--preset", "real", "--out", str(tmp_path), "--list"])
    assert staleness_grid.main(["--quick", "--data", "webshop_small", "--cells", "sync", "--seeds", "1",
                                "--out", str(tmp_path), "--list"]) == 0
    assert "done  sync  seed0" in capsys.readouterr().out


def test_findings_flag_a_margin_as_large_as_what_sync_learns():
    """Sync gains 2 points (final) and 1 (AUC): at m = 3 an equivalence would also admit a schedule that
    learned nothing, and the findings say so; at m = 0.5 they do not."""
    grid = _grid({"async-K1": [0.1, -0.1, 0.0, 0.2]}, base=[60.0, 61.0, 62.0, 63.0])  # a cell beside sync
    for run in grid["sync"]:
        run["initial"], run["auc"] = run["final"] - 2.0, run["final"] - 1.0
    assert "final-score gain +2.0, AUC gain +1.0 vs m = ±3" in report.margin_caveat(grid["sync"], 3.0)
    assert "(AUC gain +1.0 vs m = ±1.5)" in report.margin_caveat(grid["sync"], 1.5)
    assert report.margin_caveat(grid["sync"], 0.5) is None
