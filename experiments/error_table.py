"""Where a policy loses its points on WebShop, by kind of error, from an evaluation's traces (issue 54, item 1).

Every goal whose reward is below 1 is put in exactly one kind, checked in this order:

* **step cap**: the episode ended without a purchase;
* **wrong product**: it bought another product than the goal's; split by where the goal's product stood in the
  results of the policy's first search (the query the policy sent, re-run on the same shop: WebShop's search is
  deterministic): on the first results page but not the first hit, on a later page, or not among the results;
* **right product, wrong or missing options**: the goal's product, with an options score below 1;
* **right product, other**: the goal's product with every option right, and still below 1 (attributes or type as
  WebShop's reward reads them, or the price term);

and, across kinds, how many purchases were **over the price ceiling** (WebShop's ``r_price`` false).

Points lost are 100 × Σ (1 − reward) / goals, so the rows add up to 100 − score. Whether ES could move a kind is
read from the traces too: how often the policy left the first item page, paged the results, or clicked an option.

    python -m esjax.eval --model FOLDER --config configs/default.yaml --split eval --goals 1000 --traces T.jsonl
    python -m experiments.error_table T.jsonl --data webshop_small --markdown OUT.md
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path

from envs.webshop_bridge.pages import PRODUCTS_PER_PAGE
from envs.webshop_bridge.shop import load_webshop

KINDS = ("step cap", "wrong product: goal on the first results page, not its first hit",
         "wrong product: goal on a later results page", "wrong product: goal not among the results",
         "wrong product: goal was the first hit", "right product, wrong or missing options", "right product, other")


def read_traces(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def first_query(trace: dict) -> str | None:
    for action, _ in trace["actions"]:
        if action.startswith("search[") and action.endswith("]"):
            return action[len("search["):-1].lower()
    return None


def goal_asin(shop, trace: dict) -> str:
    """The goal's product (from the trace when it bought, else from the shop's goal list)."""
    return (trace.get("goal_asin") or shop.goals[trace["goal"]].asin).upper()


def goal_rank(shop, trace: dict) -> int | None:
    """1-based rank of the goal's product in the results of the episode's first search (None: not found)."""
    query = first_query(trace)
    if query is None:
        return None
    asins = [shop.product(i).asin.upper() for i in shop.search(query)]
    goal = goal_asin(shop, trace)
    return asins.index(goal) + 1 if goal in asins else None


def kind_of(trace: dict, rank: int | None, goal: str) -> str | None:
    """The error kind of one episode (None for a full reward)."""
    if trace["reward"] >= 1.0:
        return None
    if trace["end"] != "bought":
        return KINDS[0]
    if (trace.get("purchased_asin") or "").upper() != goal:
        if rank is None:
            return KINDS[3]
        if rank == 1:
            return KINDS[4]
        return KINDS[1] if rank <= PRODUCTS_PER_PAGE else KINDS[2]
    r_option = (trace.get("reward_info") or {}).get("r_option")
    if r_option is not None and r_option < 1.0:
        return KINDS[5]
    return KINDS[6]


def behaviour(trace: dict) -> dict[str, bool]:
    """What the episode did that ES could change: open more than one item page, page the results, choose options
    (the purchase carried at least one)."""
    actions = [a.lower() for a, _ in trace["actions"]]
    items = [a for a in actions if a.startswith("click[b0")]
    return {"item pages > 1": len(items) > 1, "paged": "click[next >]" in actions,
            "clicked an option": bool(trace.get("purchased_options"))}


def table(traces: list[dict], shop) -> dict:
    n = len(traces)
    kinds, lost, over = Counter(), Counter(), Counter()
    habits: dict[str, Counter] = {k: Counter() for k in KINDS}
    overall = Counter()
    for trace in traces:
        did = behaviour(trace)
        overall.update(k for k, v in did.items() if v)
        # the search is re-run only for goals below full reward (the only ones a kind is needed for)
        rank = goal_rank(shop, trace) if trace["reward"] < 1.0 else None
        kind = kind_of(trace, rank, goal_asin(shop, trace))
        if kind is None:
            continue
        kinds[kind] += 1
        lost[kind] += 1.0 - trace["reward"]
        over[kind] += (trace.get("reward_info") or {}).get("r_price") is False
        habits[kind].update(k for k, v in did.items() if v)
    score = 100 * sum(t["reward"] for t in traces) / n
    return {"goals": n, "score": score, "success": sum(t["reward"] >= 1.0 for t in traces) / n,
            "rows": [{"kind": k, "goals": kinds[k], "points_lost": 100 * lost[k] / n, "over_price": over[k],
                      **{h: habits[k][h] for h in ("item pages > 1", "paged", "clicked an option")}} for k in KINDS],
            "all_item_pages_gt1": overall["item pages > 1"], "all_paged": overall["paged"]}


def markdown(result: dict, source: str) -> str:
    lines = [f"Goals {result['goals']}: score {result['score']:.1f}, success {result['success']:.1%}; "
             f"{100 - result['score']:.1f} points lost (from `{source}`).", "",
             "| kind of error | goals | points lost | over the price ceiling | left the first item page | "
             "paged the results | clicked an option |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['kind']} | {row['goals']} | {row['points_lost']:.1f} | {row['over_price']} | "
                     f"{row['item pages > 1']} | {row['paged']} | {row['clicked an option']} |")
    lines += ["", f"Over all {result['goals']} goals the policy left its first item page in "
                  f"{result['all_item_pages_gt1']} episodes and paged the results in {result['all_paged']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", type=Path, help="an evaluation's traces (.jsonl or .jsonl.gz)")
    parser.add_argument("--data", default="webshop_small", help="the shop the evaluation ran on")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    shop = load_webshop(args.data, seed=0)
    result = table(read_traces(args.traces), shop)
    text = markdown(result, str(args.traces))
    print(text, end="")
    if args.markdown:
        args.markdown.write_text(text)
    return result


if __name__ == "__main__":
    main()
