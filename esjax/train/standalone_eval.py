"""Standalone greedy evaluation of an unperturbed policy on a fixed goal set (no training run), with continuous
batching.

Shared by ``python -m esjax.eval`` and the embedded policy's scripts; the trainer runs the same greedy
episodes interleaved with training rollouts instead (:mod:`esjax.train.interleaved_eval`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from esjax.es.noise import NoiseSpec
from esjax.loop.protocols import EnvPool, GeneratingAgent, ScoringAgent
from esjax.loop.rollout import RolloutEngine
from esjax.model.config import ModelConfig
from esjax.rundir.stats import eval_intervals, full_marks
from esjax.rundir.traces import TraceRecorder


def evaluate_policy(model_config: ModelConfig, params: Any, agent: ScoringAgent | GeneratingAgent,
                    make_pool: Callable[[int], EnvPool], goals: list[int], max_steps: int, batch: int = 256,
                    traces: bool = False, max_new_tokens: int = 32,
                    engine_cls: type[RolloutEngine] = RolloutEngine,
                    is_success: Callable[[float], bool] = full_marks) -> dict[str, Any]:
    """Score (100 × mean reward), success rate (share of episodes ``is_success`` calls won: by default reward 1.0; a
    task's :meth:`~esjax.task.Task.is_success`), their 95% intervals over goals, and per
    goal: the goal index, reward and success flag, of ``goals`` played in a pool of up to ``batch`` sessions,
    ``make_pool(n)`` (a task's :meth:`esjax.task.Task.pool`; WebShop: ``functools.partial(InProcessEnvPool,
    shop)``). ``traces``: also each episode's trace line (:mod:`esjax.rundir.traces`) under ``"traces"``, in goal
    order. A generating agent writes its actions (generate mode, greedy, replies of up to ``max_new_tokens``
    tokens); its result also has the invalid-action rate and the mean tokens an episode cost (``prompt``: those
    prefilled, ``generated``: those kept in replies). ``seconds``: the evaluation's wall clock. ``engine_cls``:
    the scoring agent's engine, a :class:`RolloutEngine` subclass to change how actions are picked
    (experiments/headroom.py)."""
    pool = make_pool(max(1, min(batch, len(goals))))
    generating = isinstance(agent, GeneratingAgent)
    if generating:
        from esjax.agent.lanes import Sampling
        from esjax.loop.generate_rollout import GenerateEngine

        engine = GenerateEngine(pool, agent, model_config, NoiseSpec(), lambda v: 0.0, max_steps, Sampling(),
                                max_new_tokens, max_prompt_tokens=agent.max_prompt_tokens)
    else:
        engine = engine_cls(pool, agent, model_config, NoiseSpec(), lambda v: 0.0, max_steps, temperature=0.0)
    recorder = TraceRecorder() if traces else None
    lines: list[dict[str, Any] | None] = [None] * len(goals)
    rewards = np.zeros(len(goals))
    actions = invalid = prompt_tokens = generated = 0
    started, start = 0, time.perf_counter()
    while started < len(goals) or engine.live:
        while started < len(goals) and engine.free:
            engine.start("eval", owner=0, version=0, index=0, goal=goals[started], position=started, sampling_seed=0,
                         greedy=True)
            started += 1
        finished, stats = engine.tick(lambda v: params)
        if generating:  # a tick's tokens: the prompts it prefilled and the reply tokens it kept
            prompt_tokens += stats.tokens - stats.generated
            generated += stats.generated
        if recorder is not None:
            for episode in (*engine.live.values(), *finished):
                recorder.observe(episode.position, episode)
        for episode in finished:
            rewards[episode.position] = episode.reward
            actions += len(episode.trace)
            invalid += getattr(episode, "invalid_actions", 0)
            if recorder is not None:
                lines[episode.position] = recorder.line(episode.position, episode, episode.reward, max_steps,
                                                        is_success=is_success, position=episode.position)
    won = [bool(is_success(r)) for r in rewards.tolist()]
    out = {"score": float(100 * rewards.mean()) if len(goals) else 0.0,
           "success_rate": float(np.mean(won)) if len(goals) else 0.0,
           **eval_intervals(rewards.tolist(), is_success), "goals": len(goals),
           "goal_indices": [int(g) for g in goals], "rewards": rewards.tolist(), "success": won,
           "seconds": time.perf_counter() - start}
    if generating:  # written actions can be invalid (the env's no-op); what a written episode costs in tokens
        out["invalid_action_rate"] = invalid / actions if actions else 0.0
        episodes = max(1, len(goals))
        out["tokens_per_episode"] = {"prompt": prompt_tokens / episodes, "generated": generated / episodes}
    if recorder is not None:
        out["traces"] = lines
    return out
