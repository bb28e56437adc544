"""The WebShop agent of generate mode: the model writes each action as free text.

Each turn the prompt (the model's chat template when it has one, else a plain ``system:`` / ``user:`` /
``assistant:`` rendering) holds the instruction, the last few actions, feedback on an invalid previous action,
WebShop's text observation and its available actions (``search[<query>]`` when the page has a search bar, one
``click[...]`` per clickable). The model answers with one action in WebShop's grammar — or, with
``reasoning=True``, a one-line ``Thought:`` and then ``Action: ...`` (ReAct style). The engine stops a turn at an
end-of-sequence token, once the text holds a complete action, or after ``max_new_tokens``.

:meth:`GenerateAgent.parse` extracts the first ``search[...]`` / ``click[...]`` of the text (case-insensitive
names, canonical lower-case output). Text without one is sent to the env as it is (its first line): WebShop's
env treats anything it cannot parse, and any click on something not clickable, as a no-op (reward 0, page
unchanged, ``info['valid'] = False``); the next prompt then carries a feedback line and the engine counts the
invalid action.

**Constrained decoding** (``constrain``): :meth:`GenerateAgent.reply_choices` gives the token ids of every reply
a turn may write and the decode lanes keep, at each token, only those that continue one of them (the model still
writes the reply token by token from its own distribution). ``'clicks'``: on a page without a search bar the reply
is one of the page's click actions, so no click is invalid; searches stay free text. ``'all'``: also a search
copies the instruction: ``search[...]`` holds a word prefix of the instruction, from its start or from after a
leading "Find me" (the model decides where the query ends), so no search is garbled.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from esjax.agent.automaton import ActionAutomaton
from esjax.agent.pieces import AsciiPieces
from esjax.agent.tokenizer import keep_head_and_tail

ACTION = re.compile(r"\b(search|click)\[([^\[\]\n]*)\]", re.IGNORECASE)
ACTION_NAMES = (b"search", b"click")  # ACTION's names, for its automaton over token ids

SYSTEM_PROMPT = ("You are a shopping agent on WebShop. Read the instruction and the page, then act with exactly "
                 "one action: search[<query>] on a page with a search bar, or click[<item>] with an item from "
                 "the available actions.")

#: Longest stretch of an unparsable reply sent to the env (and kept in the trace).
MAX_RAW_ACTION_CHARS = 200

#: Rendered prompts whose ids are kept (least recently used dropped).
PROMPT_CACHE = 4_096


@dataclasses.dataclass
class GenMemory:
    """What the agent keeps within one episode: the goal, the actions taken and feedback on the last one."""

    instruction: str
    actions: list[str] = dataclasses.field(default_factory=list)
    feedback: str | None = None


def available_lines(available: Mapping[str, Any]) -> list[str]:
    """The actions a page allows, in WebShop's grammar."""
    out = ["search[<query>]"] if available.get("has_search_bar") else []
    out += [f"click[{c}]" for c in available.get("clickables", []) if c != "search"]
    return out


class GenerateAgent:
    """Prompts, action parsing and episode memory for generate mode (a ``GeneratingAgent``).

    Args:
      tokenizer: a ``tokenizers.Tokenizer`` (``encode(text).ids``, ``decode(ids)``, ``get_vocab()``).
      chat_template: callable ``messages -> str`` (e.g. ``LoadedPolicy.chat_renderer()``); None: plain rendering.
      stop_token_ids: tokens that end a turn (the model's end-of-sequence ids).
      max_prompt_tokens: longer prompts keep their head and tail (instruction, and the question).
      reasoning: ask for ``Thought: ...`` then ``Action: ...`` instead of the action alone.
      history: how many of the episode's previous actions the prompt lists.
      constrain: ``'none'``; ``'clicks'``: replies on pages without a search bar are limited to the page's click
        actions; ``'all'``: searches are also limited to copying a prefix of the instruction (module docstring).
    """

    def __init__(self, tokenizer: Any, chat_template: Callable[[Sequence[Mapping[str, str]]], str] | None = None,
                 stop_token_ids: Sequence[int] = (), max_prompt_tokens: int = 1024, reasoning: bool = False,
                 history: int = 4, constrain: str = "none"):
        if constrain not in ("none", "clicks", "all"):
            raise ValueError(f"generate agent: constrain must be 'none', 'clicks' or 'all', got {constrain!r}")
        if constrain != "none" and reasoning:
            raise ValueError("generate agent: constrained replies hold the action alone; they cannot be combined "
                             "with reasoning (a 'Thought:' line first)")
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.max_prompt_tokens = max_prompt_tokens
        self.reasoning = reasoning
        self.history = history
        self.constrain = constrain
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        #: tokens whose text holds a ']' (only after one can a reply hold a complete action)
        self.closing_ids = frozenset(int(i) for tok, i in vocab.items() if "]" in tok)
        # Prompts recur (a version's members play the same goals: their first turns, and later ones where they
        # acted alike) and tokenising a ~2,000-character chat prompt costs ~1 ms: ids kept by text, least
        # recently used dropped (a prompt of 384 ids is ~15 kB, so at most ~60 MB)
        self.encode_prompt = functools.lru_cache(maxsize=PROMPT_CACHE)(self._encode_prompt)
        self._reply_ids = functools.lru_cache(maxsize=PROMPT_CACHE)(self._encode_reply)
        self._search_ids = functools.lru_cache(maxsize=PROMPT_CACHE)(self._encode_searches)

    # -------------------------------------------------------------------------------------------- prompts
    def messages(self, observation: str, available: Mapping[str, Any], memory: GenMemory) -> list[dict[str, str]]:
        lines = [f"Instruction: {memory.instruction}"]
        if memory.actions:
            recent = memory.actions[-self.history:] if self.history else []
            lines.append(f"Actions so far ({len(memory.actions)}): " + " ; ".join(recent))
        if memory.feedback:
            lines.append(memory.feedback)
        lines.append(f"Observation: {observation}")
        lines.append("Available actions: " + ", ".join(available_lines(available)))
        if self.reasoning:
            lines.append("Reply with one line 'Thought: <why>' and then one line 'Action: <action>'.")
        else:
            lines.append("Reply with the next action only.")
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]

    def prompt_text(self, observation: str, available: Mapping[str, Any], memory: GenMemory) -> str:
        messages = self.messages(observation, available, memory)
        if self.chat_template is not None:
            return self.chat_template(messages)
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"

    def prompt_ids(self, observation: str, available: Mapping[str, Any], memory: GenMemory) -> list[int]:
        """The turn's prompt ids (a shared list: do not modify)."""
        return self.encode_prompt(self.prompt_text(observation, available, memory))

    def _encode_prompt(self, text: str) -> list[int]:
        """A rendered prompt's ids within ``max_prompt_tokens`` (head and tail kept); ``encode_prompt`` is this,
        cached by text."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return keep_head_and_tail(ids, self.max_prompt_tokens)

    # -------------------------------------------------------------------------------------------- replies
    def reply_choices(self, available: Mapping[str, Any], memory: GenMemory) -> list[tuple[int, ...]] | None:
        """The token ids of every reply a constrained turn on this page may write, or None (a free turn). Each
        action comes as ``action`` and as `` action``: a model trained on replies after a space (the embedded
        policy) and one that starts at once both find theirs."""
        if self.constrain == "none":
            return None
        if available.get("has_search_bar"):
            return list(self._search_ids(memory.instruction)) if self.constrain == "all" else None
        return [ids for c in available.get("clickables", []) if c != "search" for ids in self._reply_ids(c)] or None

    def _encode_reply(self, clickable: str) -> tuple[tuple[int, ...], ...]:
        return self._both_forms(f"click[{clickable}]")

    def _encode_searches(self, instruction: str) -> tuple[tuple[int, ...], ...]:
        """Every ``search[<word prefix of the instruction>]``, from its first word or from after "Find me"."""
        words = instruction.split()
        starts = [0] + ([2] if [w.lower() for w in words[:2]] == ["find", "me"] and len(words) > 2 else [])
        return tuple(ids for start in starts for end in range(start + 1, len(words) + 1)
                     for ids in self._both_forms(f"search[{' '.join(words[start:end])}]"))

    def _both_forms(self, action: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        encode = lambda text: tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return encode(action), encode(" " + action)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in ids if int(t) not in self.stop_token_ids])

    def complete(self, text: str) -> bool:
        """Whether a reply holds a complete action (the turn can stop)."""
        return ACTION.search(text) is not None

    def action_lengths(self, replies: Sequence[Sequence[int]], checked: Sequence[int]) -> np.ndarray:
        """For each reply (token ids, a turn so far): the length of its shortest prefix that is longer than
        ``checked[r]`` tokens, ends at a closing token and holds a complete action; 0 when none does:
        ``complete(decode(prefix))`` tested at each closing token after ``checked``.

        The engine asks it only for the replies :attr:`automaton` can't read (a token that is not ASCII, or a
        tokenizer that is not byte-level); the automaton answers the others as it decodes."""
        return np.array([self._action_length(list(ids), int(c)) for ids, c in zip(replies, checked)], np.intp)

    def _action_length(self, ids: Sequence[int], start: int) -> int:
        """:meth:`action_lengths` of one reply, as specified: a ``decode`` and a search per closing token."""
        for n in range(start + 1, len(ids) + 1):
            if ids[n - 1] in self.closing_ids and self.complete(self.decode(ids[:n])):
                return n
        return 0

    @functools.cached_property
    def automaton(self) -> ActionAutomaton:
        """:data:`ACTION` as an automaton over token ids (the decode path's turn-end test)."""
        return ActionAutomaton.of(self._pieces, ACTION_NAMES, self.tokenizer.get_vocab_size(with_added_tokens=True))

    @functools.cached_property
    def _pieces(self) -> AsciiPieces | None:
        return AsciiPieces.of(self.tokenizer, self.stop_token_ids)

    def parse(self, text: str) -> tuple[str, str, bool]:
        """``(reply kept, action for the env, parsed)``: the reply up to its first action and that action in
        canonical form, or the reply's first line as it is (the env's no-op) when it holds none."""
        match = ACTION.search(text)
        if match is None:
            raw = text.strip().split("\n", 1)[0][:MAX_RAW_ACTION_CHARS]
            return text.strip()[: 4 * MAX_RAW_ACTION_CHARS], raw, False
        # The argument is kept as written, spaces included: WebShop searches for ``' '`` on ``search[ ]`` and
        # refuses ``click[ buy now ]`` (``' buy now '`` is not a clickable); stripping would change both.
        name, arg = match.group(1).lower(), match.group(2)
        return text[: match.end()].strip(), f"{name}[{arg}]", True

    # -------------------------------------------------------------------------------------------- memory
    def new_memory(self, instruction: str) -> GenMemory:
        return GenMemory(instruction)

    def remember(self, memory: GenMemory, reply: str, action: str, info: Mapping[str, Any]) -> None:
        """After ``action`` (from ``reply``) was stepped and the env answered with ``info``."""
        memory.actions.append(action if action else "(empty reply)")
        if info.get("valid", True):
            memory.feedback = None
        else:
            reason = info.get("invalid_reason") or "not a valid action"
            memory.feedback = (f"Your last action {action[:80]!r} was invalid ({reason}); nothing happened. "
                               "Choose one of the available actions.")
