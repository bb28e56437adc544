"""Does one ES gradient estimate point uphill on held-out goals? A line search with a shuffled-weight control.

An ES trial mixes three things: whether the estimated direction is better than a random one, how far to step, and
the noise of the evaluation. This script separates them for a generative policy (or, with ``--config``, a
candidate-scoring one). Per estimate it runs one cohort (``--members`` antithetic rank-1 members, every member
on the same ``--goals`` WebShop train goals), forms the ES direction
``g = Σ w_i ε_i / (N σ)`` from the centered ranks ``w``, and the same sum with the weights shuffled among
the members (a random direction with the same statistics), then scores ``θ + η g`` and ``θ + η g_shuffled`` for
each ``η`` greedily on the first ``--eval-goals`` eval goals, paired with the centre on the same goals.

If the ES direction is no better than the shuffled one, a run at that N, goals per member and σ is a random walk.
Before any step, the cohort itself says whether its ranking can generalize: the split-half reliability is the
correlation, over antithetic pairs, of the pair's fitness difference on the first and on the second half of the
goals (near 0: the members differ only on the goals they happened to draw). ``--etas ''`` measures only that.

    python -m experiments.es_direction_probe --scope norms --sigma 0.1 --etas 0.05,0.1,0.2 --out FILE.jsonl
    # a candidate-scoring policy (score mode) with configs/default.yaml's agent and shop, reliability only:
    python -m experiments.es_direction_probe --config configs/default.yaml --policy FOLDER --sigma 0.05 --etas ''
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from experiments.lib import REPO

#: The scopes tried (``Scope`` kind and include patterns, as in a config's ``es.scope`` / ``es.include``).
SCOPES = {"kernels": ("matrices", (r"/kernel$",)), "norms": ("all", (r"norm/scale$",)),
          "mlp": ("matrices", (r"mlp.*kernel$",)), "attention": ("matrices", (r"attn.*kernel$",)),
          # the tied embedding is also the output head: its rank-1 noise shifts each token's logit by
          # σ a_token (h · b), a per-token preference that may act alike on every goal
          "embedding": ("all", (r"embed/embedding$",)), "final-norm": ("all", (r"final_norm/scale$",))}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policy", default=str(REPO / "esjax/assets/generate_policy"), help="HF folder of the policy")
    p.add_argument("--config", type=Path, default=None,
                   help="a score-mode config (e.g. configs/default.yaml): probe a candidate-scoring policy with that "
                        "config's agent and shop (default: a generative policy, generate mode)")
    p.add_argument("--scope", choices=sorted(SCOPES), default="kernels")
    p.add_argument("--sigma", type=float, default=0.01)
    p.add_argument("--mode", choices=("lowrank", "full"), default="lowrank", help="members' noise (es.mode)")
    p.add_argument("--rank", type=int, default=1, help="rank of low-rank noise (es.rank)")
    p.add_argument("--members", type=int, default=32, help="N (even: antithetic pairs)")
    p.add_argument("--goals", type=int, default=16, help="train goals per member (the same for every member)")
    p.add_argument("--temperature", type=float, default=0.0, help="training replies (0: greedy)")
    p.add_argument("--unperturbed-turns", type=int, default=0,
                   help="first turns of each episode written with the centre's θ by every member")
    p.add_argument("--constrain", choices=("none", "clicks", "all"), default="none",
                   help="clicks: replies on pages without a search bar limited to the page's click actions; all: "
                        "searches also limited to a word prefix of the instruction")
    p.add_argument("--estimates", type=int, default=2, help="independent cohorts (noise version and goals)")
    p.add_argument("--first", type=int, default=1, help="noise version / goal seed of the first estimate")
    p.add_argument("--etas", default="0.0005,0.001,0.002", help="step sizes η (θ + η g); '': reliability only")
    p.add_argument("--eval-goals", type=int, default=200, help="the first N goals of the eval split")
    p.add_argument("--out", type=Path, default=None, help="append one JSON line per estimate here")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp

    from envs.webshop_bridge import InProcessEnvPool, load_webshop
    from esjax.agent.lanes import Sampling
    from esjax.agent.policy import load_policy
    from esjax.es.noise import NoiseSpec, Scope
    from esjax.es.shaping import centered_ranks
    from esjax.es.step import ESConfig, es_gradient
    from esjax.loop.generate_rollout import GenerateEngine
    from experiments.lib.pretrain import (
        CATALOG_SEED,
        DATA,
        MAX_PROMPT_TOKENS,
        MAX_REPLY_TOKENS,
        MAX_STEPS,
        generate_agent,
    )

    policy = load_policy("hf", args.policy)
    etas = [float(x) for x in args.etas.split(",") if x]
    kind, include = SCOPES[args.scope]
    config = ESConfig(noise=NoiseSpec(seed=0, mode=args.mode, rank=args.rank, scope=Scope(kind, include)),
                      sigma=args.sigma, learning_rate=1.0, scale="nes")
    if args.config is None:  # generate mode: the generative policy's agent on the pretraining shop
        agent = generate_agent(policy, constrain=args.constrain)
        shop = load_webshop(DATA, seed=CATALOG_SEED)

        def engine_for(rows: int):
            return GenerateEngine(InProcessEnvPool(shop, rows), agent, policy.config, config.noise,
                                  lambda v: args.sigma, MAX_STEPS, Sampling(args.temperature, 1.0, 0),
                                  MAX_REPLY_TOKENS, 4, max_prompt_tokens=MAX_PROMPT_TOKENS,
                                  unperturbed_turns=args.unperturbed_turns)
    else:  # score mode: the config's candidate-scoring agent and shop; training rows at --temperature
        from esjax.config import load_config
        from esjax.loop.rollout import RolloutEngine
        from esjax.train.parts import build_agent, load_task

        run_config = load_config(args.config)
        task = load_task(run_config.env)
        agent = build_agent(run_config.agent, policy, "hf", task)
        shop = task.data

        def engine_for(rows: int):
            return RolloutEngine(InProcessEnvPool(shop, rows), agent, policy.config, config.noise,
                                 lambda v: args.sigma, run_config.env.max_steps, args.temperature)
    train = list(shop.split("train"))
    evals = list(shop.split("eval"))[:args.eval_goals] if etas else []

    def run(episodes: list[dict], params_at) -> list:
        engine = engine_for(len(episodes))
        for episode in episodes:
            engine.start(**episode)
        done = []
        while engine.live:
            done += engine.tick(params_at)[0]
        return done

    def step(direction, eta):
        return jax.tree_util.tree_map(lambda p, d: p + eta * d, policy.params, direction)

    for estimate in range(args.first, args.first + args.estimates):
        t0 = time.perf_counter()
        rng = np.random.default_rng(estimate)
        goals = [int(g) for g in rng.choice(train, args.goals, replace=False)]
        cohort = [dict(kind="train", owner=m, version=estimate, index=m, goal=g, position=i, sampling_seed=estimate,
                       greedy=args.temperature == 0) for m in range(args.members) for i, g in enumerate(goals)]
        per_goal = np.zeros((args.members, args.goals))
        # what members did per episode (BEHAVIOUR): which of it goes with their fitness differences?
        behaviour = np.zeros((args.members, args.goals, len(BEHAVIOUR)))
        for episode in run(cohort, lambda v: policy.params):
            per_goal[episode.index, episode.position] = episode.reward
            behaviour[episode.index, episode.position] = episode_behaviour(episode.trace)
        fitness = per_goal.mean(axis=1)
        half = args.goals // 2
        halves = [per_goal[:, :half].mean(axis=1), per_goal[:, half:].mean(axis=1)]
        differences = [h[0::2] - h[1::2] for h in halves]
        # undefined (None) when a half's pair differences do not vary, e.g. every pair tied on those goals
        reliability = correlation(*differences)
        weights = centered_ranks(jnp.asarray(fitness), jnp.ones(args.members, bool))
        versions, indices = jnp.full(args.members, estimate), jnp.arange(args.members)
        directions = {"es": es_gradient(config, policy.params, versions, indices, weights),
                      "shuffled": es_gradient(config, policy.params, versions, indices,
                                              weights[rng.permutation(args.members)])}
        leaves = [x for x in jax.tree_util.tree_leaves(directions["es"]) if float(jnp.abs(x).max()) > 0]
        entries = sum(x.size for x in leaves)
        norm = float(jnp.sqrt(sum(jnp.sum(x ** 2) for x in leaves)))
        t1 = time.perf_counter()
        thetas = [policy.params] + [step(directions[name], eta) for name in directions for eta in etas]
        evaluation = [dict(kind="eval", owner=v, version=v, index=0, goal=g, position=i, sampling_seed=0, greedy=True)
                      for v in range(len(thetas)) for i, g in enumerate(evals)]
        reward = np.zeros((len(thetas), max(len(evals), 1)))
        for episode in run(evaluation, thetas.__getitem__) if evals else ():
            reward[episode.version, episode.position] = episode.reward
        pairs = fitness[0::2] - fitness[1::2]
        per_member = behaviour.mean(axis=1)
        behaviour_pairs = per_member[0::2] - per_member[1::2]
        behaviour_record = {name: {"mean": float(per_member[:, k].mean()), "member_std": float(per_member[:, k].std()),
                                   "pair_vs_fitness": correlation(pairs, behaviour_pairs[:, k])}
                            for k, name in enumerate(BEHAVIOUR)}
        record = {"estimate": estimate, "scope": args.scope, "mode": args.mode, "rank": args.rank,
                  "sigma": args.sigma, "members": args.members, "goals": args.goals, "temperature": args.temperature,
                  "eval_goals": len(evals), "unperturbed_turns": args.unperturbed_turns, "constrain": args.constrain,
                  "policy": str(args.policy), "config": None if args.config is None else str(args.config),
                  "split_half_reliability": reliability,
                  "fitness_mean": fitness.mean(), "fitness_std": fitness.std(),
                  "mean_abs_pair_difference": np.abs(pairs).mean(), "behaviour": behaviour_record,
                  "direction_norm": norm, "entries": entries, "centre": 100 * reward[0].mean(),
                  "steps": [], "cohort_s": t1 - t0, "eval_s": time.perf_counter() - t1}
        print(f"estimate {estimate}: fitness {fitness.mean():.3f} ± {fitness.std():.3f}, split-half reliability "
              f"{signed(reliability)}, |g| {norm:.1f} over "
              f"{entries} entries; centre {record['centre']:.2f} on {len(evals)} eval goals "
              f"({record['cohort_s']:.0f} s cohort, {record['eval_s']:.0f} s evaluation)")
        print("  per episode (mean ± member std; r of pair differences with fitness's): " + ", ".join(
            f"{name} {b['mean']:.2f} ± {b['member_std']:.2f} ({signed(b['pair_vs_fitness'])})"
            for name, b in behaviour_record.items()))
        for k, (name, eta) in enumerate((name, eta) for name in directions for eta in etas):
            delta = reward[1 + k] - reward[0]
            row = {"direction": name, "eta": eta, "step_per_entry": eta * norm / np.sqrt(entries),
                   "score": 100 * reward[1 + k].mean(), "delta": 100 * delta.mean(),
                   "delta_se": 100 * delta.std(ddof=1) / np.sqrt(len(delta)), "changed_goals": int(np.sum(delta != 0))}
            record["steps"].append(row)
            print(f"  {name:8s} η {eta:<8g} step/entry {row['step_per_entry']:.4f}: {row['score']:.2f} "
                  f"Δ {row['delta']:+.2f} ± {row['delta_se']:.2f} ({row['changed_goals']} goals changed)", flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as f:
                f.write(json.dumps(record, default=float) + "\n")


#: What :func:`episode_behaviour` counts per episode.
BEHAVIOUR = ("steps", "search_words", "products", "options", "buy_clicks")


def episode_behaviour(trace) -> tuple[int, ...]:
    """An episode's actions counted by kind (:data:`BEHAVIOUR`): steps, words of its first search, product pages
    opened, option clicks and ``buy now`` clicks (kinds as :func:`envs.webshop_bridge.behaviour.action_kind` tells
    them).

    A trace holds (what the policy chose, the env action) per step: a candidate's text in score mode, a reply in
    generate mode; the env action is what is counted (probe records before 7 Dec 2026 counted the first item, which
    gave zeros in score mode)."""
    from envs.webshop_bridge.behaviour import action_kind

    kinds = [action_kind(action) for _, action in trace]
    search = next((arg for kind, arg in kinds if kind == "search"), "")
    counts = [sum(kind == k for kind, _ in kinds) for k in ("product", "option", "buy")]
    return (len(kinds), len(search.split()), *counts)


def signed(r: float | None) -> str:
    return "n/a" if r is None else f"{r:+.2f}"


def correlation(x, y) -> float | None:
    """Pearson r; undefined (None) when either side does not vary, e.g. every pair tied on those goals."""
    return float(np.corrcoef(x, y)[0, 1]) if min(np.std(x), np.std(y)) > 0 else None


if __name__ == "__main__":
    main()
