"""Policy primitives: candidate scoring vs full-sequence log-probs, generation controls, shape buckets."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from esjax.agent import batch_generate, scoring
from esjax.agent.batch_generate import generate
from esjax.agent.buckets import Buckets, bucket
from esjax.agent.scoring import score_candidates
from esjax.es.noise import NoiseSpec, Scope
from esjax.model.decoder import forward_jit
from esjax.model.params import init_params
from esjax.model.perturb import Perturbation, prepare_jit
from esjax.model.testing import tiny_config

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [3, 1, 4, 1, 5, 9, 2, 6, 5]]
CANDS = [[[1, 2], [3], [4, 5, 6, 7]], [[7]], [[8, 9], [10, 11, 12]]]
SPEC = NoiseSpec(seed=7, mode="lowrank", rank=2, scope=Scope(kind="all"))


@pytest.fixture(scope="module")
def model():
    config = tiny_config(tie_word_embeddings=True)
    return config, init_params(config, jax.random.key(1), std=0.2)


def _full_sequence_logprob(config, params, prompt, cand):
    logits, _ = forward_jit(config, params, np.asarray([prompt + cand]))
    logp = jax.nn.log_softmax(np.asarray(logits[0], np.float64), axis=-1)
    return float(sum(logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(cand)))


def test_scores_equal_sum_of_full_sequence_token_logprobs(model):
    config, params = model
    scores = score_candidates(config, params, PROMPTS, CANDS)
    assert scores.shape == (3, 3) and scores.dtype == np.float32
    for r, cands in enumerate(CANDS):
        for k, cand in enumerate(cands):
            assert abs(scores[r, k] - _full_sequence_logprob(config, params, PROMPTS[r], cand)) <= 1e-4
        assert np.all(np.isneginf(scores[r, len(cands):]))


def test_prefix_cached_scoring_equals_naive_with_perturbation(model):
    config, params = model
    pert = Perturbation.create(SPEC, 0.05, [2, 2, 5], [0, 1, 3], [True, True, False])
    cached = score_candidates(config, params, PROMPTS, CANDS, pert)
    naive = score_candidates(config, params, PROMPTS, CANDS, pert, prefix_cache=False)
    plain = score_candidates(config, params, PROMPTS, CANDS)
    finite = np.isfinite(plain)
    assert np.abs(cached[finite] - naive[finite]).max() <= 1e-4
    assert np.abs(cached[2][finite[2]] - plain[2][finite[2]]).max() <= 1e-4  # inactive row = plain model
    assert np.abs(cached[0][finite[0]] - plain[0][finite[0]]).max() > 1e-3


@pytest.mark.parametrize("mode", ["lowrank", "full"])
def test_packed_candidates_equal_full_sequences(model, mode):
    """Packed rows (uneven lengths, empty candidates anywhere, a row filling its length bucket exactly) score
    like each prompt+candidate run alone, for both perturbation modes."""
    config, params = model
    prompts = [[5, 6, 7], [9, 8, 7, 6, 5, 4], [2]]
    cands = [[[1] * 8, [2, 3], [], [4, 5, 6]] * 2, [[7, 8, 9, 10, 11, 12, 13, 14], [15] * 8], [[3], []]]
    spec = NoiseSpec(seed=3, mode=mode, rank=2, scope=Scope(kind="all"))
    pert = Perturbation.create(spec, 0.05, [1, 1, 4], [0, 1, 2], [True, True, True])
    packed = score_candidates(config, params, prompts, cands, pert, buckets=Buckets(lengths=(8, 16, 26)))
    naive = score_candidates(config, params, prompts, cands, pert, prefix_cache=False)
    finite = np.isfinite(naive)
    assert np.array_equal(finite, np.isfinite(packed)) and finite.sum() == 12
    assert np.abs(packed[finite] - naive[finite]).max() <= 1e-4
    assert packed[0, 2] == 0.0 and packed[2, 1] == 0.0  # empty candidates


def test_empty_candidate_scores_zero_and_bad_ids_raise(model):
    config, params = model
    scores = score_candidates(config, params, [[1, 2]], [[[], [3]]])
    assert scores[0, 0] == 0.0 and scores[0, 1] < 0
    with pytest.raises(ValueError, match="outside the vocabulary"):
        score_candidates(config, params, [[1, config.vocab_size]], [[[1]]])
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] is empty"):
        score_candidates(config, params, [[]], [[[1]]])
    with pytest.raises(ValueError, match=r"candidate_ids\[1\]\[1\] has token id -1 outside the vocabulary"):
        score_candidates(config, params, [[1], [2]], [[[1]], [[2], [3, -1]]])


def test_scoring_compiles_one_program_per_bucket(model):
    config, params = model
    before = scoring._score_packed._cache_size()
    for n in (9, 11, 13):  # prompt lengths in one bucket (16), candidate lengths in one bucket (8)
        score_candidates(config, params, [list(range(1, n + 1))], [[[1, 2, 3], [4]]])
    assert scoring._score_packed._cache_size() - before <= 1


class _WordTokenizer:
    """Decodes id i as the word 't<i>' (enough for stop strings)."""

    def decode(self, ids):
        return " ".join(f"t{i}" for i in ids)


def test_stop_tokens_and_stop_strings(model):
    config, params = model
    full = generate(config, params, PROMPTS, max_new_tokens=12, stop_token_ids=())
    assert [len(s) for s in full] == [12, 12, 12]
    stop_id = full[0][4]
    stopped = generate(config, params, PROMPTS[:1], max_new_tokens=12, stop_token_ids=[stop_id])
    assert stopped[0] == full[0][: full[0].index(stop_id) + 1]
    target = f"t{full[1][2]} t{full[1][3]}"
    by_string = generate(config, params, PROMPTS, max_new_tokens=12, stop=[target], stop_token_ids=(),
                         tokenizer=_WordTokenizer(), check_every=2)
    tok = _WordTokenizer()
    for r in range(3):
        cut = next((n for n in range(1, 13) if target in tok.decode(full[r][:n])), 12)
        assert by_string[r] == full[r][:cut]
    assert by_string[1] == full[1][:4]
    with pytest.raises(ValueError, match="tokenizer"):
        generate(config, params, PROMPTS, stop=["x"])


def test_sampling_is_seeded_and_top_p_tiny_is_greedy(model):
    config, params = model
    kw = dict(max_new_tokens=8, stop_token_ids=(), temperature=1.0)
    a = generate(config, params, PROMPTS, seed=3, **kw)
    b = generate(config, params, PROMPTS, seed=3, **kw)
    c = generate(config, params, PROMPTS, seed=4, **kw)
    assert a == b and a != c
    same = generate(config, params, [PROMPTS[0], PROMPTS[0]], seed=[9, 9], **kw)
    assert same[0] == same[1]  # per-row seeds: common random numbers across rows
    greedy = generate(config, params, PROMPTS, max_new_tokens=8, stop_token_ids=())
    nucleus = generate(config, params, PROMPTS, seed=5, top_p=1e-6, **kw)
    assert nucleus == greedy


def test_generation_with_members_uses_their_noise(model):
    config, params = model
    pert = Perturbation.create(SPEC, 0.05, [2, 2, 5], [0, 1, 3], [True, True, False])
    plain = generate(config, params, PROMPTS, max_new_tokens=10, stop_token_ids=())
    perturbed = generate(config, params, PROMPTS, pert, max_new_tokens=10, stop_token_ids=())
    assert perturbed[2] == plain[2]  # inactive row
    # greedy decoding of a member == teacher-forced argmax of that member's full-sequence forward
    seqs = [p + g for p, g in zip(PROMPTS, perturbed)] + [[1]]
    tokens = np.zeros((4, max(map(len, seqs))), np.int32)
    mask = np.zeros(tokens.shape, bool)
    for r, seq in enumerate(seqs):
        tokens[r, :len(seq)], mask[r, :len(seq)] = seq, True
    prepared = prepare_jit(pert.pad_rows(4), params)
    logits, _ = forward_jit(config, params, tokens, None, mask, perturbation=prepared)
    for r in range(3):
        argmax = np.asarray(logits[r]).argmax(-1)[len(PROMPTS[r]) - 1:len(seqs[r]) - 1].tolist()
        assert argmax == perturbed[r]
    assert perturbed[0] != plain[0] or perturbed[1] != plain[1]


def test_generation_bounded_programs(model):
    config, params = model
    before = batch_generate._decode._cache_size()
    for n in (3, 5, 7):
        generate(config, params, [list(range(1, n + 1))], max_new_tokens=5, stop_token_ids=())
    assert batch_generate._decode._cache_size() - before <= 1


def test_buckets():
    assert [bucket(n, minimum=8) for n in (1, 8, 9, 100)] == [8, 8, 16, 128]
    assert bucket(5, sizes=(4, 12, 32)) == 12
    assert bucket(3, multiple=4) == 4
    with pytest.raises(ValueError, match="exceeds the largest configured bucket 32"):
        Buckets(lengths=(16, 32)).length(40)
