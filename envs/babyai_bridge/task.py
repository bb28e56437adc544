"""BabyAI as an esjax task (``env.task: babyai``), through the same seam as WebShop (:class:`esjax.task.Task`).

A goal index is the instance's minigrid seed (:data:`~envs.babyai_bridge.levels.SPLITS`: train seeds from 0, eval
from 1.0·10^9, test from 1.1·10^9), so the three splits never overlap and one pool serves train and held-out goals
alike: :class:`SeedPool` resets a row on the split its seed belongs to. Its ``env`` keys (:class:`BabyAIOptions`):
``levels`` and ``level_weights``, the level mix (default: GoToLocal, PickupLoc, PutNextLocal and GoTo, equal
weights; experiments/results/babyai_horizons.md says why). Pools: in this process, or in Ray actors or worker
processes from a picklable recipe. Agent: :class:`~envs.babyai_bridge.agent.BabyAIAgent` (score mode: the six
action phrases are the candidates). Behaviour measures: success, steps per episode, episodes a step limit ended (the
level's own or env.max_steps).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, Field, model_validator

from esjax.task import Task

from .levels import DEFAULT_MIX, LEVEL_IDS, SPLITS, LevelMix
from .pool import BabyAIEnvPool

#: Train goals offered to the trainer (the train split itself has 10^9 seeds; a task batch draws from these).
TRAIN_GOALS = 1_000_000


def split_of_seed(seed: int) -> tuple[str, int]:
    """(split, goal within the split) of a goal index (= minigrid seed)."""
    for name, split in SPLITS.items():
        if split.base <= seed < split.base + split.size:
            return name, seed - split.base
    raise ValueError(f"goal {seed} is in no BabyAI split")


class SeedPool(BabyAIEnvPool):
    """A :class:`BabyAIEnvPool` whose goals are seeds of any split: each row is reset on its seed's split."""

    def reset_rows(self, rows: Sequence[int], goals: Sequence[int]) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for row, seed in zip(rows, goals, strict=True):
            split, goal = split_of_seed(int(seed))
            self.envs[row].split = split
            out += super().reset_rows([row], [goal])
        return out


def seed_pool(mix: LevelMix, n: int) -> SeedPool:
    """``n`` sessions over ``mix`` (picklable with ``functools.partial``: the Ray actors' recipe)."""
    return SeedPool(n, "train", mix)


class BabyAIOptions(BaseModel):
    """BabyAI's ``env`` keys: the level mix."""

    levels: list[str] = Field(list(DEFAULT_MIX.levels), description="BabyAI levels of the mix (names as in "
                                                                   "envs/babyai_bridge/levels.py)")
    level_weights: list[int] | None = Field(None, description="relative share of each level's goals "
                                                                    "(default: equal)")

    @model_validator(mode="after")
    def _check(self) -> BabyAIOptions:
        unknown = [name for name in self.levels if name not in LEVEL_IDS]
        if unknown or not self.levels:
            raise ValueError(f"env.levels: {unknown or 'none'} (known: {', '.join(LEVEL_IDS)})")
        if self.level_weights is not None and (len(self.level_weights) != len(self.levels)
                                               or min(self.level_weights) < 1):
            raise ValueError(f"env.level_weights: one positive integer per level of env.levels "
                             f"({len(self.levels)}), got {list(self.level_weights)}")
        return self


class BabyAITask(Task):
    """BabyAI levels from minigrid as an esjax task."""

    Options = BabyAIOptions
    behaviour_rows = (("success_rate", "episodes won", "{:.0%}"),
                      ("steps_per_episode", "steps / episode", "{:.1f}"),
                      ("step_limit_hits", "ended by a step limit (the level's or env.max_steps)", "{:.0%}"))

    def load(self) -> LevelMix:
        env = self.env
        return LevelMix(tuple(env.levels), tuple(env.level_weights or (1,) * len(env.levels)))

    def split(self, name: str) -> Sequence[int]:
        split = SPLITS[name]
        return range(split.base, split.base + (TRAIN_GOALS if name == "train" else split.size))

    def data_name(self) -> str:
        return "babyai:" + "+".join(self.data.levels)

    def texts(self) -> Iterable[str]:
        from .tokenizer import vocabulary

        yield " ".join(vocabulary())

    def pool(self, n: int) -> SeedPool:
        return seed_pool(self.data, n)

    def pool_recipe(self):
        return functools.partial(seed_pool, self.data)

    def score_agent(self, policy, settings, prompt_style: str):
        from .agent import BabyAIAgent

        return BabyAIAgent(policy.tokenizer, max_prompt_tokens=settings.max_prompt_tokens,
                           score_norm=settings.score_norm)

    @staticmethod
    def is_success(reward: float) -> bool:
        """Won: minigrid pays a reward (1 − 0.9·steps/max_steps, at least ~0.1) only on success, 0 otherwise."""
        return reward > 0.0

    def behaviour(self, lines: Iterable[dict[str, Any]]) -> dict[str, float | None]:
        episodes = won = steps = limited = 0
        for line in lines:
            episodes += 1
            won += float(line.get("reward", 0.0)) > 0
            steps += int(line.get("steps", 0))
            limited += line.get("end") in ("env_step_limit", "max_steps")  # minigrid's truncation or env.max_steps
        if not episodes:
            return {"success_rate": None, "steps_per_episode": None, "step_limit_hits": None}
        return {"success_rate": won / episodes, "steps_per_episode": steps / episodes,
                "step_limit_hits": limited / episodes}
