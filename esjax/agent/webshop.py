"""The WebShop agent: turns an observation into a prompt and a list of candidate actions to score.

The policy picks actions by *scoring candidates*: every valid action gets a short natural-language
description (``open #2 $12.99 <title>``, ``choose navy``, ``buy now``...) and the model's log-likelihood of
that description given the prompt ranks them. Descriptions carry the information an action's bare
string lacks (an ASIN says nothing; its title, rank and price do), so a small model can learn to match goal
and product. A product candidate starts with the result's rank and price so that cutting a long real title
to ``max_candidate_tokens`` keeps what matters: rank, price and the title's head (brand and product type).

Scores are normalised per token by default (``score_norm='mean'``): with summed log-likelihoods a
two-token ``next page`` beats every 20-token product title by tens of nats, whatever the model knows.

Two prompt styles share the same candidates:

* ``compact``: a one-line state (goal, page, item, chosen options) for the small embedded policy;
* ``chat``: WebShop's full text observation in the model's chat template, for instruct checkpoints.

The agent only reads the observation text and ``available_actions()`` (nothing from the env's internals),
so it works on any WebShop-protocol environment. It keeps per-episode memory of the options chosen on the
current item page, which WebShop's text observation does not show.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import Any, Literal

from esjax.agent.tokenizer import keep_head_and_tail

SEP = " [SEP] "
_BUTTONS = {"back to search", "next >", "< prev", "description", "features", "reviews", "buy now", "search"}
_PRICE = re.compile(r"^\$[\d,.]+( to \$[\d,.]+)?$")

PromptStyle = Literal["compact", "chat"]

#: Token ids kept by text (least recently used dropped): prompts of the live episodes, and every candidate text
#: (titles, options) a run's pages show.
PROMPT_CACHE = 16_384
CANDIDATE_CACHE = 65_536

SYSTEM_PROMPT = ("You are a shopping agent on WebShop. Read the instruction and the page, "
                 "then choose the next action.")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One action the policy may take: ``text`` is scored by the model, ``action`` is sent to the env."""

    text: str
    action: str


@dataclasses.dataclass
class EpisodeMemory:
    """What the agent remembers within one episode."""

    instruction: str
    chosen: list[str] = dataclasses.field(default_factory=list)
    item: str | None = None

    def record(self, kind: str, candidate: Candidate) -> None:
        """Update memory after ``candidate`` was taken on a page of ``kind``."""
        if kind == "item" and candidate.text.startswith("choose "):
            value = candidate.text[len("choose "):]
            if value not in self.chosen:
                self.chosen.append(value)
        elif kind == "item" and candidate.action in ("click[< prev]", "click[back to search]"):
            self.chosen.clear()
            self.item = None
        elif kind == "results" and candidate.text.startswith("open "):
            self.chosen.clear()
            self.item = candidate.text[len("open "):]


def page_kind(available: dict) -> str:
    """search / results / item / item_sub / done, from the available actions (as WebShop's agents do)."""
    clickables = available.get("clickables", [])
    if available.get("has_search_bar"):
        return "search"
    if "buy now" in clickables:
        return "item"
    if "next >" in clickables:
        return "results"
    if "< prev" in clickables:
        return "item_sub"
    return "done"


def _segments(observation: str) -> list[str]:
    return [s.strip() for s in observation.split(SEP)]


def parse_results(observation: str, clickables: Sequence[str]) -> list[tuple[str, str, str]]:
    """``(asin, title, price)`` of every hit on a results page."""
    keys = {c for c in clickables if c not in _BUTTONS}
    segs = _segments(observation)
    hits = []
    for i, seg in enumerate(segs):
        if seg.lower() in keys:
            title = segs[i + 1] if i + 1 < len(segs) else ""
            price = segs[i + 2] if i + 2 < len(segs) and _PRICE.match(segs[i + 2]) else ""
            hits.append((seg.lower(), title, price))
    return hits


def parse_item(observation: str) -> tuple[str, str]:
    """``(title, price)`` of an item page."""
    segs = _segments(observation)
    for i, seg in enumerate(segs):
        if seg.startswith("Price: ") and i > 0:
            return segs[i - 1], seg[len("Price: "):]
    return "", ""


def candidates_for(observation: str, available: dict, memory: EpisodeMemory) -> list[Candidate]:
    """The candidate actions of a page, each with the description the model scores."""
    kind = page_kind(available)
    clickables = list(available.get("clickables", []))
    if kind == "search":
        return [Candidate(f"search {memory.instruction}", f"search[{memory.instruction}]")]
    if kind == "results":
        first = 10 * (results_page(observation) - 1) + 1  # rank of the page's first hit (10 per page)
        out = [Candidate(f"open #{first + i} {price} {title}".replace("  ", " ").strip(), f"click[{asin}]")
               for i, (asin, title, price) in enumerate(parse_results(observation, clickables))]
        if "next >" in clickables:
            out.append(Candidate("next page", "click[next >]"))
        out.append(Candidate("back to search", "click[back to search]"))
        return out
    if kind == "item":
        values = [c for c in clickables if c not in _BUTTONS and c not in memory.chosen]
        out = [Candidate(f"choose {v}", f"click[{v}]") for v in values]
        out.append(Candidate("buy now", "click[buy now]"))
        out.append(Candidate("go back", "click[< prev]"))
        return out
    if kind == "item_sub":
        return [Candidate("go back", "click[< prev]")]
    return []


_PAGE = re.compile(r"Page (\d+) \(Total results: (\d+)\)")

#: Words of an item's title kept in the compact prompt (real titles run to 30+ words; the head names it).
ITEM_TITLE_WORDS = 12


def results_page(observation: str) -> int:
    """The results page number shown in ``observation`` (1 if none)."""
    match = _PAGE.search(observation)
    return int(match.group(1)) if match else 1


def compact_prompt(observation: str, available: dict, memory: EpisodeMemory) -> str:
    """One-line state for the small policy."""
    kind = page_kind(available)
    parts = [f"goal: {memory.instruction.lower()}", f"page: {kind}"]
    if kind == "item":
        title, price = parse_item(observation)
        title = " ".join(title.split()[:ITEM_TITLE_WORDS])
        parts.append(f"item: {title} {price}".strip())
        parts.append(f"chosen: {', '.join(memory.chosen) if memory.chosen else 'none'}")
    elif kind == "results":
        parts.append(f"results page {results_page(observation)}")
    return " | ".join(parts) + " | act:"


def chat_messages(observation: str, available: dict, memory: EpisodeMemory,
                  candidates: Sequence[Candidate]) -> list[dict[str, str]]:
    """Messages for a chat-template prompt: the full observation and the list of candidate actions."""
    chosen = ", ".join(memory.chosen) if memory.chosen else "none"
    choices = "\n".join(f"- {c.text}" for c in candidates)
    user = (f"Instruction: {memory.instruction}\nObservation: {observation}\nOptions chosen so far: {chosen}\n"
            f"Possible actions:\n{choices}\nAnswer with one action.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class WebShopAgent:
    """Builds token-level prompts and candidates for batched scoring.

    Args:
      tokenizer: a ``tokenizers.Tokenizer`` (``encode(text).ids``).
      style: ``'compact'`` or ``'chat'``.
      chat_template: callable ``messages -> str`` (required for ``'chat'``), e.g. a rendered HF template.
      max_prompt_tokens: longer prompts keep their head and tail (the goal and the question).
      max_candidate_tokens: longer candidate descriptions are cut (keeping their head).
      score_norm: how candidate log-likelihoods are compared: ``'mean'`` per token or ``'sum'``.
    """

    def __init__(self, tokenizer: Any, style: PromptStyle = "compact", chat_template: Any = None,
                 max_prompt_tokens: int = 512, max_candidate_tokens: int = 24, score_norm: str = "mean"):
        if style not in ("compact", "chat"):
            raise ValueError(f"agent style must be 'compact' or 'chat', got {style!r}")
        if style == "chat" and chat_template is None:
            raise ValueError("agent style 'chat' needs the model's chat template")
        self.tokenizer = tokenizer
        self.style = style
        self.chat_template = chat_template
        self.max_prompt_tokens = max_prompt_tokens
        self.max_candidate_tokens = max_candidate_tokens
        if score_norm not in ("mean", "sum"):
            raise ValueError(f"agent score_norm must be 'mean' or 'sum', got {score_norm!r}")
        self.score_norm = score_norm
        # Texts recur (every member of a version plays the same goals, and pages repeat), and a tokenizer call
        # costs ~100 µs: ids are kept by text, least recently used dropped past a bound (a few hundred MB at most).
        self.encode = functools.lru_cache(maxsize=PROMPT_CACHE)(self._tokenize)
        self._candidate_ids = functools.lru_cache(maxsize=CANDIDATE_CACHE)(self._tokenize_candidate)

    def _tokenize(self, text: str) -> list[int]:
        """``text``'s ids (``encode`` is this, cached: the list is shared, do not modify it)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _tokenize_candidate(self, text: str) -> list[int]:
        return self._tokenize(" " + text)[: self.max_candidate_tokens]

    def prompt_text(self, observation: str, available: dict, memory: EpisodeMemory,
                    candidates: Sequence[Candidate]) -> str:
        if self.style == "compact":
            return compact_prompt(observation, available, memory)
        return self.chat_template(chat_messages(observation, available, memory, candidates))

    def encode_prompt(self, text: str) -> list[int]:
        return keep_head_and_tail(self.encode(text), self.max_prompt_tokens)

    def encode_candidate(self, candidate: Candidate) -> list[int]:
        """The candidate's ids (a shared list: do not modify). Cached by its text, which is hashed once, instead
        of building and hashing ``" " + text`` and slicing it again for each of the ~27 candidates of a step."""
        return self._candidate_ids(candidate.text)

    def new_memory(self, instruction: str) -> EpisodeMemory:
        return EpisodeMemory(instruction)

    def remember(self, memory: EpisodeMemory, available: dict, picked: Candidate) -> None:
        memory.record(page_kind(available), picked)

    def step_inputs(self, observation: str, available: dict, memory: EpisodeMemory
                    ) -> tuple[list[int], list[Candidate], list[list[int]]]:
        """Prompt ids, candidates and candidate ids for one waiting episode."""
        candidates = candidates_for(observation, available, memory)
        prompt = self.encode_prompt(self.prompt_text(observation, available, memory, candidates))
        return prompt, candidates, [self.encode_candidate(c) for c in candidates]
