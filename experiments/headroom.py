"""Where the shipped policy's headroom is: greedy evaluations with one decision overridden at a time.

ES can only move what the policy can already represent. This script measures, on WebShop's **eval** split
(never the 500 test goals), how far each kind of behaviour change could take the shipped policy:

* ``greedy``: the policy as shipped;
* ``choose bias b``: a constant ``b`` added to every ``choose <value>`` candidate's score (mean per-token
  log-likelihood): the policy clicks more options, *its own* pick of which. This is the most a pure
  "click options before buying" shift of the policy can give;
* ``policy products + rule options``: the policy picks searches and products; on item pages a rule clicks every
  option value the instruction names, then buys (the option rule of the baselines, on the policy's products);
* ``rule when, policy which``: the rule decides *whether* to click an option (while a named value is left), the
  policy decides *which* (its best-scored ``choose`` candidate). Also reports, on the first visit of each item
  page that has a named value, how often the policy's best option is a named one, against chance
  (named / all option values on those pages).

    python -m experiments.headroom --goals 500 --markdown experiments/results/headroom.md
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time
from pathlib import Path

import numpy as np

from envs.webshop_bridge.policies import instruction_words, names_value
from esjax.agent.webshop import WebShopAgent
from esjax.loop.rollout import RolloutEngine


class RecordingAgent(WebShopAgent):
    """Keeps each episode's current candidates on its memory, so a decision rule can read them."""

    def step_inputs(self, observation, available, memory):
        prompt, candidates, ids = super().step_inputs(observation, available, memory)
        memory.candidates = candidates
        return prompt, candidates, ids


class Decisions:
    """Item-page decision rules; ``choose(episode, scores)`` returns a candidate index or None (the policy's)."""

    def __init__(self, mode: str, bias: float = 0.0):
        self.mode, self.bias = mode, bias
        self.first_pages = self.first_named_top = self.options_seen = self.named_seen = 0

    def choose(self, episode, scores: np.ndarray) -> int | None:
        cands = episode.memory.candidates
        texts = [c.text for c in cands]
        if "buy now" not in texts:
            return None
        option_idx = [i for i, t in enumerate(texts) if t.startswith("choose ")]
        words = instruction_words(episode.memory.instruction)
        named_idx = [i for i in option_idx if names_value(words, texts[i][len("choose "):])]
        if self.mode == "bias":
            shifted = np.array(scores, np.float64)
            shifted[option_idx] += self.bias
            return int(np.argmax(shifted))
        if self.mode == "rule":
            return named_idx[0] if named_idx else texts.index("buy now")
        if self.mode == "rule-when":
            if not named_idx:
                return texts.index("buy now")
            best = max(option_idx, key=lambda i: scores[i])
            if not episode.memory.chosen:
                self.first_pages += 1
                self.first_named_top += best in named_idx
                self.options_seen += len(option_idx)
                self.named_seen += len(named_idx)
            return best
        raise ValueError(self.mode)


def evaluate(policy, shop, goals, decisions: Decisions | None, max_steps: int) -> dict:
    from envs.webshop_bridge import InProcessEnvPool
    from esjax.train.standalone_eval import evaluate_policy

    class Engine(RolloutEngine):
        def choose(self, episode, scores):
            picked = None if decisions is None else decisions.choose(episode, scores)
            return super().choose(episode, scores) if picked is None else picked

    agent = RecordingAgent(policy.tokenizer, "compact", score_norm="mean")
    out = evaluate_policy(policy.config, policy.params, agent, functools.partial(InProcessEnvPool, shop), goals,
                          max_steps, engine_cls=Engine)
    return {"score": out["score"], "success_rate": out["success_rate"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--goals", type=int, default=500, help="first N goals of the eval split")
    parser.add_argument("--biases", default="0.5,1,1.5,2,2.5,3,4")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--policy", type=Path, help="an HF policy folder (default: the embedded policy)")
    args = parser.parse_args(argv)
    from envs.webshop_bridge import load_webshop
    from esjax.agent.policy import load_policy

    shop = load_webshop("webshop_small", seed=0)
    policy = load_policy("embedded") if args.policy is None else load_policy("hf", str(args.policy))
    goals = list(shop.split("eval"))[: args.goals]
    rows = []
    started = time.perf_counter()

    def row(name, decisions, note=""):
        out = evaluate(policy, shop, goals, decisions, 15)
        rows.append({"policy": name, **out, "note": note})
        print(json.dumps(rows[-1]), flush=True)

    row("greedy (as shipped)", None)
    for b in (float(x) for x in args.biases.split(",")):
        row(f"choose bias {b:g}", Decisions("bias", b))
    row("policy products + rule options", Decisions("rule"))
    when = Decisions("rule-when")
    row("rule when, policy which", when)
    top, pages, chance = when.first_named_top, when.first_pages, when.named_seen / max(when.options_seen, 1)
    rows[-1]["note"] = (f"first visits of item pages with a named value: the policy's best option is named on "
                        f"{top} of {pages} ({top / max(pages, 1):.0%}); chance {when.named_seen} / "
                        f"{when.options_seen} ({chance:.0%})")
    print(rows[-1]["note"], flush=True)
    seconds = time.perf_counter() - started
    if args.markdown:
        which = "" if args.policy is None else f" --policy {args.policy}"
        lines = [f"<!-- written by: python experiments/headroom.py --goals {args.goals} --biases {args.biases}{which} "
                 f"--markdown {args.markdown} ({time.strftime('%Y-%m-%d')}, {platform.machine()}, {seconds:.0f} s) -->",
                 "", f"{'Shipped policy' if args.policy is None else args.policy}, greedy, first {len(goals)} goals of "
                 "WebShop's eval split, at most 15 steps:", "",
                 "| policy | score | success | note |", "|---|---|---|---|"]
        lines += [f"| {r['policy']} | {r['score']:.1f} | {100 * r['success_rate']:.1f}% | {r['note']} |" for r in rows]
        args.markdown.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
