"""minigrid's BabyAI bot (``minigrid.utils.baby_ai_bot.BabyAIBot``) playing an instance, for demonstrations and
horizon measurements."""

from __future__ import annotations

from dataclasses import dataclass

from .levels import make_level, reset_quietly


@dataclass(frozen=True)
class BotEpisode:
    level: str
    seed: int
    mission: str
    actions: tuple[int, ...]  # minigrid action ids, in order
    reward: float
    success: bool


def bot_episode(level: str, seed: int, env=None) -> BotEpisode:
    """The bot's episode on (``level``, ``seed``), on a fresh env of the level (or ``env``, one of it)."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    env = make_level(level) if env is None else env
    reset_quietly(env, seed)
    mission = env.mission
    bot = BabyAIBot(env)
    actions, reward, done, terminated = [], 0.0, False, False
    while not done:
        a = int(bot.replan())
        actions.append(a)
        _, reward, terminated, truncated, _ = env.step(a)
        done = terminated or truncated
    return BotEpisode(level, seed, mission, tuple(actions), float(reward), bool(terminated and reward > 0))
