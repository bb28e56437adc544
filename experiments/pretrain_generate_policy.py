"""Pretrain a generative WebShop policy (issue 36): behaviour cloning of the recipe's teacher as *written* actions.

Generate mode's agent (``esjax.agent.generate_agent.GenerateAgent``) shows the model the instruction, the last actions,
the page and its available actions, and reads back one action in WebShop's grammar (``search[...]`` / ``click[...]``).
This recipe teaches a small decoder to write the teacher's action there:

1. Start from a policy folder (``--init``, default: the embedded scoring policy, whose tokenizer and weights
   already know the real shop's text).
2. Roll the teacher of ``experiments/pretrain_default_policy.py`` (search the instruction, open the goal's product
   if it is on results page 1 else the first hit, click the goal's options unless *hasty*, buy) over the first
   ``--demo-goals`` **train** goals, and record each step exactly as generate mode renders it: the prompt ids of
   ``GenerateAgent.prompt_ids`` (the model's chat template, ``agent.max_prompt_tokens``) and the teacher's reply
   `` <action>`` followed by the end-of-sequence token.
3. Train with optax AdamW on the next-token cross-entropy of the reply tokens only (teacher forcing), sequences
   bucketed by length.
4. Export the HF folder; ``python -m esjax.eval --model OUT --config configs/generate.yaml`` scores it greedily.

    python -m experiments.pretrain_generate_policy --out /tmp/gen-policy          # full recipe
    python -m experiments.pretrain_generate_policy --quick --out /tmp/q           # seconds (tests)
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import time
from pathlib import Path

import numpy as np

from experiments.lib.pretrain import (
    CATALOG_SEED,
    CHAT_TEMPLATE,
    DATA,
    MAX_PROMPT_TOKENS,
    MAX_REPLY_TOKENS,
    MAX_STEPS,
    MODEL,
    Teacher,
    batch_plan,
    generate_agent,
    jitted_step,
    make_optimizer,
    params_digest,
    round_up,
    write_folder,
)


def whole_instruction(instruction: str) -> str:
    return instruction


def keywords(instruction: str) -> str:
    """A WebShop instruction without its leading "Find me" and trailing ", and price lower than N dollars"."""
    text = re.sub(r",? and price lower than [\d.]+ dollars\s*$", "", instruction.strip())
    return re.sub(r"^Find me ", "", text)


class FirstHitTeacher(Teacher):
    """The recipe's teacher with a rule a policy can read off its prompt: on a results page it opens the first hit
    (never the goal's product by its hidden id), then clicks the goal's option values (which the instruction
    names) and buys. On the 500 test goals it scores 74.3 (the oracle's product choice: 92.2; first hit without
    options, WebShop's "first hit, buy" rule: 53.6), and every one of its decisions is visible in the prompt.

    ``query`` is what it searches for, given the instruction."""

    query = staticmethod(whole_instruction)

    def act(self, observation: str, available: dict) -> str | None:
        from esjax.agent.webshop import page_kind

        kind = page_kind(available)
        if kind == "search":
            return f"search[{self.query(self.goal.instruction_text)}]"
        if kind == "results":
            products = [c for c in available.get("clickables", []) if c not in ("back to search", "next >", "< prev")]
            return f"click[{products[0]}]" if products else None
        return super().act(observation, available)


class KeywordTeacher(FirstHitTeacher):
    """The first-hit teacher searching the instruction without its "Find me" and its price clause: a shorter copy
    (~10 tokens fewer, no digits) that also ranks better (78.0 on the 500 test goals vs 74.3 for the whole
    instruction; dropping the option clauses too costs 27 points: their words find the right product)."""

    query = staticmethod(keywords)


TEACHERS = {"oracle": Teacher, "first-hit": FirstHitTeacher, "first-hit-keywords": KeywordTeacher}


def teacher_steps(shop, goals, agent, hasty: float, seed: int, max_steps: int = MAX_STEPS, *,
                  recovery: float = 0.0, teacher: str = "oracle"):
    """``(prompt_text, action)`` for every teacher step as generate mode renders it, and the teacher's mean reward.

    ``recovery``: the share of results pages where a wrong click (a catalogue product that is not on the page,
    WebShop's no-op) comes first; it is not a demonstration, but the teacher's next step, whose prompt carries
    the invalid-action feedback line, is (so the policy learns to recover instead of repeating it).
    Only ``agent``'s prompt rendering is used (not its tokenizer), so a from-scratch tokenizer can be trained on
    these texts."""
    from envs.webshop_bridge import WebShopTextEnv
    from esjax.agent.webshop import page_kind

    rule = TEACHERS[teacher]
    env = WebShopTextEnv(shop)
    rng = np.random.default_rng([seed, 17])  # the scoring recipe's draw: the same episodes are hasty
    hasty_flags = rng.random(len(goals)) < hasty
    noise = np.random.default_rng([seed, 23])
    asins = catalogue_ids(shop)
    steps, rewards = [], []
    for goal, is_hasty in zip(goals, hasty_flags):
        observation, _ = env.reset(goal)
        memory, reward = agent.new_memory(env.instruction), 0.0
        expert = rule(env.goal, bool(is_hasty))
        for _ in range(max_steps):
            available = env.available_actions()
            if recovery and page_kind(available) == "results" and noise.random() < recovery:
                wrong = f"click[{asins[noise.integers(len(asins))]}]"
                if wrong[6:-1] not in available.get("clickables", []):
                    observation, _, _, info = env.step(wrong)
                    agent.remember(memory, " " + wrong, wrong, info)
            action = expert.act(observation, available)
            if action is None:
                break
            steps.append((agent.prompt_text(observation, available, memory), action))
            observation, r, done, info = env.step(action)
            agent.remember(memory, " " + action, action, info)
            if done:
                reward = r
                break
        rewards.append(reward)
    return steps, float(np.mean(rewards)) if rewards else 0.0


ASIN = re.compile(r"\b[Bb]0[0-9A-Za-z]{8}\b")


def catalogue_ids(shop) -> list[str]:
    """The catalogue's product ids as clicks write them (lower case), in catalogue order."""
    return [shop.product(i).asin.lower() for i in range(len(shop))]


def copy_variants(steps, shop, share: float, seed: int, query=whole_instruction):
    """Extra demonstrations that can only be imitated by copying from the prompt (not by recalling the train
    goals): for a ``share`` of the search steps, the searched part of the instruction (``query`` of it) replaced
    by another goal's, its words shuffled; for a ``share`` of the clicks on a product, every product id on the
    page and in the action renamed to other catalogue ids (one consistent renaming per step)."""
    rng = np.random.default_rng([seed, 31])
    asins = catalogue_ids(shop)
    instructions = list(dict.fromkeys(query(goal.instruction_text) for goal in shop.goals))
    out = []
    for prompt, action in steps:
        if rng.random() >= share:
            continue
        if action.startswith("search["):
            original = action[7:-1]
            words = instructions[rng.integers(len(instructions))].split()
            rng.shuffle(words)
            new = " ".join(words)
            out.append((prompt.replace(original, new), f"search[{new}]"))
            continue
        if not ASIN.search(action):  # only clicks on a product need the ids copied
            continue
        found = list(dict.fromkeys(a.lower() for a in ASIN.findall(prompt + action)))
        renamed = dict(zip(found, (asins[i] for i in rng.choice(len(asins), len(found), replace=False))))
        out.append((rename_ids(prompt, renamed), rename_ids(action, renamed)))
    return out


def rename_ids(text: str, renamed: dict[str, str]) -> str:
    """``text`` with each product id renamed (lower-case ids as in clicks, upper-case as on the page)."""
    def sub(match):
        new = renamed[match.group(0).lower()]
        return new if match.group(0).islower() else new.upper()

    return ASIN.sub(sub, text)


def encode_steps(agent, steps):
    """``(prompt_ids, reply_ids)``: the prompt within the agent's budget, the reply `` <action>`` + end of turn."""
    stop = [min(agent.stop_token_ids)] if agent.stop_token_ids else []
    return [(agent.encode_prompt(prompt), list(agent.tokenizer.encode(" " + action, add_special_tokens=False).ids)
             + stop) for prompt, action in steps]


def demonstrations(shop, goals, agent, hasty: float, seed: int, max_steps: int = MAX_STEPS):
    """``(prompt_ids, reply_ids)`` for every teacher step, and the teacher's mean reward."""
    steps, reward = teacher_steps(shop, goals, agent, hasty, seed, max_steps)
    return encode_steps(agent, steps), reward


def scratch_policy(shop, steps, args):
    """A randomly initialised policy of the ``--hidden``/``--layers`` architecture whose BPE tokenizer is trained
    on the demonstrations' prompts and actions (and, with ``--asin-tokens``, holds each catalogue product id as
    one token, so a click copies one token instead of ten characters)."""
    import jax

    from esjax.agent.policy import LoadedPolicy
    from esjax.agent.tokenizer import train_bpe
    from esjax.model.config import from_hf_dict
    from esjax.model.params import init_params

    corpus = list(dict.fromkeys(t for prompt, action in steps for t in (prompt, " " + action)))
    tokenizer = train_bpe(corpus, args.vocab, whole_pieces=catalogue_ids(shop) if args.asin_tokens else ())
    model = {**MODEL, "vocab_size": round_up(tokenizer.get_vocab_size(), 64), "hidden_size": args.hidden,
             "intermediate_size": 3 * args.hidden, "num_hidden_layers": args.layers}
    config = from_hf_dict({k: v for k, v in model.items() if k != "torch_dtype"}, "scratch model")
    params = init_params(config, jax.random.key(args.seed))
    return LoadedPolicy(config, params, tokenizer, CHAT_TEMPLATE, raw_config=model), model


def encode_pairs(pairs, bucket: int = 64):
    """Right-padded ``tokens``, ``mask`` and the reply-token ``target`` mask, grouped by padded length."""
    groups: dict[str, list] = {}
    for prompt, reply in pairs:
        length = round_up(len(prompt) + len(reply), bucket)
        groups.setdefault(f"len{length:04d}", []).append((prompt, reply))
    out = {}
    for key, chosen in sorted(groups.items()):
        length = int(key[3:])
        tokens = np.zeros((len(chosen), length), np.int32)
        mask = np.zeros((len(chosen), length), bool)
        target = np.zeros((len(chosen), length), bool)
        for i, (prompt, reply) in enumerate(chosen):
            seq = prompt + reply
            tokens[i, :len(seq)], mask[i, :len(seq)] = seq, True
            target[i, len(prompt):len(seq)] = True
        out[key] = {"tokens": tokens, "mask": mask, "target": target}
    return out


def reply_loss(config, params, batch, prompt_weight: float = 0.0):
    """Mean next-token cross-entropy over the reply tokens (plus ``prompt_weight`` × that over the prompt tokens:
    language modelling the prompts, which repeat the instruction and earlier actions, teaches copying), and the
    share of reply tokens predicted exactly."""
    import jax.numpy as jnp
    import optax

    from esjax.model.decoder import forward

    logits, _ = forward(config, params, batch["tokens"], None, batch["mask"])
    pred, labels, weight = logits[:, :-1], batch["tokens"][:, 1:], batch["target"][:, 1:]
    losses = optax.softmax_cross_entropy_with_integer_labels(pred, labels)
    count = jnp.maximum(weight.sum(), 1)
    correct = (jnp.argmax(pred, axis=-1) == labels) & weight
    loss = jnp.where(weight, losses, 0.0).sum() / count
    if prompt_weight:
        prompt = batch["mask"][:, 1:] & ~weight
        loss += prompt_weight * jnp.where(prompt, losses, 0.0).sum() / jnp.maximum(prompt.sum(), 1)
    return loss, correct.sum() / count


def train(config, params, data, args):
    import functools

    optimizer = make_optimizer(args.lr, args.steps, args.weight_decay)
    step = jitted_step(functools.partial(reply_loss, config, prompt_weight=args.prompt_loss), optimizer)
    opt_state, losses, accs, started = optimizer.init(params), [], [], time.perf_counter()
    for i, (kind, idx) in enumerate(batch_plan(data, args.batch, args.steps, args.seed)):
        params, opt_state, loss, acc = step(params, opt_state, {k: v[idx] for k, v in data[kind].items()})
        losses.append(float(loss))
        accs.append(float(acc))
        if args.log_every and (i + 1) % args.log_every == 0:
            print(f"step {i + 1}/{args.steps}: loss {np.mean(losses[-args.log_every:]):.3f} reply-token accuracy "
                  f"{np.mean(accs[-args.log_every:]):.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    return params, losses, accs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--init", type=Path, default=None, help="policy folder to start from (default: the embedded one)")
    p.add_argument("--demo-goals", type=int, default=5410, help="train goals played by the teacher (all: 5,410)")
    p.add_argument("--hasty", type=float, default=0.35, help="share of demonstrations that skip all options")
    p.add_argument("--teacher", choices=sorted(TEACHERS), default="oracle",
                   help="results-page rule: the goal's product when on page 1 (oracle) or always the first hit")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--scratch", action="store_true",
                   help="train a new tokenizer and model from scratch instead of starting from --init")
    p.add_argument("--vocab", type=int, default=2048, help="--scratch: learned BPE vocabulary size")
    p.add_argument("--asin-tokens", action="store_true", help="--scratch: one token per catalogue product id")
    p.add_argument("--hidden", type=int, default=64, help="--scratch: hidden size (MLP: 3x)")
    p.add_argument("--layers", type=int, default=2, help="--scratch: decoder layers")
    p.add_argument("--recovery", type=float, default=0.0,
                   help="share of results pages where a wrong click precedes the teacher's (recovery demos)")
    p.add_argument("--copy-variants", type=float, default=0.0,
                   help="share of steps also demonstrated with a new instruction / renamed product ids")
    p.add_argument("--prompt-loss", type=float, default=0.0, help="weight of the prompt tokens' LM loss")
    p.add_argument("--max-prompt-tokens", type=int, default=MAX_PROMPT_TOKENS, help="the agent's prompt budget")
    p.add_argument("--eval-goals", type=int, default=100, help="eval-split goals scored greedily at the end")
    p.add_argument("--quick", action="store_true", help="a seconds-long run (tests): few goals and steps, no eval")
    p.add_argument("--log-every", type=int, default=50)
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.demo_goals, args.steps, args.batch, args.eval_goals, args.log_every = 6, 2, 4, 0, 0
    started = time.perf_counter()
    from envs.webshop_bridge import load_webshop
    from esjax.agent.policy import load_policy

    shop = load_webshop(DATA, seed=CATALOG_SEED)
    goals = list(shop.split("train"))[: args.demo_goals]
    # --scratch: the prompts are rendered by the embedded policy's agent (its chat template is the recipe's, which
    # the new policy gets), then the new tokenizer is trained on them
    scratch_or_default = args.scratch or args.init is None
    policy = load_policy("embedded") if scratch_or_default else load_policy("hf", str(args.init))
    steps, teacher_reward = teacher_steps(shop, goals, generate_agent(policy, args.max_prompt_tokens), args.hasty,
                                          args.seed, recovery=args.recovery, teacher=args.teacher)
    steps += copy_variants(steps, shop, args.copy_variants, args.seed,
                           getattr(TEACHERS[args.teacher], "query", whole_instruction))
    model = None
    if args.scratch:
        policy, model = scratch_policy(shop, steps, args)
    agent = generate_agent(policy, args.max_prompt_tokens)
    pairs = encode_steps(agent, steps)
    data = encode_pairs(pairs)
    print(f"{len(pairs)} teacher steps from {len(goals)} train goals (teacher reward {teacher_reward:.3f}; "
          f"{len(data)} length buckets); {time.perf_counter() - started:.0f} s", flush=True)
    params, losses, accs = train(policy.config, policy.params, data, args)
    report = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "init_digest": params_digest(policy.params), "digest": params_digest(params),
              "teacher_steps": len(pairs), "teacher_reward": teacher_reward,
              "longest_reply_tokens": max(len(r) for _, r in pairs),
              "final_loss": float(np.mean(losses[-50:])), "final_reply_token_accuracy": float(np.mean(accs[-50:]))}
    if args.eval_goals:
        from envs.webshop_bridge import InProcessEnvPool
        from esjax.train.standalone_eval import evaluate_policy

        res = evaluate_policy(policy.config, params, agent, functools.partial(InProcessEnvPool, shop),
                              list(shop.split("eval"))[: args.eval_goals],
                              max_steps=MAX_STEPS, max_new_tokens=MAX_REPLY_TOKENS)
        report["eval"] = {"goals": args.eval_goals, "score": res["score"], "success_rate": res["success_rate"],
                          "invalid_action_rate": res["invalid_action_rate"]}
        print(f"greedy generate mode on {args.eval_goals} eval goals: score {res['score']:.1f}, invalid actions "
              f"{100 * res['invalid_action_rate']:.0f}%", flush=True)
    write_folder(args.out, policy.config, params, policy.tokenizer, model)
    report["seconds"] = time.perf_counter() - started
    (args.out / "pretrain_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    main()
