"""BabyAI (minigrid's BabyAI levels) as a text task for esjax: see README.md.

Importing this package imports neither minigrid nor gymnasium; building an env or pool does. The agent
(:class:`BabyAIAgent`, score mode) needs only a ``tokenizers`` tokenizer.
"""

from .agent import BabyAIAgent
from .env import BabyAITextEnv
from .levels import DEFAULT_MIX, LEVEL_IDS, SPLITS, LevelMix, level_id, make_level, seed_of
from .pool import BabyAIEnvPool
from .text import ACTION_TEXTS, ALIASES, describe, parse_action

__all__ = ["ACTION_TEXTS", "ALIASES", "DEFAULT_MIX", "LEVEL_IDS", "SPLITS", "BabyAIAgent", "BabyAIEnvPool",
           "BabyAITextEnv", "LevelMix", "describe", "level_id", "make_level", "parse_action", "seed_of"]
