"""Play WebShop in a terminal: ``python -m envs.webshop_bridge --data PATH|webshop_small|synthetic --goal N``.

Prints the observation and the available actions, reads ``search[...]`` / ``click[...]`` lines (``quit``
leaves), and shows the reward breakdown after Buy Now. Works with piped input too.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TextIO

from .env import WebShopTextEnv
from .errors import DataError
from .shop import Shop, load_webshop
from .synthetic import synthetic_shop


def build_shop(data: str, num_products: int | None, seed: int, goals: str) -> Shop:
    if data == "synthetic":
        return synthetic_shop(num_products or 300, seed=seed)
    return load_webshop(data, num_products=num_products, seed=seed, goals=goals)


SEP = re.compile(r"\s*\[SEP\]\s*")


def readable(obs: str) -> str:
    """The observation with WebShop's ``[SEP]`` separators as line breaks (the agent sees them raw)."""
    return SEP.sub("\n", obs).strip("\n")


def split_of(shop: Shop, index: int) -> str:
    """The split (test / eval / train) goal ``index`` belongs to."""
    return next((name for name, indices in shop.splits.items() if index in indices), "no")


def _show(out: TextIO, env: WebShopTextEnv, obs: str) -> None:
    avail = env.available_actions()
    out.write(f"\n{readable(obs)}\n")
    search = "search[<query>]  " if avail["has_search_bar"] else ""
    out.write(f"actions: {search}" + "  ".join(f"click[{c}]" for c in avail["clickables"]) + "\n")


def play(env: WebShopTextEnv, goal: int | None, inp: TextIO, out: TextIO) -> float:
    """One interactive episode; returns its reward (0 if the player quits)."""
    obs, info = env.reset(goal)
    index = info["goal_index"]
    out.write(f"goal #{index} ({split_of(env.shop, index)} split): {env.instruction}\n")
    _show(out, env, obs)
    while True:
        out.write("> ")
        out.flush()
        line = inp.readline()
        if not line:
            out.write("\n(end of input)\n")
            return 0.0
        action = line.strip()
        if action in ("quit", "exit", "q"):
            return 0.0
        if not action:
            continue
        obs, reward, done, info = env.step(action)
        if not info.get("valid", True):
            out.write(f"(no-op: {info['invalid_reason']})\n")
        _show(out, env, obs)
        if done:
            out.write(f"\nreward: {reward:.4f}\n")
            for key, value in (info.get("reward_info") or {}).items():
                out.write(f"  {key}: {value}\n")
            out.write(f"  goal asin: {info.get('goal_asin')}  purchased: {info.get('purchased_asin')} "
                      f"{info.get('purchased_options')}\n")
            return reward


def main(argv: list[str] | None = None, inp: TextIO | None = None, out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.webshop_bridge", description=__doc__)
    parser.add_argument("--data", required=True,
                        help="a WebShop data directory/file, 'webshop_small' (packaged) or 'synthetic'")
    parser.add_argument("--goal", type=int, default=None, help="goal index (default: random)")
    parser.add_argument("--num-products", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="seed for prices and price ceilings")
    parser.add_argument("--goals", choices=("templated", "human", "synthetic"), default="templated",
                        help="WebShop's goal set: templated (built from items_ins_v2) or human (items_human_ins.json); "
                             "'synthetic' is templated's old name. Not used with --data synthetic")
    parser.add_argument("--show-attrs", action="store_true", help="show the Attributes sub page button")
    args = parser.parse_args(argv)
    inp, out = inp or sys.stdin, out or sys.stdout
    try:
        shop = build_shop(args.data, args.num_products, args.seed, args.goals)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.write(f"{shop.name}: {len(shop.catalog)} products, {len(shop.goals)} goals\n")
    env = WebShopTextEnv(shop, show_attrs=args.show_attrs, seed=args.seed)
    try:
        play(env, args.goal, inp, out)
    except IndexError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
