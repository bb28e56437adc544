"""Hooks around the training loop (Levanter-style callbacks): what runs at the loop's named points besides the
algorithm itself.

Three points, each a list of callables run in the order they were added:

* ``on_tick(trainer, tick)`` — after every live episode has acted once (:class:`Tick`: the episodes that ended and
  what the tick cost), before their members report;
* ``on_version(trainer, record)`` — after an update is applied and θ has its new version ``record.version + 1``
  (once per update, so a cascade of updates in one tick calls it several times);
* ``on_episode_end(trainer, episode)`` — for every episode that ended without an env failure, training or
  evaluation (``episode.kind``), before its member's fitness is rolled up.

The trainer's own collaborators hang on these hooks: evaluations (started at a due version, fed their episodes,
shown the pages their episodes reached), checkpoints (at a due version) and the live progress line. Hooks passed to
:class:`~esjax.train.trainer.Trainer` (or :func:`esjax.train.session.train`) run after those, so a hook sees the
version already evaluated-started and checkpointed. A hook must not change θ or the coordinator: the run stays
bit-identical whatever observes it. Raising ``KeyboardInterrupt`` from a hook stops the run as Ctrl-C does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from esjax.loop.rollout import Episode
    from esjax.loop.types import UpdateRecord

__all__ = ["Hooks", "Tick"]


@dataclasses.dataclass(frozen=True)
class Tick:
    """One tick of the loop, as ``on_tick`` sees it: its number (1 for the first of the run), the version θ was at,
    the episodes that ended in it and its :class:`~esjax.loop.rollout.TickStats` (or generate mode's)."""

    number: int
    version: int
    finished: list[Episode]
    stats: Any


TickHook = Callable[[Any, Tick], None]
VersionHook = Callable[[Any, "UpdateRecord"], None]
EpisodeHook = Callable[[Any, "Episode"], None]


class Hooks:
    """The callables of each hook point. ``hooks.on_tick(fn)`` adds ``fn`` and returns it (usable as a decorator);
    ``every`` (on_tick and on_version) calls it only on ticks / versions divisible by ``every``."""

    def __init__(self) -> None:
        self.tick: list[TickHook] = []
        self.version: list[VersionHook] = []
        self.episode_end: list[EpisodeHook] = []

    def on_tick(self, fn: TickHook, every: int = 1) -> TickHook:
        self.tick.append(fn if every == 1 else _every(fn, every, lambda tick: tick.number))
        return fn

    def on_version(self, fn: VersionHook, every: int = 1) -> VersionHook:
        self.version.append(fn if every == 1 else _every(fn, every, lambda record: record.version + 1))
        return fn

    def on_episode_end(self, fn: EpisodeHook) -> EpisodeHook:
        self.episode_end.append(fn)
        return fn

    def extend(self, other: Hooks | None) -> Hooks:
        """Add every hook of ``other`` after this object's own (None: nothing)."""
        if other is not None:
            self.tick += other.tick
            self.version += other.version
            self.episode_end += other.episode_end
        return self

    def ticked(self, trainer: Any, tick: Tick) -> None:
        _call(self.tick, trainer, tick)

    def versioned(self, trainer: Any, record: UpdateRecord) -> None:
        _call(self.version, trainer, record)

    def episode_ended(self, trainer: Any, episode: Episode) -> None:
        _call(self.episode_end, trainer, episode)


def _call(hooks: Iterable[Callable], trainer: Any, event: Any) -> None:
    for hook in hooks:
        hook(trainer, event)


def _every(fn: Callable, every: int, count: Callable[[Any], int]) -> Callable:
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")

    def sometimes(trainer: Any, event: Any) -> None:
        if count(event) % every == 0:
            fn(trainer, event)
    return sometimes
