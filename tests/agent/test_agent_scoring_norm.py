"""Candidate-score normalisation and the WebShop agent's candidate texts on real pages."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from esjax.agent.scoring import dispatch_scores, normalize_scores, score_candidates
from esjax.model.params import init_params
from esjax.model.testing import tiny_config

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]
CANDS = [[[1, 2], [3], [4, 5, 6, 7]], [[7], []]]


@pytest.fixture(scope="module")
def model():
    config = tiny_config(tie_word_embeddings=True)
    return config, init_params(config, jax.random.key(1), std=0.2)


def test_mean_is_the_sum_divided_by_each_candidates_token_count(model):
    config, params = model
    summed = score_candidates(config, params, PROMPTS, CANDS, norm="sum")
    mean = score_candidates(config, params, PROMPTS, CANDS, norm="mean")
    for r, cands in enumerate(CANDS):
        for k, cand in enumerate(cands):
            assert mean[r, k] == pytest.approx(summed[r, k] / max(len(cand), 1), rel=1e-6, abs=1e-7)
    assert np.isneginf(mean[1, 2]) and np.isneginf(summed[1, 2])  # missing candidates stay -inf
    assert mean[1, 1] == 0.0  # an empty candidate scores 0 either way


def test_mean_removes_the_bias_toward_short_candidates():
    # a 2-token candidate at -3 nats/token vs a 20-token one at -1 nat/token: sum prefers the short one
    summed = np.array([[-6.0, -20.0]], np.float32)
    lengths = np.array([[2, 20]], np.float32)
    assert np.argmax(normalize_scores(summed, lengths, "sum")) == 0
    assert np.argmax(normalize_scores(summed, lengths, "mean")) == 1
    # the same function differentiates under jax (the pretraining loss uses it)
    grad = jax.grad(lambda s: normalize_scores(s, jnp.asarray(lengths), "mean").sum())(jnp.asarray(summed))
    np.testing.assert_allclose(np.asarray(grad), 1 / lengths)
    with pytest.raises(ValueError, match="'sum' or 'mean'"):
        normalize_scores(summed, lengths, "max")


def test_dispatch_reports_the_padded_shape(model):
    config, params = model
    pending = dispatch_scores(config, params, PROMPTS, CANDS, norm="mean")
    packed = max(sum(len(c) for c in cands) for cands in CANDS)  # a row's candidates back to back
    assert pending.shape["rows"] >= len(PROMPTS) and pending.shape["candidate_len"] >= packed
    assert pending.shape["prompt_len"] >= max(len(p) for p in PROMPTS)
    assert pending.shape["padded_tokens"] == pending.shape["rows"] * (
        pending.shape["prompt_len"] + pending.shape["candidate_len"])
    np.testing.assert_array_equal(pending.result(), score_candidates(config, params, PROMPTS, CANDS, norm="mean"))


def test_bad_ids_name_the_row(model):
    config, params = model
    with pytest.raises(ValueError, match=r"candidate_ids\[1\]\[1\]|candidate_ids\[1\] has token id"):
        score_candidates(config, params, PROMPTS, [CANDS[0], [[7], [config.vocab_size]]])
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] has token id -1"):
        score_candidates(config, params, [[1], [2, -1]], CANDS)


def test_product_candidates_carry_rank_and_price_before_the_title():
    from envs.webshop_bridge import WebShopTextEnv, load_webshop
    from esjax.agent.webshop import EpisodeMemory, candidates_for

    shop = load_webshop("webshop_small")
    env = WebShopTextEnv(shop)
    goal = shop.split("test")[0]
    env.reset(goal)
    memory = EpisodeMemory(env.instruction)
    observation, *_ = env.step(f"search[{env.instruction}]")
    cands = candidates_for(observation, env.available_actions(), memory)
    opens = [c for c in cands if c.text.startswith("open ")]
    assert len(opens) == 10
    assert [c.text.split()[1] for c in opens] == [f"#{i}" for i in range(1, 11)]
    assert all(c.text.split()[2].startswith("$") for c in opens)
    observation, *_ = env.step("click[next >]")
    cands = candidates_for(observation, env.available_actions(), memory)
    assert cands[0].text.split()[1] == "#11"  # ranks continue across result pages
