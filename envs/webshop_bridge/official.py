"""Adapter exposing WebShop's official ``WebAgentTextEnv`` through this package's env interface.

Only usable where ``web_agent_site`` (WebShop's repository, with its Java/pyserini index, Flask and
spaCy) is importable; lets the same agent code run on both for side-by-side checks.
"""

from __future__ import annotations

import importlib
import importlib.util


def official_available() -> bool:
    """True when WebShop's ``web_agent_site`` package can be imported."""
    try:
        return importlib.util.find_spec("web_agent_site") is not None
    except (ImportError, ValueError):
        return False


class OfficialWebShopEnv:
    """``reset(goal_index)``, ``step(action)``, ``available_actions()``, ``instruction`` over the official env.

    ``kwargs`` go to ``WebAgentTextEnv`` (e.g. ``num_products=1000``, ``human_goals=False``);
    ``observation_mode`` is fixed to 'text'.
    """

    def __init__(self, **kwargs):
        if not official_available():
            raise ImportError("WebShop's web_agent_site is not importable; install princeton-nlp/WebShop first")
        module = importlib.import_module("web_agent_site.envs.web_agent_text_env")
        self.env = module.WebAgentTextEnv(observation_mode="text", **kwargs)

    @property
    def instruction(self) -> str:
        return self.env.instruction_text

    def reset(self, goal_index: int | None = None) -> tuple[str, dict]:
        obs, _ = self.env.reset(session=goal_index)
        return obs, {"goal_index": goal_index, "instruction": self.env.instruction_text}

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        obs, reward, done, info = self.env.step(action)
        return obs, float(reward), bool(done), dict(info or {})

    def available_actions(self) -> dict:
        return self.env.get_available_actions()
