"""The BabyAI bridge against minigrid itself: same seed and same actions give the same agent position, direction,
carried object, step count, reward and done flag at every step, and the same observation (the bridge's text is
the one minigrid's own egocentric observation gives); the bot's episodes replay through the bridge."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

pytest.importorskip("minigrid")
import gymnasium as gym  # noqa: E402

from envs.babyai_bridge import ACTION_TEXTS, ALIASES, BabyAITextEnv, LevelMix, describe, level_id, seed_of  # noqa: E402
from envs.babyai_bridge.bot import bot_episode  # noqa: E402

#: The default mix's levels and the two other long ones the notes measured.
LEVELS = ("GoToLocal", "PickupLoc", "PutNextLocal", "GoTo", "Open", "GoToObjMaze")
SEQUENCES = 1020  # random action sequences in all, split evenly over LEVELS
_OBJ = {"key": 5, "ball": 6, "box": 7}
_COL = {"red": 0, "green": 1, "blue": 2, "purple": 3, "yellow": 4, "grey": 5}
_ALIAS_OF = {a: [t for t, i in ALIASES.items() if i == a] for a in range(6)}


def reference(level: str):
    """A plain minigrid env, as gymnasium's registry makes it (wrappers included)."""
    return gym.make(level_id(level))


def ref_reset(env, seed: int):
    with contextlib.redirect_stdout(io.StringIO()):
        obs, _ = env.reset(seed=seed)
    return obs


def ref_state(env) -> tuple:
    u = env.unwrapped
    c = u.carrying
    return (tuple(int(v) for v in u.agent_pos), int(u.agent_dir), None if c is None else (c.type, c.color),
            int(u.step_count))


def ref_text(env, obs) -> str:
    c = env.unwrapped.carrying
    return describe(env.unwrapped.mission, obs["image"], int(obs["direction"]),
                    None if c is None else (_OBJ[c.type], _COL[c.color]))


def action_text(a: int, rng: np.random.Generator) -> str:
    """Some text the bridge reads as action ``a`` (6, minigrid's ``done``: text that is no action)."""
    if a == 6:
        return str(rng.choice(["dance", "", "go forward twice", "done", "turn around", "pick"]))
    options = [ACTION_TEXTS[a], ACTION_TEXTS[a].upper() + ".", "  " + ACTION_TEXTS[a].replace(" ", "   ")]
    options += _ALIAS_OF[a]
    return str(rng.choice(options))


@pytest.mark.parametrize("level", LEVELS)
def test_random_action_sequences_match_minigrid(level):
    rng = np.random.default_rng(["GoToLocal", "PickupLoc", "PutNextLocal", "GoTo", "Open",
                                 "GoToObjMaze"].index(level) + 55)
    bridge, ref = BabyAITextEnv("train", LevelMix.equal(level)), reference(level)
    sequences, steps, ended, successes = SEQUENCES // len(LEVELS), 0, 0, 0
    for _ in range(sequences):
        goal = int(rng.integers(0, 10_000_000))
        text, info = bridge.reset(goal)
        obs = ref_reset(ref, seed_of("train", goal))
        assert info["level"] == level and info["seed"] == seed_of("train", goal)
        assert bridge.instruction == ref.unwrapped.mission and info["max_steps"] == ref.unwrapped.max_steps
        assert bridge.state() == ref_state(ref) and text == ref_text(ref, obs)
        # mostly acting actions, with forward favoured so that episodes get somewhere, and some no-ops
        for a in rng.choice(7, size=int(rng.integers(1, 41)), p=[.17, .17, .3, .1, .08, .1, .08]):
            obs, r_ref, term, trunc, _ = ref.step(int(a))
            text, r, done, info = bridge.step(action_text(int(a), rng))
            steps += 1
            assert info["valid"] == (a != 6)
            assert bridge.state() == ref_state(ref)
            assert r == float(r_ref) and done == (term or trunc)
            assert text == ref_text(ref, obs)
            if done:
                ended += 1
                successes += r > 0
                break
    assert steps > 10 * sequences
    print(f"{level}: {sequences} sequences, {steps} steps, {ended} ended, {successes} successes")


@pytest.mark.parametrize("split", ["train", "eval", "test"])
def test_the_bots_actions_replayed_through_the_bridge_succeed(split):
    mix = LevelMix.equal("GoToLocal", "PickupLoc", "PutNextLocal", "GoTo", "Open")
    env = BabyAITextEnv(split, mix)
    for goal in range(25):
        _, info = env.reset(goal)
        ep = bot_episode(info["level"], info["seed"])
        assert ep.success and ep.mission == env.instruction
        for k, a in enumerate(ep.actions):
            _, r, done, step_info = env.step(ACTION_TEXTS[a] if a < 6 else "done")
            assert done == (k == len(ep.actions) - 1)
        assert step_info["success"] and r == ep.reward
        assert r == pytest.approx(1 - 0.9 * len(ep.actions) / info["max_steps"])  # BabyAI's reward


def test_sequences_run_to_the_step_limit_match_minigrid():
    """Truncation too: 20 random sequences on GoToLocal (64 steps) played until minigrid ends them."""
    rng = np.random.default_rng(5500)
    bridge, ref = BabyAITextEnv("test", LevelMix.equal("GoToLocal")), reference("GoToLocal")
    truncated = 0
    for goal in range(20):
        bridge.reset(goal)
        ref_reset(ref, seed_of("test", goal))
        done = False
        while not done:
            a = int(rng.choice(7, p=[.25, .25, .1, .1, .1, .1, .1]))
            _, r_ref, term, trunc, _ = ref.step(a)
            _, r, done, info = bridge.step(action_text(a, rng))
            assert bridge.state() == ref_state(ref) and r == float(r_ref) and done == (term or trunc)
        truncated += info["truncated"]
    assert truncated >= 5
