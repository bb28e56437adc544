"""The BabyAI agent of score mode: a prompt and the six candidate actions of each step, for a policy to score.

It implements ``esjax.loop.protocols.ScoringAgent`` (structurally: nothing here imports esjax). Each step:

- **prompt**: the bridge's observation text (:func:`~envs.babyai_bridge.text.describe`: the mission, heading,
  what the agent carries, the cell in front, the visible objects and doors with their offsets, the nearest walls),
  then the episode's last ``memory_actions`` actions (oldest first; ``none`` at the start), then ``Action:``. The
  observation shows only the present, so the recent actions are the agent's memory: they tell a policy that it has
  just turned (and should not turn back) or just picked something up;
- **candidates**: the bridge's candidate actions (``available_actions()['actions']``: ``turn left``, ``turn right``,
  ``go forward``, ``pick up``, ``drop``, ``toggle``), each scored by its own text and sent to the env as that text;
- **score**: the policy's mean per-token log-likelihood of a candidate's text after the prompt
  (``score_norm='mean'``); the engine takes the best (greedy) or samples (training).

The embedded BabyAI policy (``esjax/assets/babyai_policy``, ``model.embedded: babyai``) was behaviour-cloned in
exactly this format (``experiments/pretrain_babyai_policy.py``) with the word-level tokenizer of
:mod:`envs.babyai_bridge.tokenizer`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from esjax.agent.tokenizer import keep_head_and_tail

from .text import ACTION_TEXTS

#: Prompts kept tokenized (least recently used dropped): the members of one version play the same goals.
PROMPT_CACHE = 16_384


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One action the policy may take: ``text`` is scored, ``action`` is sent to the env (here the same phrase)."""

    text: str
    action: str


@dataclasses.dataclass
class BabyAIMemory:
    """What the agent remembers within one episode: its mission and the actions it took, in order."""

    mission: str
    actions: list[str] = dataclasses.field(default_factory=list)

    @property
    def instruction(self) -> str:
        """The episode's goal in words, as every agent's memory names it (a trace line records it)."""
        return self.mission


def prompt_text(observation: str, memory: BabyAIMemory, memory_actions: int) -> str:
    """The prompt of one step (see the module's docstring)."""
    recent = memory.actions[-memory_actions:] if memory_actions > 0 else []
    return f"{observation}\nLast actions: {', '.join(recent) if recent else 'none'}.\nAction:"


def candidates_for(available: dict[str, Any]) -> list[Candidate]:
    """The step's candidates: the bridge's action phrases (all six when ``available`` names none)."""
    return [Candidate(text, text) for text in available.get("actions", ACTION_TEXTS)]


class BabyAIAgent:
    """Builds token-level prompts and candidates for batched scoring (an ``esjax`` ``ScoringAgent``).

    Args:
      tokenizer: a ``tokenizers.Tokenizer`` (the policy's; :func:`envs.babyai_bridge.tokenizer.build_tokenizer`
        for the embedded one).
      memory_actions: how many of the episode's last actions the prompt lists.
      max_prompt_tokens: longer prompts keep their head (mission, heading, what is in front) and tail (walls,
        recent actions), dropping the middle of a long list of seen objects (the default, 192 tokens, cuts fewer
        than 1% of the default mix's prompts: a step of GoTo that sees a dozen objects; the mean is ~80).
      score_norm: ``'mean'`` (per-token) or ``'sum'`` log-likelihood of a candidate.
    """

    def __init__(self, tokenizer: Any, memory_actions: int = 3, max_prompt_tokens: int = 192,
                 score_norm: str = "mean"):
        if score_norm not in ("mean", "sum"):
            raise ValueError(f"agent score_norm must be 'mean' or 'sum', got {score_norm!r}")
        if memory_actions < 0 or max_prompt_tokens < 2:
            raise ValueError(f"memory_actions must be >= 0 and max_prompt_tokens >= 2, got {memory_actions}, "
                             f"{max_prompt_tokens}")
        self.tokenizer = tokenizer
        self.memory_actions = memory_actions
        self.max_prompt_tokens = max_prompt_tokens
        self.score_norm = score_norm
        self.encode = functools.lru_cache(maxsize=PROMPT_CACHE)(self._tokenize)
        self._candidate_ids: dict[str, list[int]] = {}

    def _tokenize(self, text: str) -> list[int]:
        """``text``'s ids (``encode`` is this, cached: the list is shared, do not modify it)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def prompt_text(self, observation: str, memory: BabyAIMemory) -> str:
        return prompt_text(observation, memory, self.memory_actions)

    def encode_prompt(self, text: str) -> list[int]:
        return keep_head_and_tail(self.encode(text), self.max_prompt_tokens)

    def encode_candidate(self, candidate: Any) -> list[int]:
        """The ids of a candidate's text (a shared list: do not modify)."""
        ids = self._candidate_ids.get(candidate.text)
        if ids is None:
            ids = self._candidate_ids[candidate.text] = self._tokenize(" " + candidate.text)
        return ids

    def new_memory(self, instruction: str) -> BabyAIMemory:
        return BabyAIMemory(instruction)

    def remember(self, memory: BabyAIMemory, available: dict[str, Any], picked: Any) -> None:
        memory.actions.append(picked.text)

    def step_inputs(self, observation: str, available: dict[str, Any], memory: BabyAIMemory
                    ) -> tuple[list[int], list[Candidate], list[list[int]]]:
        """Prompt ids, candidates and candidate ids for one waiting episode."""
        candidates = candidates_for(available)
        prompt = self.encode_prompt(self.prompt_text(observation, memory))
        return prompt, candidates, [self.encode_candidate(c) for c in candidates]

    def step_texts(self, observation: str, available: dict[str, Any], memory: BabyAIMemory
                   ) -> tuple[str, list[str]]:
        """The prompt text and candidate texts of a step (what pretraining records)."""
        return self.prompt_text(observation, memory), [c.text for c in candidates_for(available)]

