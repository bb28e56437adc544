"""experiments/es_direction_probe.py on the shipped generative policy at toy size: one cohort, one line search."""

from __future__ import annotations

import json

import pytest

from experiments import es_direction_probe


@pytest.mark.slow
def test_line_search_record_is_paired_with_the_centre(tmp_path, capsys):
    out = tmp_path / "probe.jsonl"
    es_direction_probe.main(["--members", "4", "--goals", "2", "--eval-goals", "3", "--estimates", "1",
                             "--etas", "0,0.003", "--out", str(out)])
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["members"] == 4 and record["eval_goals"] == 3 and record["entries"] > 0
    assert 0 <= record["centre"] <= 100
    assert record["split_half_reliability"] is None or -1 <= record["split_half_reliability"] <= 1
    steps = {(s["direction"], s["eta"]): s for s in record["steps"]}
    assert set(steps) == {("es", 0.0), ("es", 0.003), ("shuffled", 0.0), ("shuffled", 0.003)}
    for (_, eta), s in steps.items():
        assert s["delta"] == pytest.approx(s["score"] - record["centre"])
        if eta == 0:  # θ + 0·g is θ: the same episodes as the centre
            assert s["delta"] == 0 and s["changed_goals"] == 0 and s["step_per_entry"] == 0
    assert set(record["behaviour"]) == set(es_direction_probe.BEHAVIOUR)
    for b in record["behaviour"].values():
        assert b["mean"] >= 0 and b["member_std"] >= 0
        assert b["pair_vs_fitness"] is None or -1 <= b["pair_vs_fitness"] <= 1
    assert record["behaviour"]["steps"]["mean"] >= 1
    assert record["behaviour"]["search_words"]["mean"] > 0  # score mode's searches are counted too
    assert "split-half reliability" in capsys.readouterr().out


def test_episode_behaviour_counts_actions_by_kind():
    """A trace step is (what the policy chose, the env action): a reply in generate mode, a candidate's text in score
    mode; the env action is counted."""
    actions = ["search[red running shoes]", "click[B07XYZ1234]", "click[Red]", "click[size 9]", "click[< Prev]",
               "click[Buy Now]", "click[oops", "search[again]"]
    expected = {"steps": 8, "search_words": 3, "products": 1, "options": 2, "buy_clicks": 1}
    generate = [(f"{a} ", a) for a in actions]
    score = [(f"candidate {i}: open #1 $12.99", a) for i, a in enumerate(actions)]
    for trace in (generate, score):
        assert dict(zip(es_direction_probe.BEHAVIOUR, es_direction_probe.episode_behaviour(trace))) == expected


@pytest.mark.slow
def test_score_mode_probe_runs_the_configs_agent_on_a_candidate_scoring_policy(tmp_path):
    """``--config``: the embedded (candidate-scoring) policy with configs/default.yaml's agent and shop; the same
    record, paired line search included."""
    from experiments.lib import REPO

    out = tmp_path / "probe.jsonl"
    es_direction_probe.main(["--config", str(REPO / "configs" / "default.yaml"), "--policy",
                             str(REPO / "esjax" / "assets" / "default_policy"), "--sigma", "0.05", "--members", "4",
                             "--goals", "2", "--eval-goals", "2", "--estimates", "1", "--etas", "0", "--out", str(out)])
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["config"].endswith("default.yaml") and record["members"] == 4 and record["entries"] > 0
    assert record["split_half_reliability"] is None or -1 <= record["split_half_reliability"] <= 1
    assert all(s["delta"] == 0 and s["changed_goals"] == 0 for s in record["steps"])  # η = 0 is the centre
    assert record["behaviour"]["steps"]["mean"] >= 1
    assert record["behaviour"]["search_words"]["mean"] > 0  # score mode's searches are counted too
