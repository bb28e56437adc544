"""The BabyAI bridge's own contract: grammar, observation wording, no-ops, splits, determinism and the pool."""

from __future__ import annotations

import numpy as np
import pytest

from envs.babyai_bridge import (
    ACTION_TEXTS,
    DEFAULT_MIX,
    SPLITS,
    BabyAIEnvPool,
    BabyAITextEnv,
    LevelMix,
    describe,
    parse_action,
    seed_of,
)


def test_grammar_reads_the_phrases_and_aliases_and_nothing_else():
    for i, text in enumerate(ACTION_TEXTS):
        assert parse_action(text) == i
        assert parse_action(f"  {text.upper()}. ") == i
    assert parse_action("pickup") == 3 and parse_action("Open") == 5 and parse_action("forward!") == 2
    for bad in ["", "turn", "go forward now", "turn left turn right", "done", "search[red ball]", "pick  up it"]:
        assert parse_action(bad) is None, bad
    assert parse_action(None) is None and parse_action(3) is None


def test_observation_wording():
    image = np.zeros((7, 7, 3), dtype=np.uint8)
    image[:, :, 0] = 1  # empty
    image[0, 6] = (2, 5, 0)  # wall 3 steps to the left
    image[2, 4] = (6, 0, 0)  # red ball 2 ahead, 1 left
    image[3, 5] = (4, 4, 2)  # locked yellow door right in front
    image[5, 0] = (0, 0, 0)  # unseen
    text = describe("go to the red ball", image, 3, (5, 2))
    assert text.splitlines() == [
        "Mission: go to the red ball.",
        "You face north.",
        "You carry a blue key.",
        "In front of you: a locked yellow door.",
        "You see a locked yellow door 1 step ahead; a red ball 2 steps ahead and 1 to the left.",
        "Walls: 3 steps to the left.",
    ]
    image[3, 5] = (4, 1, 0)
    assert "In front of you: an open green door." in describe("m", image, 0, None)


def test_invalid_actions_are_counted_no_ops():
    pytest.importorskip("minigrid")
    env = BabyAITextEnv("train", LevelMix.equal("GoTo"))
    obs, _ = env.reset(7)
    pos, direction, carrying, steps = env.state()
    grid = env.env.grid.encode().copy()
    for k, bad in enumerate(["dance", "", "turn left and go forward", 42], start=1):
        text, r, done, info = env.step(bad)
        assert (r, done, info["valid"]) == (0.0, False, False) and info["invalid_reason"]
        assert env.state() == (pos, direction, carrying, steps + k)  # a step counted, nothing else moved
        assert text == obs and (env.env.grid.encode() == grid).all()
    assert "must be a string" in info["invalid_reason"]
    assert env.step("turn left")[3]["valid"]


def test_no_op_steps_count_towards_the_step_limit_and_after_the_end_nothing_steps():
    pytest.importorskip("minigrid")
    env = BabyAITextEnv("train", LevelMix.equal("GoToLocal"))
    _, info = env.reset(3)
    for _ in range(info["max_steps"] - 1):
        assert not env.step("???")[2]
    _, r, done, step_info = env.step("???")
    assert done and r == 0.0 and step_info["truncated"] and not step_info["success"]
    before = env.state()
    _, r, done, step_info = env.step("go forward")
    assert done and r == 0.0 and step_info == {"valid": False, "invalid_reason": "episode is over",
                                               "action": "go forward"}
    assert env.state() == before


def test_splits_never_share_a_seed_and_goals_stay_inside_their_split():
    ranges = sorted((s.base, s.base + s.size) for s in SPLITS.values())
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))
    for split, s in SPLITS.items():
        assert seed_of(split, 0) == s.base and seed_of(split, s.size - 1) == s.base + s.size - 1
        for bad in (-1, s.size):
            with pytest.raises(ValueError):
                seed_of(split, bad)
    with pytest.raises(ValueError):
        seed_of("dev", 0)


def test_split_instances_differ_on_a_sample():
    """Beyond disjoint seeds: no sampled eval or test instance is also a sampled train instance (same level, grid,
    agent start and mission), on the smallest level, where collisions are likeliest."""
    pytest.importorskip("minigrid")

    def fingerprints(split):
        env = BabyAITextEnv(split, LevelMix.equal("GoToLocal"))
        out = set()
        for g in range(300):
            env.reset(g)
            out.add((env.env.grid.encode().tobytes(), env.state()[:2], env.instruction))
        return out

    train = fingerprints("train")
    assert len(train) == 300
    assert not train & fingerprints("eval") and not train & fingerprints("test")


def test_observations_and_instances_are_deterministic():
    pytest.importorskip("minigrid")
    a, b = BabyAITextEnv("eval"), BabyAITextEnv("eval")
    b.reset(99)  # b's level envs have played another instance first
    for goal in (0, 1, 2, 5, 99):
        ta, ia = a.reset(goal)
        tb, ib = b.reset(goal)
        assert (ta, ia, a.instruction) == (tb, ib, b.instruction)
        for act in ("go forward", "turn left", "go forward", "pick up", "toggle"):
            assert a.step(act)[:3] == b.step(act)[:3]


def test_the_mix_draws_levels_by_weight_and_not_round_robin():
    mix = LevelMix(("GoToLocal", "GoTo"), (3, 1))
    levels = [mix.level_of("train", g) for g in range(4000)]
    assert levels == [mix.level_of("train", g) for g in range(4000)]
    assert 0.70 < levels.count("GoToLocal") / 4000 < 0.80
    assert levels[:8] != levels[4:12]  # not periodic
    assert [DEFAULT_MIX.level_of("eval", g) for g in range(50)] != [DEFAULT_MIX.level_of("test", g) for g in range(50)]
    with pytest.raises(ValueError):
        LevelMix(("NoSuchLevel",), (1,))


def test_pool_implements_the_env_pool_protocol():
    pytest.importorskip("minigrid")
    from esjax.loop.protocols import EnvPool

    pool = BabyAIEnvPool(4, "train")
    assert isinstance(pool, EnvPool) and len(pool) == 4
    first = pool.reset_rows([2, 0], [11, 12])
    single = BabyAITextEnv("train")
    assert first[0] == single.reset(11) and pool.instructions([2]) == [single.instruction]
    pool.reset_rows([1, 3], [13, 14])
    obs, rewards, done, infos = pool.step(["go forward", None, "nonsense", "turn right"])
    assert obs[2] == single.step("go forward")[0]
    assert infos[1] == {"skipped": True} and infos[0]["valid"] and not infos[2]["valid"]
    assert rewards.shape == done.shape == (4,)
    assert pool.available_actions([3])[0]["actions"] == list(ACTION_TEXTS)
    with pytest.raises(ValueError):
        pool.step(["go forward"])
    pool.close()


def test_a_failing_row_fails_alone():
    pytest.importorskip("minigrid")
    pool = BabyAIEnvPool(3, "train")
    pool.reset([0, 1, 2])

    def boom(action):
        raise RuntimeError("broken session")

    pool.envs[1].step = boom
    obs, rewards, done, infos = pool.step(["turn left"] * 3)
    assert done[1] and rewards[1] == 0 and infos[1]["failure"] == "error: RuntimeError: broken session"
    assert infos[0]["valid"] and infos[2]["valid"] and not done[0]
    del pool.envs[1].step
    assert pool.envs[1].step("turn left")[3]["invalid_reason"] == "episode is over"  # reset before stepping again
    pool.reset_rows([1], [5])
    assert pool.step([None, "turn left", None])[3][1]["valid"]
