"""The seams of the training loop, as Protocols: what the rollout engine needs of an env pool and of an agent.

A new task plugs in by implementing these (the WebShop bridge's ``EnvPool`` and ``esjax.agent.WebShopAgent``
are the reference implementations); the loop itself never imports a task. The staleness schedule's seam is
:class:`esjax.loop.schedules.Schedule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class EnvSession(Protocol):
    """One environment session: a text page, the actions it allows, one action at a time."""

    @property
    def instruction(self) -> str:
        """The episode's goal in words (what the agent's memory starts from)."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """(observation, reward, done, info) after ``action``; an invalid action is a no-op, not an error."""
        ...

    def available_actions(self) -> dict[str, Any]:
        """What the current page allows (e.g. WebShop's ``has_search_bar`` and ``clickables``)."""
        ...


@runtime_checkable
class EnvPool(Protocol):
    """A fixed set of env sessions the engine addresses by row. Optionally ``replace_env(row)``: a fresh
    session for a row whose step hung (the engine calls it when present)."""

    envs: Sequence[EnvSession]

    def __len__(self) -> int: ...

    def reset_one(self, row: int, goal: int) -> tuple[str, dict[str, Any]]:
        """Start goal ``goal`` in ``row``: (first observation, info)."""
        ...


class Choice(Protocol):
    """A candidate action: the text the policy scores and the env action it stands for."""

    text: str
    action: str


@runtime_checkable
class ScoringAgent(Protocol):
    """Score mode: the agent turns a page into a prompt and candidate actions; the policy scores each candidate's
    text given the prompt and the engine picks one (greedy or sampled). The agent owns its per-episode memory."""

    score_norm: str  # 'mean' or 'sum' per-token log-likelihood

    def new_memory(self, instruction: str) -> Any:
        """The memory of a new episode."""
        ...

    def step_inputs(self, observation: str, available: dict[str, Any], memory: Any
                    ) -> tuple[list[int], Sequence[Choice], list[list[int]]]:
        """Prompt token ids, the candidates and each candidate's token ids for one waiting episode."""
        ...

    def remember(self, memory: Any, available: dict[str, Any], picked: Choice) -> None:
        """Update ``memory`` after ``picked`` was taken on the page ``available`` describes."""
        ...
