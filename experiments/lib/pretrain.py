"""What the policy-pretraining scripts share (``pretrain_default_policy.py``, ``pretrain_generate_policy.py``, and the
probes built on their recipe): the shop and architecture of the embedded policies, the noisy teacher and its
demonstrations, their encoding into fixed-shape batches, the differentiable candidate score and its AdamW step, and
the HF folder a policy is exported to. The recipe itself is described in ``experiments/pretrain_default_policy.py``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from pathlib import Path

import numpy as np

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
    from envs.webshop_bridge.task import shop_texts

    seen = set()
    for prompt, cands, _ in steps:
        for text in (prompt, *(" " + c for c in cands)):
            if text not in seen:
                seen.add(text)
                yield text
    yield from shop_texts(shop)


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def webshop_group(agent, step) -> str:
    """The padding group of a WebShop step: page kind and, on item pages, candidate count and length (a results
    page has 12 long candidates; an item page from 3 to 50+ mostly short ones)."""
    from esjax.agent.buckets import next_power_of_two
    from esjax.agent.webshop import Candidate

    if "| page: results |" in step[0]:
        return "results"
    longest = max(len(agent.encode_candidate(Candidate(t, ""))) for t in step[1])
    return f"item-k{max(8, next_power_of_two(len(step[1])))}-c{8 if longest <= 8 else 24}"


def encode_steps(agent, steps, eligible=None, group=webshop_group, candidate_round: int = 8):
    """Fixed-shape arrays of the steps, encoded exactly as the agent's ``step_inputs`` does.

    ``steps``: ``(prompt_text, candidate_texts, target)``; the agent needs ``encode_prompt(text)`` and
    ``encode_candidate(candidate)`` (reading ``candidate.text``). ``eligible(text) -> bool``, if given, limits each
    step's softmax to the candidates it accepts (``valid``).

    Steps are grouped by ``group(agent, step) -> key`` (default: :func:`webshop_group`), and each group is padded
    to its own shapes, so a batch wastes little compute on padding (a handful of compiled programs): prompts to a
    multiple of 16 tokens, candidates to a multiple of ``candidate_round``.
    """
    from esjax.agent.batching import left_pad, right_pad
    from esjax.agent.webshop import Candidate

    keyed: dict[str, list] = {}
    for step in steps:
        keyed.setdefault(group(agent, step), []).append(step)
    groups = {}
    for key, chosen in sorted(keyed.items()):
        n = len(chosen)
        prompts = [agent.encode_prompt(p) for p, _, _ in chosen]
        cands = [[agent.encode_candidate(Candidate(t, "")) for t in cs] for _, cs, _ in chosen]
        plen = round_up(max(len(p) for p in prompts), 16)
        K = max(len(cs) for cs in cands)
        clen = round_up(max(len(c) for cs in cands for c in cs), candidate_round)
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
# The differentiable candidate score and its optimizer step
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
    """``steps`` AdamW steps of the candidate cross-entropy over ``data`` (groups of :func:`encode_steps`); returns
    params and the per-step losses and accuracies. ``args``: the script's options ``batch``, ``seed``,
    ``weight_decay`` and ``log_every``.

    ``report(params) -> str``, if given, is printed with every tenth log line (e.g. a held-out accuracy).
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


# ---------------------------------------------------------------------------------------------------------
# Generate mode (the generative policy's recipe and the probes of it)
# ---------------------------------------------------------------------------------------------------------

#: Generate mode's prompt budget for this policy (``agent.max_prompt_tokens`` of the configs that use it).
MAX_PROMPT_TOKENS = 384
#: Reply budget of the greedy evaluation (``agent.max_new_tokens``); the report states the longest reply learned.
MAX_REPLY_TOKENS = 64


def generate_agent(policy, max_prompt_tokens: int = MAX_PROMPT_TOKENS, constrain: str = "none"):
    """The agent generate mode builds for ``policy`` (chat template, stop tokens, prompt budget, constrained
    clicks or not)."""
    from envs.webshop_bridge.task import generate_agent as webshop_generate_agent
    from esjax.config import load_config

    section = load_config(None, ["agent.mode=generate", f"agent.max_prompt_tokens={max_prompt_tokens}",
                                 f"agent.constrain={constrain}"]).agent
    return webshop_generate_agent(policy, section)
