"""Pretrain the embedded default policy (``esjax/assets/default_policy/``) by behaviour cloning on real WebShop.

Recipe (every step is deterministic given ``--seed``):

1. Load the packaged real 1,000-product WebShop set (``load_webshop("webshop_small")``: 6,910 goals; WebShop's
   split after the seed-233 shuffle: test 0–499, eval 500–1,499, train 1,500+). Only **train** goals are played.
2. Roll a *noisy teacher* over the first ``--demo-goals`` train goals. The teacher searches the instruction;
   on the results page it opens the goal's product if it is on page 1 and otherwise the first hit (it never
   pages: a policy that cannot see the target could not imitate paging); on the item page it clicks the goal's
   option values, then buys. Independently per episode, with probability ``--hasty``, it is *hasty*: it buys
   right after opening the product, skipping every option. Each step is recorded in exactly the agent's
   format: the compact prompt and the candidate list of ``WebShopAgent.step_inputs`` (``open #1 $12.99
   <title>``, ``choose <value>``, ``buy now``, ...) and the index of the candidate the teacher took. Steps with
   a single candidate (the search page) carry no choice and are skipped.
3. Train a byte-level BPE tokenizer (``esjax.agent.tokenizer.train_bpe``) on the prompts, the candidate
   descriptions and the shop's texts (real titles, instructions and option values).
4. Initialize a small Qwen2-architecture decoder (see ``MODEL``) and train it with optax AdamW on the
   candidate cross-entropy: ``softmax`` over the candidates' **mean per-token** log-likelihoods given the
   prompt (the differentiable form of ``esjax.agent.scoring.score_candidates`` with ``norm='mean'``: the
   prompt runs once into a KV cache and the candidates run on top of it), for a fixed ``--steps`` budget.
5. Export the HF folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with a
   chat template) and a README with the recipe, seed, run time and greedy scores on the real held-out goals.

Why the result is *competent but improvable*: a share of the demonstrations buy without choosing options, so
the cloned policy is close to indifferent between ``buy now`` and the right ``choose <value>`` on a fresh item
page. It finds a good product but often leaves the options' reward on the table — which reward-driven
fine-tuning (ES in ``configs/default.yaml``) can fix and behaviour cloning on this data cannot.

Run: ``python -m experiments.pretrain_default_policy`` (about ten minutes on a 2-core CPU);
``--quick`` is a seconds-long version for tests; ``--out DIR`` writes elsewhere.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from experiments.lib import REPO
from experiments.lib.pretrain import (
    CATALOG_SEED,
    DATA,
    MAX_STEPS,
    MODEL,
    SCORE_NORM,
    demonstrations,
    encode_steps,
    is_option,
    option_accuracy,
    option_decisions,
    params_digest,
    tokenizer_corpus,
    train,
    write_folder,
)

DEFAULT_OUT = REPO / "esjax" / "assets" / "default_policy"


def command_line(args: dict) -> str:
    """The command that regenerates the folder (``args`` as recorded in the report)."""
    parts = ["python experiments/pretrain_default_policy.py", f"--seed {args['seed']}"]
    if args["init"] is None:
        parts += [f"--steps {args['steps']}", f"--hasty {args['hasty']}"]
    else:
        parts.append(f"--init {args['init']}")
    if args["option_steps"]:
        parts += [f"--option-steps {args['option_steps']}", f"--option-lr {args['option_lr']}"]
    if args.get("joint_steps"):
        parts += [f"--joint-steps {args['joint_steps']}", f"--joint-lr {args['joint_lr']}"]
        if args.get("joint_hasty") is not None:
            parts.append(f"--joint-hasty {args['joint_hasty']}")
    return " ".join(parts)


def stage1_lines(report: dict) -> list[str]:
    a, s1 = report["args"], report["stage1"]
    if "init" in s1:
        return [f"- Stage 1 (behaviour cloning of a hasty teacher): the weights of `{s1['init']}` (digest "
                f"`{s1['init_digest']}`), made by this script's stage 1 (`--steps 1500 --hasty 0.35`; git history)."]
    return [
        f"- Stage 1 demonstrations: the first {a['demo_goals']} train goals, played by a teacher that opens the "
        "goal's product when it is on results page 1 and the first hit otherwise, clicks the goal's options and "
        f"buys; in a random {a['hasty']:.0%} of the episodes it is *hasty* (buys right after opening the product). "
        f"Teacher's mean reward: {s1['demo_reward']:.3f}. {s1['demo_steps']} multi-candidate steps recorded "
        f"({s1['demo_skipped']} skipped: action not a candidate).",
        "- Stage 1 loss: cross-entropy of the demonstrated candidate under softmax over the candidates' mean "
        f"per-token log-likelihoods given the compact prompt; AdamW lr {a['lr']} (warm-up, cosine decay), weight "
        f"decay {a['weight_decay']}, batch {a['batch']}, {a['steps']} steps (about {s1['epochs']:.1f} epochs), "
        f"seed {a['seed']}; final loss {s1['final_loss']:.3f}, candidate accuracy {s1['final_acc']:.3f} (last 50 "
        f"steps); {s1['seconds']:.0f} s.",
    ]


def stage2_lines(report: dict) -> list[str]:
    a, s2 = report["args"], report["stage2"]
    if not s2:
        return []
    return [
        f"- Stage 2 (which option): {s2['decisions']} option decisions of the never-hasty teacher on the same train "
        "goals (item pages where it chooses a value the goal names); softmax over the offered `choose <value>` "
        "candidates only, so it teaches *which* value matches the instruction and leaves *whether* to choose one "
        f"(versus `buy now`) to reward-driven fine-tuning; AdamW lr {a['option_lr']}, {a['option_steps']} steps, "
        f"final loss {s2['final_loss']:.3f}; {s2['seconds']:.0f} s.",
        f"- Held-out option accuracy ({s2['held_out']} decisions on eval-split goals: the demonstrated value scores "
        f"best among the offered values): {s2['held_out_acc_before']:.3f} before stage 2, {s2['held_out_acc']:.3f} "
        "after.",
    ]


def stage3_lines(report: dict) -> list[str]:
    a, s3 = report["args"], report.get("stage3")
    if not s3:
        return []
    return [f"- Stage 3 (joint): {a['joint_steps']} steps, AdamW lr {a['joint_lr']}, on {s3['demo_steps']} "
            f"demonstration steps of stage 1's teacher, hasty in {s3['hasty']:.0%} of the episodes (softmax over "
            f"every candidate), and stage 2's {s3['decisions']} option decisions "
            "together, so the results-page and buy decisions that option-only training wears down are learned "
            f"again; final loss {s3['final_loss']:.3f}, held-out option accuracy after: {s3['held_out_acc']:.3f}; "
            f"{s3['seconds']:.0f} s."]


def write_readme(out: Path, report: dict) -> None:
    a = report["args"]
    lines = [
        "# The embedded default policy",
        "",
        "A small Qwen2-architecture decoder that plays WebShop by scoring candidate actions (see",
        "`esjax/agent/webshop.py`), trained from scratch by behaviour cloning on **real WebShop** train goals",
        "with `experiments/pretrain_default_policy.py`. It is competent but improvable: `configs/default.yaml`",
        "fine-tunes it with asynchronous ES.",
        "",
        "Regenerate (bit-identical on the same CPU / jax build, see below):",
        "",
        "```",
        command_line({**a, "init": None}),
        "```",
        "",
        *([] if a["init"] is None else [
            f"These weights ran stage 2 alone (`{command_line(a)}`) on stage-1 weights made earlier by the same "
            f"script's stage 1 (digest `{report['stage1']['init_digest']}`; the default policy before stage 2 "
            "existed, in git history), which is what the one command above runs first.", ""]),
        "## Model",
        "",
        f"- Qwen2 architecture: hidden {MODEL['hidden_size']}, {MODEL['num_hidden_layers']} layers, "
        f"{MODEL['num_attention_heads']} heads ({MODEL['num_key_value_heads']} KV heads), MLP "
        f"{MODEL['intermediate_size']}, tied embeddings, vocabulary {MODEL['vocab_size']} (byte-level BPE "
        "trained on the real shop's text); float32.",
        f"- {report['param_count']:,} parameters; folder size {report['folder_bytes'] / 1e6:.2f} MB.",
        f"- Weights digest (sha256 of the leaves, first 16 hex): `{report['digest']}`.",
        "- Agent settings it was trained for: compact prompt, candidates cut to 24 tokens, candidates compared",
        f"  by mean per-token log-likelihood (`agent.score_norm: {SCORE_NORM}`).",
        "",
        "## Recipe",
        "",
        f"- Shop: WebShop's real 1,000-product set (`load_webshop(\"{DATA}\", seed={CATALOG_SEED})`, packaged): "
        f"{report['splits']['train']} train / {report['splits']['eval']} eval / {report['splits']['test']} "
        "test goals (WebShop's split). Only train goals are played.",
        *stage1_lines(report),
        *stage2_lines(report),
        *stage3_lines(report),
        f"- Run time: {report['total_seconds']:.0f} s in all, on {report['machine']} (load average at the end "
        f"{report['load']}).",
        "",
        f"## Greedy scores on real WebShop (score = 100 × mean reward, success = share of reward 1.0, at most "
        f"{MAX_STEPS} steps)",
        "",
        "| goals | policy | score | success |",
        "|---|---|---|---|",
    ]
    for row in report["evals"]:
        lines.append(f"| {row['name']} | {row['policy']} | {row['score']:.1f} | {100 * row['success_rate']:.1f}% |")
    lines += [
        "",
        "On the same 500 test goals: rule \"open the first hit, buy\" 53.6 / 2.2%, rule \"first hit + the options",
        "the instruction names\" 74.6 / 57.0%, WebShop's oracle 99.0 / 95.6%",
        "(`experiments/results/webshop_baselines.md`).",
        "",
        "## Reproducibility",
        "",
        "Everything is seeded (teacher noise, data order, initialization), the tokenizer trainer is",
        "deterministic and XLA's CPU kernels are deterministic, so re-running the command on the same machine",
        "and jax version reproduces these weights bit for bit (`tests/agent/test_default_policy.py` checks it on a",
        "short run). On another CPU (different SIMD width) or jax version, float rounding can differ; the",
        "greedy scores then agree within noise.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--demo-goals", type=int, default=5410, help="train goals played by the teacher (all: 5,410)")
    p.add_argument("--hasty", type=float, default=0.35, help="share of demonstrations that skip all options")
    p.add_argument("--steps", type=int, default=1500, help="optimizer steps (the early stop)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--eval-goals", type=int, default=500, help="held-out goals per split for the README scores")
    p.add_argument("--option-steps", type=int, default=0,
                   help="stage 2: steps of option-only behaviour cloning (which value to choose; 0 = none)")
    p.add_argument("--option-lr", type=float, default=3e-3)
    p.add_argument("--joint-steps", type=int, default=0,
                   help="stage 3: steps on stage 1's demonstrations and stage 2's option decisions together "
                        "(re-learns the other decisions stage 2 alone wears down; 0 = none)")
    p.add_argument("--joint-lr", type=float, default=2e-3)
    p.add_argument("--joint-hasty", type=float, default=None,
                   help="share of hasty episodes among stage 3's demonstrations (default: --hasty); more hasty "
                        "episodes make the policy choose options less often, a decision left to ES")
    p.add_argument("--init", type=Path, default=None,
                   help="start from this policy folder (its weights and tokenizer) instead of running stage 1")
    p.add_argument("--quick", action="store_true", help="a seconds-long run (tests): few goals and steps, no eval")
    p.add_argument("--log-every", type=int, default=50)
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.demo_goals, args.steps, args.batch, args.eval_goals = 24, 2, 8, 0
    t0 = time.perf_counter()
    import jax

    from envs.webshop_bridge import load_webshop
    from esjax.agent.tokenizer import train_bpe
    from esjax.agent.webshop import WebShopAgent
    from esjax.model.config import from_hf_dict
    from esjax.model.params import init_params, param_count

    shop = load_webshop(DATA, seed=CATALOG_SEED)
    train_goals = list(shop.split("train"))[: args.demo_goals]
    stage1 = {}
    if args.init is None:
        steps, demo_reward, skipped = demonstrations(shop, train_goals, args.hasty, args.seed)
        tokenizer = train_bpe(tokenizer_corpus(shop, steps), MODEL["vocab_size"])
        agent = WebShopAgent(tokenizer, "compact", score_norm=SCORE_NORM)
        data = encode_steps(agent, steps)
        print(f"{len(steps)} demonstration steps from {len(train_goals)} goals (demonstrator reward "
              f"{demo_reward:.3f}); {time.perf_counter() - t0:.1f} s", flush=True)
        config = from_hf_dict(MODEL, "MODEL")
        params = init_params(config, jax.random.key(args.seed))
        t_train = time.perf_counter()
        params, losses, accs = train(config, params, data, args.steps, args.lr, args, "stage 1")
        stage1 = {"demo_reward": demo_reward, "demo_steps": len(steps), "demo_skipped": skipped,
                  "epochs": args.steps * args.batch / len(steps), "final_loss": float(np.mean(losses[-50:])),
                  "final_acc": float(np.mean(accs[-50:])), "seconds": time.perf_counter() - t_train}
    else:
        from esjax.agent.policy import load_policy

        start = load_policy("hf", str(args.init))
        config, params, tokenizer = start.config, start.params, start.tokenizer
        agent = WebShopAgent(tokenizer, "compact", score_norm=SCORE_NORM)
        stage1 = {"init": str(args.init), "init_digest": params_digest(params)}
    stage2, stage3 = {}, {}
    if args.option_steps or args.joint_steps:
        option_data, held_out = option_decisions(shop, train_goals, args.seed), option_decisions(
            shop, list(shop.split("eval"))[: args.eval_goals or 100], args.seed, max_values=1000)
        options, held = encode_steps(agent, option_data, is_option), encode_steps(agent, held_out, is_option)

        def held_out_accuracy(p) -> str:
            return f"held-out option accuracy {option_accuracy(config, p, held):.3f}"
    if args.option_steps:
        t_opt = time.perf_counter()
        before = option_accuracy(config, params, held)
        params, losses, _ = train(config, params, options, args.option_steps, args.option_lr, args, "stage 2",
                                  held_out_accuracy)
        stage2 = {"decisions": len(option_data), "held_out": len(held_out), "held_out_acc_before": before,
                  "held_out_acc": option_accuracy(config, params, held), "final_loss": float(np.mean(losses[-50:])),
                  "seconds": time.perf_counter() - t_opt}
        print(f"stage 2: held-out option accuracy {before:.3f} -> {stage2['held_out_acc']:.3f}", flush=True)
    if args.joint_steps:
        t_joint = time.perf_counter()
        joint_hasty = args.hasty if args.joint_hasty is None else args.joint_hasty
        if args.init is not None or joint_hasty != args.hasty:  # stage 1's demonstrations are not at hand
            steps, _, _ = demonstrations(shop, train_goals, joint_hasty, args.seed)
        demos = encode_steps(agent, steps)
        joint = {**{f"demo/{k}": v for k, v in demos.items()}, **{f"option/{k}": v for k, v in options.items()}}
        params, losses, accs = train(config, params, joint, args.joint_steps, args.joint_lr, args, "stage 3",
                                     held_out_accuracy)
        stage3 = {"demo_steps": len(steps), "hasty": joint_hasty, "decisions": len(option_data),
                  "held_out": len(held_out),
                  "held_out_acc": option_accuracy(config, params, held), "final_loss": float(np.mean(losses[-50:])),
                  "seconds": time.perf_counter() - t_joint}
        print(f"stage 3: held-out option accuracy {stage3['held_out_acc']:.3f}", flush=True)
    digest = params_digest(params)

    evals = []
    if args.eval_goals:
        from envs.webshop_bridge import InProcessEnvPool, RandomPolicy, evaluate
        from esjax.train.standalone_eval import evaluate_policy

        for split in ("test", "eval"):
            goals = list(shop.split(split))[: args.eval_goals]
            res = evaluate_policy(config, params, agent, functools.partial(InProcessEnvPool, shop), goals,
                                  max_steps=MAX_STEPS)
            evals.append({"name": f"{len(goals)} {split} goals", "policy": "this policy", **res})
            rnd, _ = evaluate(shop, lambda: RandomPolicy(0), goals, max_steps=MAX_STEPS)
            evals.append({"name": f"{len(goals)} {split} goals", "policy": "random clicking",
                          "score": rnd.score, "success_rate": rnd.success_rate})
            print(f"greedy on {len(goals)} {split} goals: score {res['score']:.1f}, success "
                  f"{100 * res['success_rate']:.1f}% (random clicking {rnd.score:.1f})", flush=True)

    write_folder(args.out, config, params, tokenizer)
    folder_bytes = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    report = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "param_count": param_count(params), "digest": digest, "stage1": stage1, "stage2": stage2, "stage3": stage3,
        "splits": {s: len(shop.split(s)) for s in ("train", "eval", "test")},
        "total_seconds": time.perf_counter() - t0, "folder_bytes": folder_bytes,
        "machine": f"{platform.machine()} x{os.cpu_count()} CPU, jax {jax.__version__}",
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "evals": [{k: v for k, v in e.items() if k != "rewards"} for e in evals],
    }
    if not args.quick:
        write_readme(args.out, report)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
