"""``python -m esjax.eval --run-dir DIR | --model PATH``: score a trained run or an HF folder on held-out goals."""

from __future__ import annotations

import argparse
import json

from esjax.cli_util import UserError, run_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m esjax.eval", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-dir", help="a run directory written by esjax.run (uses its latest checkpoint)")
    source.add_argument("--model", help="an HF folder (config.json, model.safetensors, tokenizer.json)")
    parser.add_argument("--config", help="config for --model runs (env and agent sections); default settings")
    parser.add_argument("--data", help="'synthetic' or a WebShop data folder (default: the run's / config's)")
    parser.add_argument("--split", default=None, choices=["test", "eval", "train"], help="goal split")
    parser.add_argument("--goals", type=int, default=None, help="number of goals (default: the config's)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from esjax.config import load_config
    from esjax.trainer import build_agent, build_policy, build_shop, load_run, resume_config

    overrides = []
    if args.data:
        overrides.append(f"env.data={args.data}")
    if args.split:
        overrides.append(f"env.eval_split={args.split}")
    if args.goals:
        overrides.append(f"env.eval_goals={args.goals}")
    if args.run_dir:
        config = resume_config(args.run_dir, overrides)
        shop, policy, params, version = load_run(args.run_dir, config)
        what = f"{args.run_dir} (version {version})"
    else:
        config = load_config(args.config, [*overrides, "model.source=hf", f"model.path={args.model}"])
        shop = build_shop(config)
        policy = build_policy(config, shop)
        params, what = policy.params, args.model
    goals = list(shop.split(config.env.eval_split))[: config.env.eval_goals]
    if not goals:
        raise UserError(f"env.eval_split: no {config.env.eval_split!r} goals in this shop")
    from esjax.evaluate import evaluate_policy

    result = evaluate_policy(policy.config, params, build_agent(config, policy), shop, goals, config.env.max_steps)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "rewards"}))
    else:
        print(f"{what}: score {result['score']:.1f}, success rate {100 * result['success_rate']:.1f}% "
              f"on {result['goals']} {config.env.eval_split} goals ({shop.name})")
    return 0


if __name__ == "__main__":
    run_cli(main)
