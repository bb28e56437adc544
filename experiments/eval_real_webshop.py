"""The baselines table on WebShop's real held-out goals: reference policies, the shipped policy, ES-tuned runs.

Every row is measured on the same goals (default: the 500 test goals of the packaged real 1,000-product set,
WebShop's seed-233 order) with the same step cap (15, as ReAct and verl-agent):

- random clicking (``RandomPolicy``: searches the instruction, then clicks uniformly at random);
- rule "first hit, buy" and rule "first hit + every option value the instruction names, buy"
  (``FirstHitPolicy``);
- WebShop's oracle (knows the target product);
- the shipped embedded policy (or ``--model HF_DIR``), greedy, as the trainer evaluates it;
- with ``--runs DIR ...``: each ES run's first and last evaluation (read from its metrics.jsonl; the run must
  have evaluated the same goals), and the paired before → after difference over the runs.

    python -m experiments.eval_real_webshop --runs runs/default-s0 runs/default-s1 runs/default-s2 \\
        --markdown experiments/results/webshop_baselines.md
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

from esjax.rundir.stats import mean_interval


def run_label(run_dir: Path) -> str:
    """``cell/seed @ commit``: which run and which code (from its run.json), so a regenerated table needs no
    hand-written note saying what its ES rows were measured with."""
    from esjax.rundir.directory import read_run_info

    commit = (read_run_info(run_dir) or {}).get("git_commit") or "?"
    return f"{run_dir.parent.name}/{run_dir.name} @ {commit[:7]}"


def run_evals(run_dir: Path) -> tuple[dict, dict]:
    """(first, last) evaluation records of a run directory."""
    from esjax.rundir.metrics import read_metrics

    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
    if not evals:
        raise SystemExit(f"{run_dir}: no evaluation records in metrics.jsonl")
    return min(evals, key=lambda r: r["version"]), max(evals, key=lambda r: r["version"])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="webshop_small", help="packaged set name or WebShop data folder")
    p.add_argument("--model", type=Path, default=None, help="HF folder (default: the embedded policy)")
    p.add_argument("--split", default="test", choices=["test", "eval", "train"])
    p.add_argument("--goals", type=int, default=None, help="first N goals of the split (default: all)")
    p.add_argument("--max-steps", type=int, default=15, help="episode step cap (configs/default.yaml uses 15)")
    p.add_argument("--seed", type=int, default=0, help="random baseline's seed")
    p.add_argument("--runs", type=Path, nargs="*", default=[], help="ES run directories to add")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    p.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)

    from envs.webshop_bridge import FirstHitPolicy, InProcessEnvPool, OraclePolicy, RandomPolicy, evaluate, load_webshop
    from esjax.agent.policy import load_policy
    from esjax.agent.webshop import WebShopAgent
    from esjax.rundir.machine import machine_info
    from esjax.train.standalone_eval import evaluate_policy

    shop = load_webshop(args.data)
    goals = list(shop.split(args.split))[: args.goals]
    rows = []
    for name, make in [("random clicking", lambda: RandomPolicy(args.seed)),
                       ("rule: first hit, buy", lambda: FirstHitPolicy(options=False)),
                       ("rule: first hit + options named in the instruction, buy", lambda: FirstHitPolicy(True)),
                       ("oracle (knows the target product)", OraclePolicy)]:
        res, _ = evaluate(shop, make, goals, max_steps=args.max_steps)
        rows.append({"policy": name, "score": res.score, "success_rate": res.success_rate})
    policy = load_policy("embedded") if args.model is None else load_policy("hf", str(args.model))
    agent = WebShopAgent(policy.tokenizer, "compact")
    t0 = time.perf_counter()
    res = evaluate_policy(policy.config, policy.params, agent, functools.partial(InProcessEnvPool, shop), goals,
                          args.max_steps)
    name = "shipped policy (greedy)" if args.model is None else f"{args.model} (greedy)"
    rows.append({"policy": name, "score": res["score"], "success_rate": res["success_rate"],
                 "seconds": time.perf_counter() - t0})
    deltas = []
    for run in args.runs:
        first, last = run_evals(run)
        if first["goals"] != len(goals):
            raise SystemExit(f"{run}: evaluated {first['goals']} goals, this table uses {len(goals)}")
        deltas.append(last["score"] - first["score"])
        rows.append({"policy": f"after ES: {run_label(run)} (v{last['version']}; before: {first['score']:.1f})",
                     "score": last["score"], "success_rate": last["success_rate"]})
    out = {"data": str(args.data), "split": args.split, "goals": len(goals), "max_steps": args.max_steps,
           "rows": rows, "machine": machine_info()}
    if deltas:
        mean, lo, hi = mean_interval(deltas)
        out["es_delta"] = {"per_run": deltas, "mean": mean, "ci95": [lo, hi]}
    lines = [f"{len(goals)} {args.split} goals of {args.data}, at most {args.max_steps} steps "
             "(score = 100 × mean reward, success = share of reward 1.0)", "",
             "| policy | score | success |", "|---|---|---|"]
    lines += [f"| {r['policy']} | {r['score']:.1f} | {100 * r['success_rate']:.1f}% |" for r in rows]
    if deltas:
        d = out["es_delta"]
        lines += ["", f"ES Δ score over {len(deltas)} runs: {', '.join(f'{x:+.1f}' for x in deltas)}; mean "
                      f"{d['mean']:+.2f}, paired 95% t interval [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}] "
                      f"({sum(x > 0 for x in deltas)} of {len(deltas)} runs improve)"]
    text = "\n".join(lines)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    if args.markdown:
        m = out["machine"]
        command = " ".join(["python experiments/eval_real_webshop.py", *(argv if argv is not None else sys.argv[1:])])
        header = ["# Baselines on WebShop's real held-out goals", "",
                  f"Written on {time.strftime('%d %b %Y')} ({m['cpu']}, {m['cores']} cores) by", "", "```bash",
                  command, "```", "",
                  "An ES row names its run directory and the commit the run was made at (its run.json); the "
                  "reference rows and the shipped policy are evaluated by this command.", ""]
        args.markdown.write_text("\n".join([*header, text]) + "\n")
    return out


if __name__ == "__main__":
    main()
