"""The seams of the training loop, as Protocols: what the rollout engine needs of an env pool and of an agent.

A task (:class:`esjax.task.Task`) supplies objects that implement these (the WebShop bridge's ``InProcessEnvPool``,
``esjax.agent.webshop.WebShopAgent`` (score mode) and ``esjax.agent.generate_agent.GenerateAgent`` (generate mode) are
the reference implementations); the loop itself never imports a task. The staleness schedule's seam is
:class:`esjax.loop.staleness.Schedule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from esjax.agent.automaton import ActionAutomaton


@runtime_checkable
class EnvPool(Protocol):
    """A fixed set of env sessions (rows ``0 .. len - 1``) driven in batches, in this process or elsewhere.

    The WebShop bridge's ``EnvPool`` (in-process) and ``ProcessEnvPool`` (worker processes) and
    ``esjax.parallel.envpool_ray.RayEnvPool`` (Ray actors) implement it; every answer is in the order of the rows asked.
    A pool whose calls are collectives of a multi-process job (``esjax.parallel.envrows.ProcessRowsPool``) says so
    with a true ``collective`` attribute: the rollout engine then calls it only from its own thread.
    """

    def __len__(self) -> int: ...

    def reset_rows(self, rows: Sequence[int], goals: Sequence[int]) -> list[tuple[str, dict[str, Any]]]:
        """Start goal ``goals[k]`` in row ``rows[k]``: (first observation, info) per row."""
        ...

    def step(self, actions: Sequence[str | None], timeout: float | None = None
             ) -> tuple[list[str], Any, Any, list[dict[str, Any]]]:
        """One action per row (None: leave the row alone) -> (observations, rewards, done flags, infos), per row.

        An invalid action is a no-op, not an error. A row whose step raised or took longer than ``timeout``
        seconds fails alone: done, reward 0 and ``info['failure']`` saying why; the pool replaces a hung
        session (or worker) itself, and a failed row is reset before it is stepped again.
        """
        ...

    def available_actions(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        """What each row's current page allows (e.g. WebShop's ``has_search_bar`` and ``clickables``)."""
        ...

    def instructions(self, rows: Sequence[int]) -> list[str]:
        """Each row's episode goal in words (what the agent's memory starts from)."""
        ...

    def close(self) -> None:
        """Release workers (processes, actors); the pool is not used afterwards."""
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
        """The memory of a new episode; it has an ``instruction`` attribute (the goal in words), which evaluation
        traces record."""
        ...

    def step_inputs(self, observation: str, available: dict[str, Any], memory: Any
                    ) -> tuple[list[int], Sequence[Choice], list[list[int]]]:
        """Prompt token ids, the candidates and each candidate's token ids for one waiting episode."""
        ...

    def remember(self, memory: Any, available: dict[str, Any], picked: Choice) -> None:
        """Update ``memory`` after ``picked`` was taken on the page ``available`` describes."""
        ...


@runtime_checkable
class GeneratingAgent(Protocol):
    """Generate mode: the agent turns a page into a prompt, the policy writes a reply token by token, and the agent
    parses the reply into an env action (an unparsable one is sent as it is: the env's no-op). The agent owns its
    per-episode memory."""

    stop_token_ids: frozenset[int]  # tokens that end a reply
    closing_ids: frozenset[int]  # tokens after which a reply may hold a complete action
    automaton: ActionAutomaton  # where a reply first holds a complete action, token by token (decode path)

    def new_memory(self, instruction: str) -> Any:
        """The memory of a new episode; it has an ``instruction`` attribute (the goal in words), which evaluation
        traces record."""
        ...

    def prompt_ids(self, observation: str, available: dict[str, Any], memory: Any) -> list[int]:
        """Prompt token ids of one turn."""
        ...

    def reply_choices(self, available: dict[str, Any], memory: Any) -> Sequence[Sequence[int]] | None:
        """The token ids of every reply a turn on this page may write (constrained decoding), or None: free text."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of reply tokens (stop tokens left out)."""
        ...

    def action_lengths(self, replies: Sequence[Sequence[int]], checked: Sequence[int]) -> np.ndarray:
        """For each reply (token ids): the length of its shortest prefix longer than ``checked[r]`` tokens that ends
        at a closing token and holds a complete action (its turn can end there), 0 when none does. The engine asks
        it for the replies ``automaton`` can't read."""
        ...

    def parse(self, text: str) -> tuple[str, str, bool]:
        """(reply kept, env action, whether an action was found)."""
        ...

    def remember(self, memory: Any, reply: str, action: str, info: dict[str, Any]) -> None:
        """Update ``memory`` after ``action`` was stepped and the env answered with ``info``."""
        ...
