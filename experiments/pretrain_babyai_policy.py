"""Pretrain the embedded BabyAI policy (``esjax/assets/babyai_policy/``) by behaviour cloning of minigrid's bot.

Recipe (every step is deterministic given ``--seed``):

1. Play the first ``--demo-goals`` **train** goals of the bridge's default level mix (GoToLocal, PickupLoc,
   PutNextLocal, GoTo; ``envs.babyai_bridge.DEFAULT_MIX``; goal g of train is minigrid seed g) with minigrid's
   ``BabyAIBot`` through the bridge (:class:`~envs.babyai_bridge.env.BabyAITextEnv`). Every step is recorded in
   exactly the agent's format (:class:`~envs.babyai_bridge.agent.BabyAIAgent`: the observation text, the last
   actions, the six candidate phrases) with the bot's action as the target. With probability ``--noise`` a step
   *executes* a random turn or step forward instead (the bot's action stays the label; the bot replans from where
   that leaves it): the demonstrations then show how to recover from the mistakes a cloned policy makes (DART).
2. Tokenize with the word-level tokenizer over the bridge's closed vocabulary
   (:mod:`envs.babyai_bridge.tokenizer`, which says why not BPE).
3. Initialize a small Qwen2-architecture decoder (``MODEL``) and train it with AdamW on the candidate
   cross-entropy: softmax over the six candidates' **mean per-token** log-likelihoods given the prompt, the
   differentiable form of the score the rollout engine uses (``experiments/lib/pretrain.py``, shared with the
   WebShop policy's recipe), for a fixed ``--steps`` budget.
4. Evaluate greedily on the first ``--eval-goals`` **test** goals through the real rollout engine
   (``esjax.loop.rollout.RolloutEngine`` with ``BabyAIEnvPool`` and the agent, temperature 0: the scoring code a
   training run uses), and minigrid's bot on the same goals.
5. Write the HF folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json, README.md with the
   recipe and the scores) and ``experiments/results/babyai_policy.md``.

Run: ``python -m experiments.pretrain_babyai_policy`` (one command; minutes on a 2-core CPU); ``--quick`` is a
seconds-long version for tests (no evaluation, no README); ``--out DIR`` writes elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.lib import REPO, RESULTS
from experiments.lib.pretrain import encode_steps, params_digest, round_up, train, write_folder

DEFAULT_OUT = REPO / "esjax" / "assets" / "babyai_policy"
RESULTS_FILE = RESULTS / "babyai_policy.md"

#: The policy's architecture: the WebShop default policy's (Qwen2, 2 layers, hidden 64, GQA, tied embeddings) over the
#: word-level vocabulary (83 tokens, the table padded to 128 rows).
MODEL = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "hidden_act": "silu", "bos_token_id": None, "eos_token_id": 1, "pad_token_id": 0, "torch_dtype": "float32",
}

#: The architecture flags and the :data:`MODEL` keys they set (their defaults are MODEL's own values).
ARCH_FLAGS = {"hidden": "hidden_size", "layers": "num_hidden_layers", "mlp": "intermediate_size"}


def model_of(**sizes: int) -> dict:
    """:data:`MODEL` at another width and depth (``--hidden``, ``--layers``, ``--mlp``): the 2-layer, hidden-64
    policy's action accuracy stops at 0.71 on demonstrations whose prompts are nearly all distinct, so capacity is
    the first suspect (experiments/results/babyai_policy.md)."""
    return {**MODEL, **{ARCH_FLAGS[flag]: value for flag, value in sizes.items()}}


#: The agent's settings the policy is trained for (the prompt lists this many recent actions).
MEMORY_ACTIONS = 3

#: The rollout's step cap: above every level's own ``max_steps`` (GoTo's 576), so minigrid ends each episode.
MAX_STEPS = 1024


# ---------------------------------------------------------------------------------------------------------
# Demonstrations
# ---------------------------------------------------------------------------------------------------------


def demonstrations(agent, goals, noise: float, seed: int, split: str = "train"):
    """``(prompt_text, candidate_texts, target)`` of every step of the bot on ``goals`` of ``split``, and stats.

    With probability ``noise`` a step executes a random turn or forward move instead of the bot's action (the
    recorded target is still the bot's).
    """
    from minigrid.utils.baby_ai_bot import BabyAIBot

    from envs.babyai_bridge import ACTION_TEXTS, BabyAITextEnv
    from envs.babyai_bridge.agent import Candidate

    env = BabyAITextEnv(split)
    rng = np.random.default_rng([seed, 41])
    steps, successes, errors, skipped = [], 0, 0, 0
    per_level: dict[str, int] = {}
    for goal in goals:
        observation, info = env.reset(goal)
        per_level[info["level"]] = per_level.get(info["level"], 0) + 1
        bot = BabyAIBot(env.env)
        memory = agent.new_memory(env.instruction)
        taken, done, success = None, False, False
        while not done:
            try:
                action = int(bot.replan(taken))
            except Exception:  # noqa: BLE001 - the bot can fail after a noisy step; the episode ends there
                errors += 1
                break
            if action >= len(ACTION_TEXTS):  # the bot's "done": not an action of the bridge
                skipped += 1
                break
            available = env.available_actions()
            prompt, candidates = agent.step_texts(observation, available, memory)
            steps.append((prompt, candidates, candidates.index(ACTION_TEXTS[action])))
            taken = action if rng.random() >= noise else int(rng.integers(3))  # left, right or forward
            agent.remember(memory, available, Candidate(ACTION_TEXTS[taken], ACTION_TEXTS[taken]))
            observation, _, done, info = env.step(ACTION_TEXTS[taken])
            success = info["success"]
        successes += success
    return steps, {"episodes": len(goals), "successes": successes, "bot_errors": errors, "bot_done": skipped,
                   "levels": per_level}


def prompt_group(agent, step) -> str:
    """Padding group of a step: its prompt length rounded up to 48 tokens (all have the same six candidates), so
    training compiles four programs (prompts of up to ``BabyAIAgent.max_prompt_tokens``, 192)."""
    return f"p{round_up(len(agent.encode_prompt(step[0])), 48):04d}"


# ---------------------------------------------------------------------------------------------------------
# Evaluation: the rollout engine (greedy), and the bot, on the same goals
# ---------------------------------------------------------------------------------------------------------


def evaluate_policy(config, params, agent, split: str, goals: list[int], rows: int = 128,
                    max_steps: int = MAX_STEPS) -> list[dict[str, Any]]:
    """Greedy episodes of the policy on ``goals`` of ``split`` through ``RolloutEngine`` (as a training run's
    evaluation plays them): per goal, its level, reward, success and steps (``max_steps`` caps an episode below
    the level's own limit: tests)."""
    from envs.babyai_bridge import DEFAULT_MIX, BabyAIEnvPool
    from esjax.es.noise import NoiseSpec
    from esjax.loop.rollout import RolloutEngine

    pool = BabyAIEnvPool(max(1, min(rows, len(goals))), split)
    engine = RolloutEngine(pool, agent, config, NoiseSpec(), lambda v: 0.0, max_steps, temperature=0.0)
    out: list[dict[str, Any] | None] = [None] * len(goals)
    started = 0
    while started < len(goals) or engine.live:
        while started < len(goals) and engine.free:
            engine.start("eval", owner=0, version=0, index=0, goal=goals[started], position=started,
                         sampling_seed=0, greedy=True)
            started += 1
        finished, _ = engine.tick(lambda v: params)
        for e in finished:
            out[e.position] = {"goal": e.goal, "level": DEFAULT_MIX.level_of(split, e.goal), "reward": e.reward,
                               "success": bool(e.info.get("success", False)), "steps": e.steps}
    return out


def evaluate_bot(split: str, goals: list[int]) -> list[dict[str, Any]]:
    """minigrid's bot on the same goals (its own env per level)."""
    from envs.babyai_bridge import DEFAULT_MIX, make_level, seed_of
    from envs.babyai_bridge.bot import bot_episode

    envs: dict[str, Any] = {}
    out = []
    for g in goals:
        level = DEFAULT_MIX.level_of(split, g)
        env = envs.setdefault(level, make_level(level))
        ep = bot_episode(level, seed_of(split, g), env)
        out.append({"goal": g, "level": level, "reward": ep.reward, "success": ep.success, "steps": len(ep.actions)})
    return out


def summary(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Success rate, mean reward and mean steps, over all episodes and per level."""
    def one(eps):
        return {"episodes": len(eps), **{k: float(np.mean([e[k] for e in eps])) for k in ("success", "reward",
                                                                                              "steps")}}

    levels = sorted({e["level"] for e in episodes})
    return {"all": one(episodes), **{lv: one([e for e in episodes if e["level"] == lv]) for lv in levels}}


# ---------------------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------------------


def command_line(a: dict) -> str:
    return (f"python -m experiments.pretrain_babyai_policy --seed {a['seed']} --demo-goals {a['demo_goals']} "
            f"--noise {a['noise']} --steps {a['steps']} --lr {a['lr']} --batch {a['batch']} "
            f"--eval-goals {a['eval_goals']}"
            + "".join(f" --{flag} {a[flag]}" for flag, key in ARCH_FLAGS.items()  # only the changed ones
                      if a.get(flag, MODEL[key]) != MODEL[key]))


def score_table(report: dict) -> list[str]:
    pol, bot = report["policy"], report["bot"]
    lines = ["| level | episodes | policy success | policy reward | policy steps | bot success | bot reward | "
             "bot steps |", "|---|---|---|---|---|---|---|---|"]
    for level in ["all", *sorted(k for k in pol if k != "all")]:
        p, b = pol[level], bot[level]
        name = "**all (the mix)**" if level == "all" else level
        lines.append(f"| {name} | {p['episodes']} | {100 * p['success']:.1f}% | {p['reward']:.3f} | {p['steps']:.1f} | "
                     f"{100 * b['success']:.1f}% | {b['reward']:.3f} | {b['steps']:.1f} |")
    return lines


def recipe_lines(report: dict) -> list[str]:
    a, d = report["args"], report["demos"]
    levels = ", ".join(f"{k} {v}" for k, v in sorted(d["levels"].items()))
    return [
        f"- Demonstrations: minigrid's BabyAIBot on the first {a['demo_goals']} **train** goals of the default mix "
        f"({levels} episodes), through the bridge, recorded in the agent's format; with probability {a['noise']} a "
        "step executed a random turn or forward move instead of the bot's action (the label stays the bot's; DART). "
        f"{d['steps']} steps; bot successes {d['successes']}/{d['episodes']} (bot errors after a noisy step: "
        f"{d['bot_errors']}); {d['seconds']:.0f} s.",
        "- Loss: cross-entropy of the bot's action under softmax over the six candidates' mean per-token "
        f"log-likelihoods given the prompt; AdamW lr {a['lr']} (warm-up, cosine decay to a tenth), weight decay "
        f"{a['weight_decay']}, batch {a['batch']}, {a['steps']} steps (about {report['train']['epochs']:.1f} epochs), "
        f"seed {a['seed']}; final loss {report['train']['final_loss']:.3f}, action accuracy "
        f"{report['train']['final_acc']:.3f} (last 50 steps); {report['train']['seconds']:.0f} s.",
        f"- Evaluation: the first {a['eval_goals']} **test** goals (seeds 1.1·10^9 + g, levels drawn by the mix), "
        "greedy (argmax of the candidates' scores) through `esjax.loop.rollout.RolloutEngine` with "
        "`BabyAIEnvPool` and `BabyAIAgent` (the scoring code of a training run), each episode until minigrid ends "
        f"it (success or the level's max_steps); the bot on the same goals. {report['eval_seconds']:.0f} s.",
        f"- Run time: {report['total_seconds']:.0f} s in all, on {report['machine']} (load average at the start "
        f"{report['load_start']}, at the end {report['load']}).",
    ]


def write_readme(out: Path, report: dict) -> None:
    a = report["args"]
    model = model_of(**{flag: a[flag] for flag in ARCH_FLAGS if flag in a})
    lines = [
        "# The embedded BabyAI policy",
        "",
        "A small Qwen2-architecture decoder that plays BabyAI (the bridge's default level mix: GoToLocal, PickupLoc,",
        "PutNextLocal, GoTo) by scoring the six candidate actions (`envs/babyai_bridge/agent.py`), trained from",
        "scratch by behaviour cloning of minigrid's BabyAI bot on train instances with",
        "`experiments/pretrain_babyai_policy.py`. Load it with `model.embedded: babyai`",
        "(`esjax.agent.policy.load_policy('embedded', embedded='babyai')`). Greedy, it succeeds in "
        f"{100 * report['policy']['all']['success']:.1f}% of the test episodes below, the bot in "
        f"{100 * report['bot']['all']['success']:.1f}%.",
        "",
        "Regenerate (bit-identical on the same CPU / jax build):",
        "",
        "```",
        command_line(a),
        "```",
        "",
        "## Model",
        "",
        f"- Qwen2 architecture: hidden {model['hidden_size']}, {model['num_hidden_layers']} layers, "
        f"{model['num_attention_heads']} heads ({model['num_key_value_heads']} KV heads), MLP "
        f"{model['intermediate_size']}, tied embeddings, vocabulary {model['vocab_size']} rows for the "
        f"{report['tokens']}-token word-level tokenizer (`envs/babyai_bridge/tokenizer.py`); float32.",
        f"- {report['param_count']:,} parameters; folder size {report['folder_bytes'] / 1e6:.2f} MB.",
        f"- Weights digest (sha256 of the leaves, first 16 hex): `{report['digest']}`.",
        f"- Agent settings it was trained for: `BabyAIAgent(tokenizer, memory_actions={MEMORY_ACTIONS})` (the "
        "observation text, the last three actions, `Action:`), candidates compared by mean per-token "
        "log-likelihood (`score_norm: mean`).",
        "",
        "## Recipe",
        "",
        *recipe_lines(report),
        "",
        f"## Greedy scores on {a['eval_goals']} test goals (reward: minigrid's, 1 − 0.9·steps/max_steps on success)",
        "",
        *score_table(report),
        "",
        "## Reproducibility",
        "",
        "Everything is seeded (demonstration noise, data order, initialization) and the tokenizer's vocabulary is",
        "fixed, so re-running the command on the same machine and jax version reproduces these weights bit for bit",
        "(`tests/babyai_bridge/test_babyai_policy.py` checks it on a `--quick` run). On another CPU or jax version",
        "float rounding can differ; the scores then agree within noise.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def write_results(path: Path, report: dict) -> None:
    a = report["args"]
    lines = [
        "# The embedded BabyAI policy: test scores against the bot",
        "",
        f"Generated by `{command_line(a)}` (issue 55, item 3): the policy in `esjax/assets/babyai_policy/`, "
        "behaviour-cloned from minigrid's bot on train instances of the default mix (its README has the recipe).",
        "",
        *recipe_lines(report),
        "",
        *score_table(report),
        "",
        "Success = minigrid's `terminated` with a positive reward; reward is BabyAI's (0 on failure); steps are env",
        "steps per episode (a failed episode runs to the level's max_steps: 64 for GoToLocal and PickupLoc, 128 for",
        "PutNextLocal, 576 for GoTo).",
        "",
    ]
    path.write_text("\n".join(lines))


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--results", type=Path, default=RESULTS_FILE, help="the results page (written unless --quick)")
    p.add_argument("--demo-goals", type=int, default=1000, help="train goals the bot plays")
    p.add_argument("--noise", type=float, default=0.2, help="share of demonstration steps that execute a random move")
    p.add_argument("--steps", type=int, default=4000, help="optimizer steps")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--eval-goals", type=int, default=200, help="test goals of the greedy evaluation")
    p.add_argument("--quick", action="store_true", help="a seconds-long run (tests): few goals and steps, no eval")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--hidden", type=int, default=MODEL["hidden_size"], help="model width (hidden size)")
    p.add_argument("--layers", type=int, default=MODEL["num_hidden_layers"], help="decoder layers")
    p.add_argument("--mlp", type=int, default=MODEL["intermediate_size"], help="MLP intermediate size")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.demo_goals, args.steps, args.batch, args.eval_goals = 8, 2, 8, 0
    t0 = time.perf_counter()
    load_start = " ".join(f"{x:.1f}" for x in os.getloadavg())
    import jax

    from envs.babyai_bridge.agent import BabyAIAgent
    from envs.babyai_bridge.tokenizer import build_tokenizer, vocabulary
    from esjax.model.config import from_hf_dict
    from esjax.model.params import init_params, param_count

    tokenizer = build_tokenizer()
    agent = BabyAIAgent(tokenizer, memory_actions=MEMORY_ACTIONS)
    steps, demos = demonstrations(agent, list(range(args.demo_goals)), args.noise, args.seed)
    demos.update(steps=len(steps), seconds=time.perf_counter() - t0)
    unknown = sum(agent.encode_prompt(p).count(2) for p, _, _ in steps)
    if unknown:
        raise RuntimeError(f"{unknown} demonstration words are outside the tokenizer's vocabulary")
    data = encode_steps(agent, steps, group=prompt_group, candidate_round=2)
    print(f"{len(steps)} demonstration steps from {args.demo_goals} goals ({demos['successes']} bot successes); "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    model = model_of(**{flag: getattr(args, flag) for flag in ARCH_FLAGS})
    config = from_hf_dict(model, "MODEL")
    params = init_params(config, jax.random.key(args.seed))
    t_train = time.perf_counter()
    params, losses, accs = train(config, params, data, args.steps, args.lr, args, "train")
    training = {"epochs": args.steps * args.batch / len(steps), "final_loss": float(np.mean(losses[-50:])),
                "final_acc": float(np.mean(accs[-50:])), "seconds": time.perf_counter() - t_train}
    write_folder(args.out, config, params, tokenizer, model)
    report: dict[str, Any] = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tokens": len(vocabulary()), "param_count": param_count(params), "digest": params_digest(params),
        "demos": demos, "train": training,
        "folder_bytes": sum(f.stat().st_size for f in args.out.iterdir() if f.is_file()),
        "machine": f"{platform.machine()} x{os.cpu_count()} CPU, jax {jax.__version__}", "load_start": load_start,
    }
    if args.eval_goals:
        t_eval = time.perf_counter()
        goals = list(range(args.eval_goals))
        policy_eps = evaluate_policy(config, params, agent, "test", goals)
        report["policy"] = summary(policy_eps)
        print(f"policy on {len(goals)} test goals: {json.dumps(report['policy']['all'])}", flush=True)
        report["bot"] = summary(evaluate_bot("test", goals))
        report["eval_seconds"] = time.perf_counter() - t_eval
    report["total_seconds"] = time.perf_counter() - t0
    report["load"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    if not args.quick:
        write_readme(args.out, report)
        if args.eval_goals:
            write_results(args.results, report)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
