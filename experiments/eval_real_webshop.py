"""Evaluate a policy (default: the shipped embedded one) on real WebShop data's test goals.

Uses the same agent as training (compact prompts, candidate scoring, greedy) on the real 1,000-product
WebShop small set (``../shared/webshop_small``, loaded by ``envs.webshop_bridge.load_webshop``) and reports
score (100 × mean reward) and success rate (share of reward 1.0) next to the bridge's random-clicking
baseline (``RandomPolicy``: searches the instruction, then clicks a uniformly random clickable). The
embedded policy was trained only on synthetic products, so no threshold applies.

    python experiments/eval_real_webshop.py [--data ../shared/webshop_small] [--model HF_DIR] [--goals N]

Exits 0 with a message (no result) when the data folder is absent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_DATA = ROOT.parent / "shared" / "webshop_small"


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="WebShop data folder")
    p.add_argument("--model", type=Path, default=None, help="HF folder (default: the embedded policy)")
    p.add_argument("--split", default="test", choices=["test", "eval", "train"])
    p.add_argument("--goals", type=int, default=None, help="first N goals of the split (default: all)")
    p.add_argument("--max-steps", type=int, default=10, help="episode step cap (configs/default.yaml uses 10)")
    p.add_argument("--seed", type=int, default=0, help="random baseline's seed")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = p.parse_args(argv)
    if not (args.data / "products_1000.jsonl").exists() and not any(args.data.glob("items_*.json*")):
        print(f"{args.data}: no WebShop data here; skipping (nothing evaluated)")
        return None

    from envs.webshop_bridge import RandomPolicy, evaluate, load_webshop
    from esjax.agent.policy import load_policy
    from esjax.agent.webshop import WebShopAgent
    from esjax.evaluate import evaluate_policy

    shop = load_webshop(args.data)
    goals = list(shop.split(args.split))[: args.goals]
    policy = load_policy("embedded") if args.model is None else load_policy("hf", str(args.model))
    agent = WebShopAgent(policy.tokenizer, "compact")
    t0 = time.perf_counter()
    res = evaluate_policy(policy.config, policy.params, agent, shop, goals, args.max_steps)
    seconds = time.perf_counter() - t0
    rnd, _ = evaluate(shop, lambda: RandomPolicy(args.seed), goals, max_steps=args.max_steps)
    out = {"data": str(args.data), "shop": shop.name, "split": args.split, "goals": len(goals),
           "max_steps": args.max_steps, "model": str(args.model or "embedded"),
           "policy": {"score": res["score"], "success_rate": res["success_rate"]},
           "random": {"score": rnd.score, "success_rate": rnd.success_rate, "seed": args.seed},
           "policy_eval_seconds": seconds}
    print(f"{len(goals)} {args.split} goals of {args.data.name} (max {args.max_steps} steps):")
    print(f"  {out['model']} policy: score {res['score']:.1f}, success {100 * res['success_rate']:.1f}% "
          f"({seconds:.0f} s)")
    print(f"  random clicking:  score {rnd.score:.1f}, success {100 * rnd.success_rate:.1f}%")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
