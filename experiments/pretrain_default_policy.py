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

Run: ``python experiments/pretrain_default_policy.py`` (about ten minutes on a 2-core CPU);
``--quick`` is a seconds-long version for tests; ``--out DIR`` writes elsewhere.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "esjax" / "assets" / "default_policy"

#: The shop of configs/default.yaml (env.data, env.catalog_seed): WebShop's real 1,000-product set.
DATA = "webshop_small"
CATALOG_SEED = 0

#: The policy's architecture (Qwen2, tied embeddings); ``vocab_size`` is the BPE vocabulary size.
MODEL = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 2048, "hidden_size": 64,
    "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "hidden_act": "silu", "bos_token_id": None, "eos_token_id": 1, "pad_token_id": 0, "torch_dtype": "float32",
}

#: How the policy compares candidates (``agent.score_norm`` of the configs that use it).
SCORE_NORM = "mean"

#: Episode step cap of the evaluation (configs/default.yaml's env.max_steps; ReAct and verl-agent use 15).
MAX_STEPS = 15

CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<eos>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


# ---------------------------------------------------------------------------------------------------------
# Demonstrations
# ---------------------------------------------------------------------------------------------------------


class Teacher:
    """The noisy teacher of the recipe: WebShop's oracle limited to what the first results page shows.

    Opens the goal's product if it is on results page 1, else the first hit (never pages); clicks the goal's
    option values; buys. A *hasty* teacher buys right after opening the product.
    """

    def __init__(self, goal, hasty: bool):
        self.goal, self.hasty = goal, hasty
        self.chosen: set[str] = set()

    def act(self, observation: str, available: dict) -> str | None:
        from esjax.agent.webshop import page_kind

        kind = page_kind(available)
        clickables = available.get("clickables", [])
        if kind == "search":
            return f"search[{self.goal.instruction_text}]"
        if kind == "results":
            target = self.goal.asin.lower()
            products = [c for c in clickables if c not in ("back to search", "next >", "< prev")]
            if target in products:
                return f"click[{target}]"
            return f"click[{products[0]}]" if products else None
        if kind == "item":
            if not self.hasty:
                for value in self.goal.option_values():
                    if value in clickables and value not in self.chosen:
                        self.chosen.add(value)
                        return f"click[{value}]"
            return "click[buy now]"
        return None


def demonstrations(shop, goals, hasty: float, seed: int, max_steps: int = 15):
    """``(prompt_text, candidate_texts, target)`` for every multi-candidate step of the teacher.

    Also returns the teacher's mean reward and how many steps were skipped (action not a candidate).
    """
    from envs.webshop_bridge import WebShopTextEnv
    from esjax.agent.webshop import EpisodeMemory, candidates_for, compact_prompt, page_kind

    env = WebShopTextEnv(shop)
    rng = np.random.default_rng([seed, 17])
    hasty_flags = rng.random(len(goals)) < hasty
    steps, rewards, skipped = [], [], 0
    for goal, is_hasty in zip(goals, hasty_flags):
        observation, _ = env.reset(goal)
        teacher = Teacher(env.goal, bool(is_hasty))
        memory = EpisodeMemory(env.instruction)
        reward = 0.0
        for _ in range(max_steps):
            available = env.available_actions()
            kind = page_kind(available)
            action = teacher.act(observation, available)
            if action is None:
                break
            candidates = candidates_for(observation, available, memory)
            match = [i for i, c in enumerate(candidates) if c.action == action]
            if match:
                if len(candidates) > 1:
                    steps.append((compact_prompt(observation, available, memory), [c.text for c in candidates],
                                  match[0]))
                memory.record(kind, candidates[match[0]])
            else:
                skipped += 1
            observation, r, done, _ = env.step(action)
            if done:
                reward = r
                break
        rewards.append(reward)
    return steps, float(np.mean(rewards)), skipped


def tokenizer_corpus(shop, steps):
    from esjax.train.parts import shop_texts

    seen = set()
    for prompt, cands, _ in steps:
        for text in (prompt, *(" " + c for c in cands)):
            if text not in seen:
                seen.add(text)
                yield text
    yield from shop_texts(shop)


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def encode_steps(agent, steps, eligible=None):
    """Fixed-shape arrays of the steps, encoded exactly as ``WebShopAgent.step_inputs`` does.

    ``eligible(text) -> bool``, if given, limits each step's softmax to the candidates it accepts (``valid``).

    Steps are grouped by page kind and, on item pages, by candidate count and length (a results page has 12
    long candidates; an item page from 3 to 50+ mostly short ones), and each group is padded to its own shapes,
    so a batch wastes little compute on padding (a handful of compiled programs).
    """
    from esjax.agent.batching import left_pad, right_pad
    from esjax.agent.buckets import next_power_of_two
    from esjax.agent.webshop import Candidate

    keyed: dict[str, list] = {}
    for step in steps:
        if "| page: results |" in step[0]:
            key = "results"
        else:
            longest = max(len(agent.encode_candidate(Candidate(t, ""))) for t in step[1])
            key = f"item-k{max(8, next_power_of_two(len(step[1])))}-c{8 if longest <= 8 else 24}"
        keyed.setdefault(key, []).append(step)
    groups = {}
    for key, chosen in sorted(keyed.items()):
        n = len(chosen)
        prompts = [agent.encode_prompt(p) for p, _, _ in chosen]
        cands = [[agent.encode_candidate(Candidate(t, "")) for t in cs] for _, cs, _ in chosen]
        plen = round_up(max(len(p) for p in prompts), 16)
        K = max(len(cs) for cs in cands)
        clen = round_up(max(len(c) for cs in cands for c in cs), 8)
        p_tok, p_mask = left_pad(prompts, n, plen)
        flat = [c for cs in cands for c in cs + [[]] * (K - len(cs))]
        c_tok, c_mask = right_pad(flat, n * K, clen)
        texts = [cs for _, cs, _ in chosen]
        valid = np.array([[k < len(cs) and (eligible is None or eligible(cs[k])) for k in range(K)]
                          for cs in texts])
        target = np.array([t for _, _, t in chosen], np.int32)
        groups[key] = {"p_tok": p_tok, "p_mask": p_mask, "c_tok": c_tok.reshape(n, K, clen),
                       "c_mask": c_mask.reshape(n, K, clen), "valid": valid, "target": target}
    return groups


def batch_plan(groups, batch: int, steps: int, seed: int):
    """``steps`` batches ``(kind, indices)``: epochs of per-kind shuffles, batches in a shuffled order."""
    rng = np.random.default_rng([seed, 29])
    plan = []
    while len(plan) < steps:
        epoch = []
        for kind in sorted(groups):
            n = len(groups[kind]["target"])
            perm = rng.permutation(n)
            perm = np.concatenate([perm, perm[: (-n) % batch]])  # wrap to whole batches
            epoch += [(kind, perm[i:i + batch]) for i in range(0, len(perm), batch)]
        plan += [epoch[i] for i in rng.permutation(len(epoch))]
    return plan[:steps]


# ---------------------------------------------------------------------------------------------------------
# The differentiable candidate score and the training loop
# ---------------------------------------------------------------------------------------------------------


def candidate_token_logps(config, params, p_tok, p_mask, c_tok, c_mask):
    """Each candidate token's log-likelihood given the prompt and the candidate's earlier tokens, ``[B, K, L]``.

    The prompt runs once into a KV cache and the candidates run on top of it (as ``score_candidates`` does).
    """
    import jax.numpy as jnp

    from esjax.agent.scoring import token_logprobs
    from esjax.model.decoder import default_positions, forward, init_cache

    rows, plen = p_tok.shape
    _, K, clen = c_tok.shape
    cache = init_cache(config, rows, plen + clen, params["embed"]["embedding"].dtype)
    hidden_p, cache = forward(config, params, p_tok, default_positions(p_mask), p_mask, cache, return_hidden=True)
    last = jnp.repeat(hidden_p[:, -1:], K, axis=0)
    cache = {"k": jnp.repeat(cache["k"], K, axis=1), "v": jnp.repeat(cache["v"], K, axis=1),
             "valid": jnp.repeat(cache["valid"], K, axis=0), "index": cache["index"]}
    c_pos = jnp.repeat(p_mask.sum(axis=1).astype(jnp.int32), K)[:, None] + jnp.arange(clen, dtype=jnp.int32)[None]
    c_tok = c_tok.reshape(rows * K, clen)
    c_mask = c_mask.reshape(rows * K, clen)
    hidden_c, _ = forward(config, params, c_tok, c_pos, c_mask, cache, return_hidden=True)
    pred = jnp.concatenate([last, hidden_c[:, :-1]], axis=1)
    return token_logprobs(config, params, pred, c_tok, None).reshape(rows, K, clen)


def candidate_scores(config, params, p_tok, p_mask, c_tok, c_mask):
    """Each candidate's mean per-token log-likelihood given its prompt, ``[B, K]`` (as ``score_candidates``)."""
    import jax.numpy as jnp

    from esjax.agent.scoring import normalize_scores

    logp = candidate_token_logps(config, params, p_tok, p_mask, c_tok, c_mask)
    return normalize_scores(jnp.where(c_mask, logp, 0.0).sum(axis=2), c_mask.sum(axis=2), SCORE_NORM)


def make_optimizer(lr: float, steps: int, weight_decay: float):
    import optax

    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, min(50, steps // 4), steps, lr * 0.1)
    return optax.adamw(schedule, weight_decay=weight_decay)


@functools.lru_cache(maxsize=8)
def make_train_step(config, lr: float, steps: int, weight_decay: float):
    """The jitted AdamW step (cached, so repeated runs in one process compile once)."""
    import jax.numpy as jnp
    import optax

    optimizer = make_optimizer(lr, steps, weight_decay)

    def loss_fn(params, batch):
        scores = candidate_scores(config, params, batch["p_tok"], batch["p_mask"], batch["c_tok"], batch["c_mask"])
        scores = jnp.where(batch["valid"], scores, -1e9)
        loss = optax.softmax_cross_entropy_with_integer_labels(scores, batch["target"]).mean()
        acc = (jnp.argmax(scores, axis=1) == batch["target"]).mean()
        return loss, acc

    return jitted_step(loss_fn, optimizer)


def jitted_step(loss_fn, optimizer):
    """The jitted optimizer step of ``loss_fn(params, batch) -> (loss, aux)``: ``(params, state, loss, aux)``."""
    import jax
    import optax

    @jax.jit
    def step(params, opt_state, batch):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, aux

    return step


def train(config, params, data, steps: int, lr: float, args, stage: str, report=None):
    """``steps`` AdamW steps of the candidate cross-entropy over ``data``; returns params and the per-step logs.

    ``report(params) -> str``, if given, is printed with every log line (e.g. a held-out accuracy).
    """
    opt_state = make_optimizer(lr, steps, args.weight_decay).init(params)
    train_step = make_train_step(config, lr, steps, args.weight_decay)
    started, losses, accs = time.perf_counter(), [], []
    for i, (kind, idx) in enumerate(batch_plan(data, args.batch, steps, args.seed)):
        params, opt_state, loss, acc = train_step(params, opt_state, {k: v[idx] for k, v in data[kind].items()})
        losses.append(float(loss))
        accs.append(float(acc))
        if args.log_every and (i + 1) % args.log_every == 0:
            print(f"{stage} step {i + 1}/{steps}: loss {np.mean(losses[-args.log_every:]):.3f} "
                  f"acc {np.mean(accs[-args.log_every:]):.3f} ({time.perf_counter() - started:.0f} s)"
                  f"{'' if report is None or (i + 1) % (10 * args.log_every) else ' ' + report(params)}", flush=True)
    return params, losses, accs


def is_option(text: str) -> bool:
    """Stage 2's softmax runs over the ``choose <value>`` candidates only: it teaches *which* value, not *whether*."""
    return text.startswith("choose ")


def option_decisions(shop, goals, seed: int, max_values: int = 16):
    """The item-page steps where the never-hasty teacher chooses one of the goal's option values.

    Each step keeps only ``choose <value>`` candidates (stage 2's softmax runs over them alone), at most
    ``max_values`` of them: the demonstrated one and a seeded random sample of the others, in page order.
    """
    steps, _, _ = demonstrations(shop, goals, 0.0, seed)
    rng = np.random.default_rng([seed, 31])
    out = []
    for prompt, candidates, target in steps:
        if "| page: item |" not in prompt or not is_option(candidates[target]):
            continue
        others = [i for i, c in enumerate(candidates) if is_option(c) and i != target]
        keep = sorted([target, *rng.permutation(others)[: max_values - 1].tolist()])
        out.append((prompt, [candidates[i] for i in keep], keep.index(target)))
    return out


def option_accuracy(config, params, groups) -> float:
    """Share of option decisions where the demonstrated value has the best score among the offered values."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def hits(params, batch):
        scores = candidate_scores(config, params, batch["p_tok"], batch["p_mask"], batch["c_tok"], batch["c_mask"])
        return (jnp.argmax(jnp.where(batch["valid"], scores, -1e9), 1) == batch["target"]).sum()

    correct = total = 0
    for data in groups.values():
        for i in range(0, len(data["target"]), 64):
            batch = {k: v[i:i + 64] for k, v in data.items()}
            correct += int(hits(params, batch))
            total += len(batch["target"])
    return correct / max(total, 1)


def params_digest(params) -> str:
    import jax

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------------------


def write_folder(out: Path, config, params, tokenizer, model: dict | None = None) -> None:
    """The HF folder of a policy of architecture ``model`` (default: ``MODEL``) with the recipe's chat template."""
    from esjax.model.hf import export_pretrained

    model = MODEL if model is None else model
    out.mkdir(parents=True, exist_ok=True)
    export_pretrained(out, config, params, raw_config={k: v for k, v in model.items() if k != "torch_dtype"})
    tokenizer.save(str(out / "tokenizer.json"))
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model["max_position_embeddings"],
                  "bos_token": None, "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                  "padding_side": "left", "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")


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
        from envs.webshop_bridge import RandomPolicy, evaluate
        from esjax.train.standalone_eval import evaluate_policy

        for split in ("test", "eval"):
            goals = list(shop.split(split))[: args.eval_goals]
            res = evaluate_policy(config, params, agent, shop, goals, max_steps=MAX_STEPS)
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
