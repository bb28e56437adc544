"""Can behaviour cloning teach the shipped policy to match option values to the instruction?

The headroom measurement (experiments/headroom.py) shows that the shipped policy picks the instruction's option
value barely above chance, which caps what ES on its norm scales can gain. This probe fine-tunes the policy (or a
fresh one) by behaviour cloning on **option decisions only** — item pages where WebShop's oracle teacher clicks an
option value the goal names — and reports the held-out accuracy (eval-split goals) of the demonstrated value
under the policy's candidate scores (mean per-token log-likelihood), every ``--report-every`` steps.

    python -m experiments.option_matching_probe --steps 400 --init shipped --lr 1e-3
"""

from __future__ import annotations

import argparse
import time


def make_copy_step(recipe, config, lr, steps):
    """Optimizer step on the 'copy' loss: the demonstrated value's tokens under the policy, its candidate alone."""
    import jax.numpy as jnp

    def loss_fn(params, batch):
        pick = batch["target"][:, None, None]
        c_tok = jnp.take_along_axis(batch["c_tok"], pick, axis=1)
        c_mask = jnp.take_along_axis(batch["c_mask"], pick, axis=1)
        logp = recipe.candidate_token_logps(config, params, batch["p_tok"], batch["p_mask"], c_tok, c_mask)
        value = c_mask.at[:, :, 0].set(False)  # the value's tokens, not the shared 'choose'
        return -(jnp.where(value, logp, 0.0).sum() / value.sum()), 0.0

    return recipe.jitted_step(loss_fn, recipe.make_optimizer(lr, steps, 0.01))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--init", choices=["shipped", "scratch"], default="shipped")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--held-out-goals", type=int, default=400, help="eval-split goals the teacher plays")
    parser.add_argument("--report-every", type=int, default=100)
    parser.add_argument("--loss", choices=["softmax", "copy"], default="softmax",
                        help="softmax over candidates, or 'copy': log-likelihood of the demonstrated value's tokens "
                             "(its candidate alone: cheap, dense)")
    parser.add_argument("--options-only", action="store_true",
                        help="softmax over the option candidates only (teach which option, not whether)")
    args = parser.parse_args(argv)

    import jax

    from envs.webshop_bridge import load_webshop
    from esjax.agent.policy import load_policy
    from esjax.agent.webshop import WebShopAgent
    from esjax.model.params import init_params
    from experiments.lib import pretrain as recipe

    shop = load_webshop(recipe.DATA, seed=recipe.CATALOG_SEED)

    def option_steps(goals):
        steps, _, _ = recipe.demonstrations(shop, goals, 0.0, 0)  # never hasty: every goal option is clicked
        return [s for s in steps if "| page: item |" in s[0] and recipe.is_option(s[1][s[2]])]

    train, held_out = option_steps(list(shop.split("train"))), option_steps(
        list(shop.split("eval"))[: args.held_out_goals])
    policy = load_policy("embedded")
    agent = WebShopAgent(policy.tokenizer, "compact", score_norm=recipe.SCORE_NORM)
    eligible = recipe.is_option if args.options_only else None
    train_data = recipe.encode_steps(agent, train, eligible)
    held_data = recipe.encode_steps(agent, held_out, eligible)
    config = policy.config
    params = policy.params if args.init == "shipped" else init_params(config, jax.random.key(0))
    step = (recipe.make_train_step(config, args.lr, args.steps, 0.01) if args.loss == "softmax"
            else make_copy_step(recipe, config, args.lr, args.steps))
    opt_state = recipe.make_optimizer(args.lr, args.steps, 0.01).init(params)

    def accuracy() -> float:
        return recipe.option_accuracy(config, params, held_data)

    print(f"{len(train)} train / {len(held_out)} held-out option decisions; init {args.init}; "
          f"held-out accuracy before: {accuracy():.3f}", flush=True)
    started = time.perf_counter()
    for i, (kind, idx) in enumerate(recipe.batch_plan(train_data, args.batch, args.steps, 0), 1):
        params, opt_state, loss, _ = step(params, opt_state, {k: v[idx] for k, v in train_data[kind].items()})
        if i % args.report_every == 0 or i == args.steps:
            print(f"step {i}: loss {float(loss):.3f}, held-out accuracy {accuracy():.3f} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
