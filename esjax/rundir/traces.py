"""Episode traces: what a greedy evaluation episode did, one JSON line per goal.

A line holds the goal, its instruction, every action with a short snippet (at most :data:`SNIPPET_CHARS`
characters, whitespace collapsed) of the page it led to, the final reward and, when the episode bought
something, WebShop's reward breakdown (``info['reward_info']``: type, attribute, option and price terms) with
the purchased and the goal product. Observation snippets are taken by the caller after every tick
(:meth:`TraceRecorder.observe`), so the rollout engine itself is unchanged.

Written by the trainer for every evaluation of a run (``run.traces: eval`` → ``traces/eval-v<version>.jsonl``)
and by ``python -m esjax.eval --traces FILE``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Any

#: Longest observation snippet kept per step: enough to see which page an action led to and its head.
SNIPPET_CHARS = 200
#: Keys of a buy's ``info`` kept beside the reward breakdown.
PURCHASE_KEYS = ("purchased_asin", "purchased_options", "goal_asin")


def snippet(observation: Any, instruction: str | None = None, limit: int = SNIPPET_CHARS) -> str:
    """The head of an observation, whitespace collapsed, at most ``limit`` characters (``…`` marks a cut).

    WebShop pages open with ``Instruction: [SEP] <instruction> [SEP]``; with ``instruction`` given, that head is
    left out (a trace line carries the instruction once), so the snippet shows the page itself."""
    head = str(observation)[: 4 * limit + 2 * len(instruction or "")]
    text = " ".join(head.split())
    if instruction:
        bare = " ".join(instruction.split())
        at = text.find(bare)
        if 0 <= at <= 40:  # only the page's own heading, not a later mention
            text = text[at + len(bare):].removeprefix(" [SEP]").lstrip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ending(episode: Any, max_steps: int | None) -> str:
    info = episode.info or {}
    if episode.failure is not None:
        return "env_failure"
    if "reward_info" in info:
        return "bought"
    if info.get("truncated"):
        return "env_step_limit"
    if max_steps is not None and episode.steps >= max_steps:
        return "max_steps"
    return "no_action"  # a page with nothing to do


class TraceRecorder:
    """Observation snippets of live episodes, keyed by the caller (e.g. ``(evaluation, position)``)."""

    def __init__(self) -> None:
        self.observations: dict[Hashable, list[str]] = {}

    def observe(self, key: Hashable, episode: Any) -> None:
        """Record the page the episode's latest action led to (call after every tick the episode lived through;
        a re-run episode that starts over replaces what was recorded)."""
        steps = episode.steps
        if steps <= 0:
            self.observations.pop(key, None)
            return
        seen = self.observations.setdefault(key, [])
        del seen[steps - 1:]
        seen.extend([""] * (steps - 1 - len(seen)))  # steps replayed before snippets were kept (old checkpoints)
        seen.append("" if episode.failure is not None else snippet(episode.observation, episode.memory.instruction))

    def forget(self, key: Hashable) -> None:
        self.observations.pop(key, None)

    def line(self, key: Hashable, episode: Any, reward: float, max_steps: int | None = None,
             **extra: Any) -> dict[str, Any]:
        """The trace line of a finished episode (its snippets are dropped from the recorder)."""
        seen = self.observations.pop(key, [])
        info = episode.info or {}
        out: dict[str, Any] = {**extra, "goal": int(episode.goal), "instruction": episode.memory.instruction,
                               "reward": float(reward), "success": float(reward) == 1.0, "steps": episode.steps,
                               "end": _ending(episode, max_steps), "failure": episode.failure,
                               "actions": [[action, seen[i] if i < len(seen) else ""]
                                           for i, (_, action) in enumerate(episode.trace)]}
        if "reward_info" in info:
            out["reward_info"] = info["reward_info"]
            out.update({k: info[k] for k in PURCHASE_KEYS if k in info})
        return out


def write_traces(path: str | Path, lines: Iterable[dict[str, Any]]) -> Path:
    """Write trace lines as JSON lines (atomically: a partial file is never left under ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    return path


def read_traces(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


#: Buttons of WebShop's pages (lower-cased, as in ``click[...]``); any other click is a product or an option value.
_BUTTONS = frozenset({"buy now", "< prev", "back to search", "next >", "description", "features", "reviews",
                      "search"})


def _is_product(target: str) -> bool:
    """A results-page click on a product: WebShop's ASINs are 10 letters or digits (``b07xyz1234``)."""
    return len(target) == 10 and target.isalnum() and any(ch.isdigit() for ch in target)


def action_kind(action: str) -> tuple[str, str]:
    """What a written action is, and its argument (lower-cased for clicks): ``search``, ``buy`` (``click[buy now]``),
    ``button`` (another page button), ``product`` (an ASIN), ``option`` (any other click: an option value) or
    ``malformed``."""
    if action.startswith("search["):
        return "search", action[len("search["):-1] if action.endswith("]") else action[len("search["):]
    if not (action.startswith("click[") and action.endswith("]")):
        return "malformed", action
    target = action[len("click["):-1].lower()
    if target == "buy now":
        return "buy", target
    if target in _BUTTONS:
        return "button", target
    return ("product" if _is_product(target) else "option"), target


def behaviour(lines: Iterable[dict[str, Any]]) -> dict[str, float | None]:
    """What a greedy agent did, from an evaluation's trace lines: per episode, searches, products opened and
    option clicks; option clicks per item page; the share of item pages with at least one option click; buys on
    the first item page; buys, buys without an option click on the item page bought from, and the mean reward of
    buys with and without one; step-cap hits. This is what tells a score change apart: a higher score from
    choosing options shows here as option clicks (and whether the options clicked are the ones the instruction
    names), one from better products as fewer item pages per buy."""
    from envs.webshop_bridge.policies import instruction_words, names_value

    episodes = searches = opened = options = pages_with_option = bought = first_page_buys = capped = steps = 0
    named = 0
    reward_by_option: dict[bool, list[float]] = {True: [], False: []}  # buys, by an option click before the buy
    for line in lines:
        episodes += 1
        words = instruction_words(str(line.get("instruction", "")))
        steps += int(line.get("steps", 0))
        capped += line.get("end") == "max_steps"
        opened_here, opened_at_buy, clicked_option, option_at_buy = 0, 0, False, False
        for action, _ in line.get("actions", []):
            kind, target = action_kind(action)
            if kind == "search":
                searches += 1
            elif kind == "buy":  # in generate mode a "buy now" off an item page is a no-op, not a buy
                opened_at_buy, option_at_buy = opened_here, clicked_option
            elif kind == "product":
                pages_with_option += clicked_option
                opened_here += 1
                opened += 1
                clicked_option = False
            elif kind == "option":
                options += 1
                named += names_value(words, target)  # the option rule's test
                clicked_option = True
        pages_with_option += clicked_option
        if line.get("end") == "bought":
            bought += 1
            first_page_buys += opened_at_buy == 1
            reward_by_option[option_at_buy].append(float(line.get("reward", 0.0)))
    n = max(episodes, 1)
    mean = lambda values: sum(values) / len(values) if values else None  # noqa: E731
    return {"episodes": episodes, "searches_per_episode": searches / n, "item_pages_per_episode": opened / n,
            "option_clicks_per_item_page": options / max(opened, 1),
            "item_pages_with_option_click": pages_with_option / max(opened, 1),
            "option_clicks_named_in_instruction": named / max(options, 1),
            "bought": bought / n, "bought_on_first_item_page": first_page_buys / n,
            "bought_without_option_click": len(reward_by_option[False]) / n,
            "reward_of_buys_with_option_click": mean(reward_by_option[True]),
            "reward_of_buys_without_option_click": mean(reward_by_option[False]),
            "step_cap_hits": capped / n, "steps_per_episode": steps / n}


def first_and_last_traces(traces_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """The trace lines of the first and the last ``eval-v<version>.jsonl`` in a run's traces folder, by version."""
    files = {int(p.stem.split("-v")[1]): p for p in Path(traces_dir).glob("eval-v*.jsonl")
             if p.stem.split("-v")[1].isdigit()}
    if not files:
        return {}
    return {v: read_traces(files[v]) for v in sorted({min(files), max(files)})}


def paired_delta(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, float] | None:
    """Score change between two evaluations on the same goals, with its 95% t interval over the per-goal
    differences (pairing by goal removes the goals' own spread): :func:`esjax.rundir.stats.score_interval` of the reward
    differences. None unless both cover the same goals."""
    from esjax.rundir.stats import score_interval

    a = {line["goal"]: line["reward"] for line in before}
    b = {line["goal"]: line["reward"] for line in after}
    if not a or a.keys() != b.keys():
        return None
    diffs = [b[g] - a[g] for g in sorted(a)]
    low, high = score_interval(diffs) or (float("nan"), float("nan"))
    return {"delta": 100 * sum(diffs) / len(diffs), "low": low, "high": high, "goals": len(diffs),
            "better": sum(d > 0 for d in diffs), "worse": sum(d < 0 for d in diffs)}
