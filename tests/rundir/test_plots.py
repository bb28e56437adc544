"""The run's figures from hand-made records (no training): every evaluation with its 95% band and success rate
on a second axis, the population fitness band, integer lags, and no line for a constant utilization."""

from __future__ import annotations

import pytest

from esjax.rundir import plots
from esjax.rundir.stats import eval_intervals


def _records(utilization=None, discarded=True, intervals=True):
    records = []
    for v in range(7):
        if v:
            records.append({"kind": "update", "version": v, "wall_time": 10.0 * v, "fitness_mean": 0.5 + 0.01 * v,
                            "fitness_min": 0.3, "fitness_max": 0.8, "fitness_std": 0.1,
                            "lag_hist": {"0": 6, "1": 2} if v % 2 else {"0": 8},
                            "cohort_stale_fraction": 0.25 * (v % 2),
                            "slot_utilization": utilization if utilization is not None else 0.8 + 0.02 * v,
                            "discarded": v // 2 if discarded else 0, "episodes_per_s": 2.0 + v,
                            "tokens_per_s": 900.0 + 10 * v, "seconds": 10.0})
        if v % 3 == 0:
            rewards = [1.0, 0.5, 0.0, 0.75 + 0.01 * v]
            record = {"kind": "eval", "version": v, "wall_time": 10.0 * v + 1, "score": 25.0 * sum(rewards),
                      "success_rate": 0.25, "goals": 4}
            if intervals:
                record.update(eval_intervals(rewards))
            records.append(record)
    return records


@pytest.fixture
def figures(monkeypatch):
    """The figures write_plots draws, kept open for inspection."""
    drawn = []
    monkeypatch.setattr(plots.plt, "close", drawn.append)
    yield drawn
    monkeypatch.undo()
    for fig in drawn:
        plots.plt.close(fig)


def _labels(ax):
    return [artist.get_label() for artist in (*ax.lines, *ax.collections, *ax.containers)]


def test_eval_points_and_bands():
    with_bounds = plots.eval_points(_records())
    assert [p["x"] for p in with_bounds] == [0, 3, 6]
    assert all(p["score_ci_low"] < p["score"] < p["score_ci_high"] for p in with_bounds)
    assert all(0 <= p["success_ci_low"] < 0.25 < p["success_ci_high"] for p in with_bounds)
    # a record with its per-goal rewards and no stored interval gets one; without either, no band
    bare = [r for r in _records(intervals=False) if r["kind"] == "eval"]
    assert all("score_ci_low" not in p for p in plots.eval_points(bare))
    from_rewards = plots.eval_points([{**bare[0], "rewards": [1.0, 0.5, 0.0, 0.75]}])
    assert from_rewards[0]["score_ci_low"] == pytest.approx(eval_intervals([1.0, 0.5, 0.0, 0.75])["score_ci_low"])
    band = plots.fitness_band(_records())
    assert band["x"] == [1, 2, 3, 4, 5, 6] and band["min"] == [30.0] * 6 and band["max"] == [80.0] * 6
    assert band["sd_low"][0] == pytest.approx(41.0) and band["sd_high"][0] == pytest.approx(61.0)


def test_figures_show_bands_success_rate_integer_lags(figures, tmp_path):
    paths = plots.write_plots(_records(), tmp_path, title="default: async ES (K=1), seed 0, commit 0123abcd",
                              marks=[(3, "resumed"), (5, "extended")])
    assert [p.name for p in paths] == ["score.png", "staleness.png", "throughput.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    score, staleness, throughput = figures
    assert score._suptitle.get_text().endswith("seed 0, commit 0123abcd")
    evaluation, success, population, wall = score.axes  # one quantity per panel, no twin axes
    assert evaluation.get_ylabel() == "score" and success.get_ylabel() == "success rate"
    assert population.get_ylabel() == "training fitness ×100" and wall.get_xlabel() == "wall-clock (s)"
    points = [line for line in evaluation.lines if line.get_label() == "held-out score (100 × mean reward)"]
    assert points[0].get_xdata().tolist() == [0, 3, 6]  # every evaluation point
    assert "95% interval (t)" in _labels(evaluation) and "95% interval (Wilson)" in _labels(success)
    rates = [line for line in success.lines if line.get_label() == "success rate (reward = 1)"]
    assert max(rates[0].get_ydata()) > 1  # in percent
    assert {"cohort mean fitness ×100", "cohort min-max", "mean ± 1 SD"} <= set(_labels(population))
    assert "not comparable to the greedy held-out score" in population.texts[0].get_text()
    for ax in (evaluation, success, population):  # where the run was resumed / extended
        assert {"resumed here", "extended here"} <= set(_labels(ax))
    lags, per_update, discards = staleness.axes
    assert [t.get_text() for t in lags.get_xticklabels()] == ["0", "1"]  # whole lags only
    assert "slot utilization (busy slots / slots)" in _labels(per_update)
    assert "stale share of the cohort" in _labels(per_update)
    assert sum(bar.get_height() for bar in discards.patches) == 3  # discarded per update, from the running total
    rates, per_version, tokens = throughput.axes
    assert rates.lines[0].get_xdata().tolist() == [10.0 * v for v in range(1, 7)]  # against wall-clock time
    assert rates.lines[0].get_ydata().tolist() == [2.0 + v for v in range(1, 7)]
    assert tokens.lines[0].get_label() == "scored tokens / s, right axis"
    assert [bar.get_height() for bar in per_version.patches] == [10.0] * 6
    assert per_version.lines[0].get_xdata().tolist() == [1, 4]  # the intervals after the evaluations at 0 and 3


def test_constant_utilization_is_stated_not_drawn(figures, tmp_path):
    plots.write_plots(_records(utilization=1.0, discarded=False), tmp_path)
    _, staleness, _ = figures
    lags, per_update = staleness.axes  # no discards: no second axis
    assert "slot utilization (busy slots / slots)" not in _labels(per_update)
    assert "slot utilization 1.00 at every update" in per_update.get_title()
    assert "no results discarded" in per_update.get_title()


def test_summary_lists_every_evaluation_with_its_intervals(tmp_path):
    records = _records()
    text = plots.write_summary(records, tmp_path / "summary.md", "run")
    assert (tmp_path / "summary.md").read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.split("|")[2].strip().isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["before", "", "after"]
    for row, point in zip(rows, plots.eval_points(records)):
        cells = [cell.strip() for cell in row.split("|")[2:-1]]
        assert cells == [str(point["x"]), f"{point['score']:.1f}",
                         f"[{point['score_ci_low']:.1f}, {point['score_ci_high']:.1f}]", "25.0%",
                         f"[{100 * point['success_ci_low']:.1f}%, {100 * point['success_ci_high']:.1f}%]", "4"]
    assert "Δ score: +1.5 on 4 held-out goals." in text
    bare = plots.write_summary(_records(intervals=False), tmp_path / "bare.md", "run")  # older records: no bounds
    assert "|  | 3 | 57.0 | n/a | 25.0% | n/a | 4 |" in bare
