"""Adapter exposing WebShop's official ``WebAgentTextEnv`` through this package's env interface.

Only usable where ``web_agent_site`` (WebShop's repository, with its Java/pyserini index, Flask and
spaCy) is importable; lets the same agent code run on both for side-by-side checks.
"""

from __future__ import annotations

import importlib
import importlib.util
import operator

from .env import bare_instruction


def official_available() -> bool:
    """True when WebShop's ``web_agent_site`` package can be imported."""
    try:
        return importlib.util.find_spec("web_agent_site") is not None
    except (ImportError, ValueError):
        return False


class OfficialWebShopEnv:
    """``reset(goal_index)``, ``step(action)``, ``available_actions()``, ``instruction`` over the official env.

    ``kwargs`` go to ``WebAgentTextEnv`` (e.g. ``num_products=1000``, ``human_goals=False``);
    ``observation_mode`` is fixed to 'text'. ``instruction_text`` is WebShop's own attribute
    (``'Instruction: ' + goal text``); ``instruction`` drops that prefix, as on :class:`WebShopTextEnv`.
    """

    def __init__(self, **kwargs):
        if not official_available():
            raise ImportError("WebShop's web_agent_site is not importable; install princeton-nlp/WebShop first")
        module = importlib.import_module("web_agent_site.envs.web_agent_text_env")
        self.env = module.WebAgentTextEnv(observation_mode="text", **kwargs)

    @property
    def instruction_text(self) -> str:
        return self.env.instruction_text

    @property
    def instruction(self) -> str:
        return bare_instruction(self.env.instruction_text)

    def reset(self, goal_index: int | None = None, *, instruction_text: str | None = None) -> tuple[str, dict]:
        """WebShop's ``reset(session=goal_index, instruction_text=...)``; None draws a goal (WebShop's way).

        The index is passed as a Python ``int``: WebShop only plays goal ``session`` when
        ``isinstance(session, int)`` and otherwise draws a random goal (a NumPy integer would).
        """
        session = None if goal_index is None else operator.index(goal_index)
        extra = {} if instruction_text is None else {"instruction_text": instruction_text}
        obs, _ = self.env.reset(session=session, **extra)
        if session is None:
            server = self.env.server
            goal = server.user_sessions[self.env.session]["goal"]
            session = next((i for i, g in enumerate(server.goals) if g is goal), None)
        return obs, {"goal_index": session, "instruction": self.instruction}

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        obs, reward, done, info = self.env.step(action)
        return obs, float(reward), bool(done), dict(info or {})

    def available_actions(self) -> dict:
        return self.env.get_available_actions()
