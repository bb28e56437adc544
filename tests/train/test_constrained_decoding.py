"""Constrained decoding in generate mode (``agent.constrain: clicks``).

* decode lanes (:mod:`esjax.agent.lanes`): a row with choices takes, at each token, the best (greedy) or a sampled
  token among those that continue a choice still matching its turn — equal to a step-by-step reference on the full
  logits — alone, beside free rows, with several decode steps per call, when it resumes mid-turn, and after its
  lane row served a constrained turn before;
* the agent's choices (both tokenisations of each click, none on a page with a search bar) and the config check;
* the engine on the packaged real WebShop data with the shipped generative policy: no invalid click.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from esjax.agent.lanes import PREFILL_BUCKETS, Lane, RowState, Sampling, generate_rows, split_seed
from esjax.model.decoder import default_positions, forward_last, init_cache
from esjax.model.params import init_params
from esjax.model.testing import tiny_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    config = tiny_config()
    return config, init_params(config, jax.random.key(0))


def _next_logits(config, params, ids):
    tokens = jnp.asarray([ids], jnp.int32)
    mask = jnp.ones_like(tokens, bool)
    cache = init_cache(config, 1, len(ids), params["embed"]["embedding"].dtype)
    return np.asarray(forward_last(config, params, tokens, default_positions(mask), mask, cache)[0][0])


def _reference(config, params, prompt, choices, new_tokens, partial=()):
    """Greedy constrained decoding one token at a time on the full logits, after the turn's ``partial`` tokens (free
    once no choice continues)."""
    out = list(partial)
    for _ in range(new_tokens):
        logits = _next_logits(config, params, prompt + out)
        allowed = sorted({c[len(out)] for c in choices if len(c) > len(out) and list(c[:len(out)]) == out})
        if allowed:
            masked = np.full_like(logits, -np.inf)
            masked[allowed] = logits[allowed]
            logits = masked
        out.append(int(np.argmax(logits)))
    return out[len(partial):]


PROMPTS = [[3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13], [5], list(range(20, 37))]
CHOICES = [[(40, 41, 42), (40, 43), (50, 51, 52, 53, 54)], None, [(9,), (60, 61), (60, 62, 63)],
           [(70 + i, 80 + i) for i in range(20)]]  # 20 choices: wider than the lane's first 16


@pytest.mark.parametrize("steps", [1, 3])
def test_greedy_constrained_rows_equal_the_step_by_step_reference(tiny, steps):
    config, params = tiny
    got = generate_rows(config, params, PROMPTS, max_new_tokens=7, greedy=[True] * 4, steps=steps, choices=CHOICES)
    free = generate_rows(config, params, PROMPTS, max_new_tokens=7, greedy=[True] * 4, steps=steps)
    for r, prompt in enumerate(PROMPTS):
        assert got[r] == _reference(config, params, prompt, CHOICES[r] or [], 7), r
        if CHOICES[r]:
            assert any(tuple(got[r][:len(c)]) == c for c in CHOICES[r])
    assert got[1] == free[1]  # a free row beside constrained ones decodes as it does alone
    assert got[0][:3] != free[0][:3]  # the random model would not write a choice on its own


def test_sampled_constrained_rows_write_a_choice(tiny):
    config, params = tiny
    n = 24
    prompts = [PROMPTS[r % 4] for r in range(n)]
    choices = [CHOICES[r % 4] or CHOICES[0] for r in range(n)]
    got = generate_rows(config, params, prompts, max_new_tokens=5, sampling=Sampling(temperature=1.5, top_k=50),
                        seeds=list(range(n)), steps=2, choices=choices)
    picked = set()
    for r in range(n):
        (choice,) = [c for c in choices[r] if tuple(got[r][:len(c)]) == c]
        picked.add(choice)
    assert len(picked) >= 4  # sampling spreads over the choices


def test_a_turn_resumed_mid_choice_continues_it_and_rows_reused_for_free_turns_are_free(tiny):
    config, params = tiny
    lane = Lane(config, 2, PREFILL_BUCKETS.length(16) + 16, params["embed"]["embedding"].dtype, Sampling())
    prompt, choices = PROMPTS[0], CHOICES[0]
    want = _reference(config, params, prompt, choices, 3, partial=[50])
    slot = lane.free_row()
    first = lane.prefill(params, None, 0.0, [(slot, prompt + [50], RowState((0, 0, False), *split_seed(0), True,
                                                                            count=1, choices=choices))], 1)
    tokens = [int(np.asarray(first)[0])]
    for _ in range(2):
        tokens.append(int(np.asarray(lane.decode(params, None, 0.0, 1))[slot, 0]))
    assert tokens == want == [51, 52, 53]
    lane.release(slot)
    slot = lane.free_row()  # the same lane row, now a free turn
    free = generate_rows(config, params, [prompt], max_new_tokens=4, greedy=[True])[0]
    first = lane.prefill(params, None, 0.0, [(slot, prompt, RowState((0, 0, False), *split_seed(0), True))], 1)
    tokens = [int(np.asarray(first)[0])]
    for _ in range(3):
        tokens.append(int(np.asarray(lane.decode(params, None, 0.0, 1))[slot, 0]))
    assert tokens == free


def test_prefilling_rows_in_chunks_equals_prefilling_them_at_once(tiny):
    """``max_rows`` splits a prefill into programs of a few rows (bounding its memory): members, constrained and
    free rows and sampled turns come out the same token for token as in one program, and the cache the same up to
    float rounding (XLA's CPU kernels sum in another order for another batch size: ~1e-6 here)."""
    from esjax.es.noise import NoiseSpec

    config, params = tiny
    noise = NoiseSpec(seed=1, rank=1)
    entries = [(r, PROMPTS[r % 4], RowState((0, r // 2, r % 3 > 0), *split_seed(r), r % 2 == 0,
                                            choices=CHOICES[r % 4])) for r in range(7)]
    lanes, outs = [], []
    for max_rows in (None, 2):
        lane = Lane(config, 8, PREFILL_BUCKETS.length(17) + 8, params["embed"]["embedding"].dtype,
                    Sampling(temperature=1.0))
        first = lane.prefill(params, noise, 0.5, entries, 4, max_rows=max_rows)
        outs.append((np.asarray(first), np.asarray(lane.decode(params, noise, 0.5, 4))))
        lanes.append(lane)
    assert [lane.prefill_calls for lane in lanes] == [1, 4]  # 7 rows: one program of 8, or 4 of 2
    np.testing.assert_array_equal(outs[1][0], outs[0][0])
    np.testing.assert_array_equal(outs[1][1], outs[0][1])
    np.testing.assert_array_equal(np.asarray(lanes[1].cache["valid"]), np.asarray(lanes[0].cache["valid"]))
    for name in ("k", "v"):
        np.testing.assert_allclose(np.asarray(lanes[1].cache[name]), np.asarray(lanes[0].cache[name]), atol=1e-4)


# ------------------------------------------------------------------------------------------------ agent and engine
@pytest.fixture(scope="module")
def shipped():
    from envs.webshop_bridge import load_webshop
    from esjax.agent.policy import load_policy
    from esjax.config import load_config

    config = load_config(REPO / "configs" / "generate.yaml", ["agent.constrain=clicks"])
    policy = load_policy(config.model.source, embedded=config.model.embedded)
    return config, policy, load_webshop(config.env.data, seed=config.env.catalog_seed)


def test_the_agent_offers_every_click_in_both_tokenisations_and_none_on_search_pages(shipped):
    from envs.webshop_bridge.task import generate_agent

    config, policy, _ = shipped
    agent = generate_agent(policy, config.agent)
    instruction = "Find me red shirts, and price lower than 30.00 dollars"
    memory = agent.new_memory(instruction)
    search_page = {"has_search_bar": True, "clickables": ["search"]}
    assert agent.reply_choices(search_page, memory) is None  # 'clicks': searches stay free text
    page = {"has_search_bar": False, "clickables": ["back to search", "b07hrfsnl4", "next >"]}
    choices = agent.reply_choices(page, memory)
    texts = [agent.tokenizer.decode(list(c)) for c in choices]
    assert texts == [f"{space}click[{c}]" for c in page["clickables"] for space in ("", " ")]
    assert len(choices[3]) == 4  # ' click', '[', the product id, ']' (the embedded tokenizer)
    free = generate_agent(policy, config.agent.model_copy(update={"constrain": "none"}))
    assert free.reply_choices(page, memory) is None
    copying = generate_agent(policy, config.agent.model_copy(update={"constrain": "all"}))
    assert copying.reply_choices(page, memory) == choices
    searches = {copying.tokenizer.decode(list(c)) for c in copying.reply_choices(search_page, memory)}
    words = instruction.split()
    want = {f"search[{' '.join(words[i:j])}]" for i in (0, 2) for j in range(i + 1, len(words) + 1)}
    assert searches == want | {" " + s for s in want}


def test_constrained_replies_cannot_reason_first():
    from esjax.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="agent.constrain"):
        load_config(None, ["agent.mode=generate", "agent.constrain=clicks", "agent.reasoning=true"])


@pytest.mark.parametrize("constrain", ["clicks", "all"])
def test_the_shipped_policy_constrained_never_acts_off_the_page(shipped, constrain):
    """'clicks': no click on something not on the page; 'all': also every search a word prefix of the instruction."""
    from envs.webshop_bridge import InProcessEnvPool
    from envs.webshop_bridge.task import generate_agent
    from esjax.train.standalone_eval import evaluate_policy

    config, policy, shop = shipped
    agent = generate_agent(policy, config.agent.model_copy(update={"constrain": constrain}))
    res = evaluate_policy(policy.config, policy.params, agent, functools.partial(InProcessEnvPool, shop),
                          list(shop.split("eval"))[:8],
                          max_steps=config.env.max_steps, max_new_tokens=config.agent.max_new_tokens, traces=True)
    assert res["invalid_action_rate"] == 0.0 and res["score"] > 0
    clicks = [a for line in res["traces"] for a, _ in line["actions"] if a.startswith("click[")]
    assert len(clicks) >= 2 * 8 and sum(line["end"] == "bought" for line in res["traces"]) >= 6
    actions_per_episode = sum(len(line["actions"]) for line in res["traces"]) / 8
    assert res["tokens_per_episode"]["generated"] >= actions_per_episode  # every reply is at least one token
    if constrain == "all":
        for line in res["traces"]:
            words = line["instruction"].split()
            query = line["actions"][0][0][len("search["):-1].split()
            assert query in [words[i:j] for i in (0, 2) for j in range(i + 1, len(words) + 1)]
