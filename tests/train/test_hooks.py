"""Hooks around the training loop (esjax/train/hooks.py): each point fires when and as often as it says, after the
trainer's own hooks, and a run is the same with or without observers."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import same_bits
from run_settings import tiny_random

from esjax.config import load_config
from esjax.rundir.metrics import untimed
from esjax.train.hooks import Hooks, Tick
from esjax.train.session import train

#: the shapes of test_reliability_numeric's and test_reliability_env's runs (programs compiled once, shared)
SETTINGS = tiny_random(updates=3, eval_every=2, checkpoint_every=2, population=8, eval_goals=2, max_steps=6)


def test_hooks_fire_at_their_points_and_change_nothing(tmp_path):
    plain = train(load_config(None, SETTINGS), run_dir=tmp_path / "plain")
    seen: dict[str, list] = {"tick": [], "version": [], "every2": [], "episode": []}
    hooks = Hooks()
    hooks.on_tick(lambda trainer, tick: seen["tick"].append((tick.number, tick.version, len(tick.finished))))
    hooks.on_version(lambda trainer, record: seen["version"].append((record.version + 1, trainer.version)))
    hooks.on_version(lambda trainer, record: seen["every2"].append(record.version + 1), every=2)

    @hooks.on_version
    def checkpointed_first(trainer, record):  # the trainer's own checkpoint hook ran before this one
        version = record.version + 1
        if version % 2 == 0 or version == 3:
            assert (trainer.run_dir / "checkpoints" / str(version)).is_dir()

    hooks.on_episode_end(lambda trainer, episode: seen["episode"].append((episode.kind, episode.done)))
    watched = train(load_config(None, SETTINGS), run_dir=tmp_path / "watched", hooks=hooks)

    assert untimed(watched.records) == untimed(plain.records) and same_bits(watched.params, plain.params)
    ticks = seen["tick"]
    assert [n for n, _, _ in ticks] == list(range(1, len(ticks) + 1))  # every tick, numbered from 1
    assert sum(f for _, _, f in ticks) == len(seen["episode"])  # every episode that ended, once
    assert [v for _, v, _ in ticks] == sorted(v for _, v, _ in ticks)  # versions only go up
    assert seen["version"] == [(1, 1), (2, 2), (3, 3)]  # once per update, with θ already at the new version
    assert seen["every2"] == [2]
    kinds = Counter(kind for kind, _ in seen["episode"])
    evals = [r for r in watched.records if r["kind"] == "eval"]
    assert kinds["eval"] == 2 * len(evals) and kinds["train"] >= 8 * 3  # 2 goals per evaluation; N per update
    assert all(done for _, done in seen["episode"])


def test_every_must_be_positive():
    hooks = Hooks()
    with pytest.raises(ValueError, match="every"):
        hooks.on_tick(lambda trainer, tick: None, every=0)
    calls = []
    hooks.on_tick(lambda trainer, tick: calls.append(tick.number), every=3)
    for n in range(1, 8):
        hooks.ticked(None, Tick(n, 0, [], None))
    assert calls == [3, 6]
