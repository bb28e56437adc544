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

import gzip
import json
import os
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

from esjax.rundir.stats import full_marks

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
             is_success: Callable[[float], bool] = full_marks, **extra: Any) -> dict[str, Any]:
        """The trace line of a finished episode (its snippets are dropped from the recorder); ``success`` is the
        task's rule (``Task.is_success``: BabyAI's won episodes score below 1.0)."""
        seen = self.observations.pop(key, [])
        info = episode.info or {}
        out: dict[str, Any] = {**extra, "goal": int(episode.goal), "instruction": episode.memory.instruction,
                               "reward": float(reward), "success": bool(is_success(float(reward))),
                               "steps": episode.steps,
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
    """The lines of a traces file, plain or gzipped (``.jsonl.gz``: the committed records' form)."""
    path = Path(path)
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def first_and_last_traces(traces_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """The trace lines of the first and the last ``eval-v<version>.jsonl`` (or ``.jsonl.gz``) in a run's traces
    folder, by version."""
    files = {}
    for path in Path(traces_dir).glob("eval-v*.jsonl*"):
        version = path.name.split("-v")[1].split(".")[0]
        if version.isdigit() and path.name.endswith((".jsonl", ".jsonl.gz")):
            files[int(version)] = path
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
