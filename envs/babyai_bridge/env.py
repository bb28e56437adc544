"""One BabyAI session as a text env: ``reset(goal)`` / ``step(action text)``, stepping minigrid's own env.

Every valid step is ``env.step(action id)`` of the level's minigrid env, and its reward, ``terminated`` and
``truncated`` are passed on unchanged: BabyAI's reward is ``1 - 0.9 * step_count / max_steps`` on success, 0
otherwise (``MiniGridEnv._reward``), and an episode ends on success, on the verifier's failure or at the level's
``max_steps``. ``done = terminated or truncated``.

An invalid action (not a string, or text :func:`~envs.babyai_bridge.text.parse_action` can't read) is a no-op that
still counts a step: it is stepped as minigrid's ``done`` action, which changes nothing in the grid but advances
``step_count`` (so the reward and the step limit count it, exactly as minigrid would). Its ``info`` has
``valid: False`` and ``invalid_reason``. A step after the episode ended steps nothing: reward 0, done, invalid
("episode is over"), as in the WebShop bridge.
"""

from __future__ import annotations

from typing import Any

from .levels import DEFAULT_MIX, LevelMix, make_level, reset_quietly, seed_of
from .text import ACTION_TEXTS, DONE, describe, parse_action

_OBJECT_IDS = {"key": 5, "ball": 6, "box": 7}
_COLOUR_IDS = {"red": 0, "green": 1, "blue": 2, "purple": 3, "yellow": 4, "grey": 5}


class BabyAITextEnv:
    """A text session over the levels of ``mix``, playing goals of ``split`` (see :mod:`envs.babyai_bridge.levels`).

    One minigrid env per level is built on first use and reused (``reset(seed=...)`` regenerates it whole).
    """

    def __init__(self, split: str = "train", mix: LevelMix = DEFAULT_MIX):
        seed_of(split, 0)  # checks the split's name
        self.split, self.mix = split, mix
        self._envs: dict[str, Any] = {}
        self.env: Any = None  # the minigrid env of the current episode
        self.level = self.instruction = self.observation = ""
        self.goal = self.seed = -1
        self.done = True

    def reset(self, goal: int) -> tuple[str, dict[str, Any]]:
        """Start ``goal`` of this env's split: (first observation, info)."""
        goal = int(goal)
        seed = seed_of(self.split, goal)
        level = self.mix.level_of(self.split, goal)
        if level not in self._envs:
            self._envs[level] = make_level(level)
        self.env = self._envs[level]
        obs = reset_quietly(self.env, seed)
        self.level, self.goal, self.seed, self.done = level, goal, seed, False
        self.instruction = self.env.mission
        self.observation = self._text(obs)
        return self.observation, {"level": level, "goal": goal, "seed": seed, "max_steps": self.env.max_steps}

    def step(self, action: Any) -> tuple[str, float, bool, dict[str, Any]]:
        if self.done:
            return self.observation, 0.0, True, {"valid": False, "invalid_reason": "episode is over",
                                                 "action": action}
        act = parse_action(action) if isinstance(action, str) else None
        if act is None:
            why = (f"action must be a string, got {type(action).__name__}" if not isinstance(action, str)
                   else f"not an action: {action[:80]!r} (one of {', '.join(ACTION_TEXTS)})")
            info: dict[str, Any] = {"valid": False, "invalid_reason": why, "action": action}
            act = DONE
        else:
            info = {"valid": True, "action": ACTION_TEXTS[act]}
        obs, reward, terminated, truncated, _ = self.env.step(act)
        self.done = bool(terminated or truncated)
        self.observation = self._text(obs)
        info.update(steps=self.env.step_count, success=bool(terminated and reward > 0), truncated=bool(truncated))
        return self.observation, float(reward), self.done, info

    def available_actions(self) -> dict[str, Any]:
        """The candidates of score mode (always the six action phrases) and what the agent carries."""
        return {"actions": list(ACTION_TEXTS), "carrying": self._carrying_text()}

    def state(self) -> tuple[tuple[int, int], int, tuple[str, str] | None, int]:
        """(agent position, direction, carried (type, colour) or None, step count) of the minigrid env."""
        c = self.env.carrying
        return (tuple(int(v) for v in self.env.agent_pos), int(self.env.agent_dir),
                None if c is None else (c.type, c.color), int(self.env.step_count))

    def _carrying_text(self) -> str | None:
        c = None if self.env is None else self.env.carrying
        return None if c is None else f"{c.color} {c.type}"

    def _text(self, obs: dict) -> str:
        c = self.env.carrying
        carrying = None if c is None else (_OBJECT_IDS[c.type], _COLOUR_IDS[c.color])
        return describe(self.instruction, obs["image"], int(obs["direction"]), carrying)
