"""Episode traces and evaluation intervals without a model: snippets, the recorder across a re-run and a
checkpoint round trip, and the 95% intervals of an evaluation record."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from envs.webshop_bridge.behaviour import BEHAVIOUR_ROWS, action_kind, behaviour
from esjax.rundir.plots import behaviour_lines
from esjax.rundir.stats import Z975, eval_intervals, score_interval, t975, wilson_interval
from esjax.rundir.traces import (
    SNIPPET_CHARS,
    TraceRecorder,
    first_and_last_traces,
    paired_delta,
    snippet,
    write_traces,
)
from esjax.train.inflight import EvalProgress

INSTRUCTION = "i need a red wool scarf, and price lower than 30.00 dollars"


def _episode(trace, observation, **kw):
    fields = {"goal": 7, "memory": SimpleNamespace(instruction=INSTRUCTION), "trace": list(trace),
              "observation": observation, "failure": None, "info": {}}
    fields.update(kw)
    episode = SimpleNamespace(**fields)
    episode.steps = len(episode.trace)
    return episode


def test_snippet_drops_the_instruction_heading_and_is_short():
    page = f"Instruction: [SEP] {INSTRUCTION} [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] " + "x " * 500
    text = snippet(page, INSTRUCTION)
    assert text.startswith("Back to Search [SEP] Page 1") and len(text) == SNIPPET_CHARS and text.endswith("…")
    assert snippet("Thank you for shopping with us!\n\n  [SEP] Your code:", INSTRUCTION) == \
        "Thank you for shopping with us! [SEP] Your code:"
    # a later mention of the instruction (e.g. in a product title) is kept
    assert INSTRUCTION in snippet("a" * 60 + " " + INSTRUCTION, INSTRUCTION)


def test_recorder_follows_reruns_and_survives_a_checkpoint():
    recorder = TraceRecorder()
    search = ("search scarf", "search[red wool scarf]")
    recorder.observe(3, _episode([search], "page one"))
    # an episode that failed and starts over replaces what was recorded for its position
    recorder.observe(3, _episode([search], "page one again"))
    ev = EvalProgress(0, 2, [11, 12, 13, 14], 5, 0.0, next_position=4)
    ev.recorder = recorder
    ev.rewards[0] = 0.5
    ev.traces[0] = {"position": 0, "reward": 0.5}
    state = json.loads(json.dumps(ev.to_dict()))  # the checkpoint's loop state is JSON
    back = EvalProgress.from_dict(state, ev.goals, 9.0)
    assert (back.eval_id, back.version, back.next_position, back.rewards) == (0, 2, 4, {0: 0.5})
    assert back.traces == ev.traces and back.recorder.observations == {3: ["page one again"]}
    # the resumed run goes on where the checkpoint left off
    item = ("open #1", "click[b0001]")
    buy = ("buy now", "click[buy now]")
    done = _episode([search, item, buy], "Thank you for shopping with us!",
                    info={"reward_info": {"reward": 1.0, "r_type": 1.0}, "purchased_asin": "B0001",
                          "goal_asin": "B0001", "purchased_options": {}, "valid": True})
    back.recorder.observe(3, _episode([search, item], "item page"))
    back.recorder.observe(3, done)
    line = back.recorder.line(3, done, 1.0, max_steps=15, position=3)
    assert line["actions"] == [["search[red wool scarf]", "page one again"], ["click[b0001]", "item page"],
                               ["click[buy now]", "Thank you for shopping with us!"]]
    assert line["end"] == "bought" and line["success"] and line["reward_info"]["r_type"] == 1.0
    assert line["purchased_asin"] == line["goal_asin"] == "B0001" and "valid" not in line
    assert back.recorder.observations == {}
    # without traces an evaluation's checkpoint state is what it always was
    assert set(EvalProgress(1, 4, [1], 0, 0.0).to_dict()) == {"eval_id", "version", "started_tick", "next_position",
                                                            "rewards", "retry", "failures"}


def test_trace_line_endings():
    recorder = TraceRecorder()
    capped = _episode([("next", "click[next >]")] * 3, "page 4")
    assert recorder.line(0, capped, 0.0, max_steps=3)["end"] == "max_steps"
    failed = _episode([("next", "click[next >]")], "", failure="timeout: env step took longer than 60 s")
    recorder.observe(1, failed)
    line = recorder.line(1, failed, 0.0, max_steps=3)
    assert line["end"] == "env_failure" and line["actions"] == [["click[next >]", ""]]


def test_eval_intervals():
    from scipy import stats

    assert float(stats.norm.ppf(0.975)) == Z975  # the literal is SciPy's quantile, bit for bit
    assert [round(t975(df), 3) for df in (1, 4, 5, 10, 30, 499)] == [12.706, 2.776, 2.571, 2.228, 2.042, 1.965]
    low, high = score_interval([0.0, 1.0, 0.5, 0.5])  # mean 0.5, sd 0.408: ± 3.182 · 0.204
    assert (low, high) == pytest.approx((50 - 64.97, 50 + 64.97), abs=0.01)
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert eval_intervals([1.0]) == {}
    record = eval_intervals([1.0, 0.0, 0.25])
    assert record["score_ci_low"] < 100 * 1.25 / 3 < record["score_ci_high"]
    assert 0 < record["success_ci_low"] < 1 / 3 < record["success_ci_high"] < 1
    # a task's own success rule (BabyAI: any positive reward) counts 2 of 3 won, not 1
    anything = eval_intervals([1.0, 0.0, 0.25], is_success=lambda r: r > 0)
    assert anything["score_ci_low"] == record["score_ci_low"]
    assert (anything["success_ci_low"], anything["success_ci_high"]) == pytest.approx(wilson_interval(2, 3))


def _line(actions, end="bought", steps=None, reward=0.0):
    return {"instruction": INSTRUCTION, "actions": [[a, ""] for a in actions], "end": end,
            "steps": len(actions) if steps is None else steps, "reward": reward}


def test_action_kind_tells_written_actions_apart():
    assert action_kind("search[red scarf]") == ("search", "red scarf")
    assert action_kind("search[red sc") == ("search", "red sc")  # cut off by the reply budget: still a search
    assert action_kind("click[Buy Now]") == ("buy", "buy now")
    assert action_kind("click[< Prev]") == ("button", "< prev")
    assert action_kind("click[B07ABC1234]") == ("product", "b07abc1234")
    assert action_kind("click[Large]") == ("option", "large")
    assert action_kind("click[large") == ("malformed", "click[large")


def test_behaviour_counts_what_the_agent_did():
    lines = [
        # searched, opened one product, chose two options, bought: both options on the first item page
        _line(["search[red scarf]", "click[b07abc1234]", "click[red]", "click[large]", "click[buy now]"], reward=0.9),
        # opened a product, clicked an option, went back, opened another and bought at once (no option there)
        _line(["search[red scarf]", "click[b07abc1234]", "click[red]", "click[< prev]", "click[b01xyz9876]",
               "click[buy now]"], reward=0.5),
        # paged and ran into the step cap without buying
        _line(["search[red scarf]", "click[next >]", "click[b07abc1234]", "click[description]"], end="max_steps",
              steps=15),
    ]
    b = behaviour(lines)
    assert b["episodes"] == 3 and b["searches_per_episode"] == 1.0
    assert b["item_pages_per_episode"] == pytest.approx(4 / 3)
    assert b["option_clicks_per_item_page"] == pytest.approx(3 / 4)
    assert b["item_pages_with_option_click"] == pytest.approx(2 / 4)
    assert b["option_clicks_named_in_instruction"] == pytest.approx(2 / 3)  # 'red' is named, 'large' is not
    assert b["bought"] == pytest.approx(2 / 3) and b["bought_on_first_item_page"] == pytest.approx(1 / 3)
    # the second buy's page had no option click (the click before it was on the page left behind)
    assert b["bought_without_option_click"] == pytest.approx(1 / 3)
    assert b["reward_of_buys_with_option_click"] == 0.9 and b["reward_of_buys_without_option_click"] == 0.5
    assert b["step_cap_hits"] == pytest.approx(1 / 3)
    assert b["steps_per_episode"] == pytest.approx((5 + 6 + 15) / 3)
    empty = behaviour([])
    assert empty["episodes"] == 0 and empty["reward_of_buys_with_option_click"] is None
    # generate mode: a written "buy now" on the results page is WebShop's no-op, not a purchase
    noop = behaviour([_line(["search[red scarf]", "click[buy now]", "click[buy now]"], end="max_steps", steps=15)])
    assert noop["bought"] == 0.0 and noop["bought_on_first_item_page"] == 0.0


def test_summary_behaviour_table_reads_the_first_and_last_traces(tmp_path):
    write_traces(tmp_path / "eval-v0.jsonl", [_line(["search[x]", "click[b07abc1234]", "click[buy now]"])])
    write_traces(tmp_path / "eval-v15.jsonl", [_line(["search[x]", "click[b07abc1234]", "click[buy now]"])])
    write_traces(tmp_path / "eval-v30.jsonl", [_line(["search[x]", "click[b07abc1234]", "click[red]",
                                                      "click[buy now]"])])
    found = first_and_last_traces(tmp_path)
    assert sorted(found) == [0, 30]
    text = "\n".join(behaviour_lines({v: behaviour(lines) for v, lines in found.items()}, BEHAVIOUR_ROWS))
    assert "| | v0 | v30 |" in text and "| option clicks per item page | 0.00 | 1.00 |" in text
    assert first_and_last_traces(tmp_path / "missing") == {} and behaviour_lines({}, BEHAVIOUR_ROWS) == []


def test_paired_delta_pairs_goals():
    before = [{"goal": g, "reward": r} for g, r in [(3, 0.5), (1, 0.0), (2, 1.0)]]
    after = [{"goal": g, "reward": r} for g, r in [(1, 0.5), (2, 1.0), (3, 1.0)]]
    d = paired_delta(before, after)
    diffs = np.array([50.0, 0.0, 50.0])  # goals 1, 2, 3
    half = t975(2) * diffs.std(ddof=1) / np.sqrt(3)
    assert d["delta"] == pytest.approx(diffs.mean()) and d["high"] == pytest.approx(diffs.mean() + half)
    assert (d["goals"], d["better"], d["worse"]) == (3, 2, 0)
    assert paired_delta(before, after[:2]) is None  # not the same goals: no pairing
