"""Perturbed batched forward (low-rank and full) == plain forward of explicitly perturbed params, per row.

Compiling threefry noise dominates CPU test time, so the tests share a few (spec, row-count) combinations
and pass ``prepare_jit`` results into the forward; one test keeps noise generation inside the forward's jit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from esjax.es.noise import (
    NoiseSpec,
    Scope,
    is_matrix,
    lowrank_factors,
    member_noise,
    pair_noise,
    path_str,
    perturbed_params,
)
from esjax.model.decoder import forward_jit, forward_last, init_cache
from esjax.model.params import (
    check_params,
    init_params,
    param_logical_axes,
    param_shapes,
)
from esjax.model.perturb import LowRank, Perturbation, prepare, prepare_jit
from esjax.model.testing import tiny_config

SIGMA = 0.05
VERSIONS = [3, 3, 4, 0, 7, 3]
INDICES = [0, 1, 5, 2, 9, 0]
ACTIVE = [True, True, True, False, True, True]
LOWRANK = NoiseSpec(seed=11, mode="lowrank", rank=4, scope=Scope(kind="all"))  # kernels + norms + biases
FULL = NoiseSpec(seed=11, mode="full", scope=Scope(kind="all"))
_perturbed = jax.jit(perturbed_params, static_argnums=0)


def _model(tied: bool):
    config = tiny_config(tie_word_embeddings=tied)
    params = init_params(config, jax.random.key(0), std=0.2)
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (len(VERSIONS), 10))
    tokens[1] = tokens[0]  # rows 0 / 1 are an antithetic pair on the same input
    return config, params, tokens


@pytest.fixture(scope="module")
def model():
    return _model(tied=False)


def _pert(spec, sigma=SIGMA, **kw):
    return Perturbation.create(spec, sigma, VERSIONS, INDICES, ACTIVE, **kw)


@pytest.mark.parametrize("spec, tied", [(LOWRANK, False), (LOWRANK, True), (FULL, False)],
                         ids=["lowrank-untied", "lowrank-tied", "full-untied"])
def test_population_forward_matches_perturbed_params(spec, tied, model):
    config, params, tokens = model if not tied else _model(tied=True)
    batched, _ = forward_jit(config, params, tokens, perturbation=prepare_jit(_pert(spec), params))
    plain, _ = forward_jit(config, params, tokens)
    for r in range(tokens.shape[0]):
        p = _perturbed(spec, params, VERSIONS[r], INDICES[r], SIGMA) if ACTIVE[r] else params
        ref, _ = forward_jit(config, p, tokens[r:r + 1])
        assert np.abs(np.asarray(batched[r] - ref[0])).max() <= 2e-5, f"row {r}"
    assert np.abs(np.asarray(batched[3] - plain[3])).max() <= 1e-5  # inactive row: the plain model
    assert np.abs(np.asarray(batched[0] - plain[0])).max() > 1e-2  # active rows really are perturbed


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_shared_factor_matmul_and_widened_head_match_perturbed_params(tied):
    """Few groups at rank 1: the ``x A`` products come from one matmul against every group's factors and the
    tied head takes the rank-1 term into its contraction; still equal to each member's perturbed params, and
    rows of an inactive group equal the plain model."""
    from esjax.model import layers

    config = tiny_config(tie_word_embeddings=tied)
    params = init_params(config, jax.random.key(0), std=0.2)
    spec = NoiseSpec(seed=5, mode="lowrank", rank=1, scope=Scope(kind="all"))
    versions, indices, active = [3, 3, 4, 4, 0, 0], [1, 1, 2, 2, 0, 0], [True, True, True, True, False, False]
    tokens = np.random.RandomState(1).randint(0, config.vocab_size, (6, 10))
    groups = 3
    # the shapes take both new paths: 3 groups * rank 1 <= 1/16 of the q/k/v and gate/up output columns
    # (and of the vocab), and 60 rows*tokens > hidden + 3 (the widened tied head)
    assert groups <= layers.SHARED_COLUMNS_FRACTION * (config.q_dim + 2 * config.kv_dim)
    assert groups <= layers.SHARED_COLUMNS_FRACTION * config.vocab_size
    assert tokens.size > config.hidden_size + groups
    pert = Perturbation.create(spec, SIGMA, versions, indices, active, group_size=2)
    batched, _ = forward_jit(config, params, tokens, perturbation=pert)
    plain, _ = forward_jit(config, params, tokens)
    for r in range(4):
        ref, _ = forward_jit(config, _perturbed(spec, params, versions[r], indices[r], SIGMA), tokens[r:r + 1])
        assert np.abs(np.asarray(batched[r] - ref[0])).max() <= 2e-5, f"row {r}"
    assert np.abs(np.asarray(batched[4:] - plain[4:])).max() <= 1e-6  # inactive group: the plain model
    assert np.abs(np.asarray(batched[0] - plain[0])).max() > 1e-2


def test_batched_draws_are_bit_identical_to_es_noise(model):
    """prepare() draws all leaves in a few batched threefry calls; it must equal esjax.es.noise exactly."""
    config, params, _ = model
    pert = _pert(LOWRANK)
    versions, indices, active = (np.asarray(x) for x in (VERSIONS, INDICES, ACTIVE))

    @jax.jit
    def both(params):
        prepared = prepare(pert, params)
        ref = {}
        for kp, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
            path = path_str(kp)
            if is_matrix(path, leaf.shape):
                ref[path] = lowrank_factors(LOWRANK, path, leaf.shape, versions, indices, active)
            else:
                eps = jax.vmap(lambda v, i, path=path, leaf=leaf: member_noise(LOWRANK, path, leaf.shape, v, i))(
                    versions, indices)
                ref[path] = eps * jnp.where(active, SIGMA, 0.0).reshape((-1,) + (1,) * leaf.ndim)
        return prepared.noise, ref

    noise, ref = both(params)
    flat = {path_str(kp): x for kp, x in jax.tree_util.tree_flatten_with_path(
        noise, is_leaf=lambda x: isinstance(x, LowRank))[0]}
    assert set(flat) == set(ref)
    for path, got in flat.items():
        want = ref[path]
        if isinstance(got, LowRank):
            assert np.array_equal(got.a, want[0]) and np.array_equal(got.b, want[1]), path
        else:
            assert np.array_equal(got, want), path


def test_noise_generated_inside_the_jitted_forward(model):
    """Passing the Perturbation itself (noise drawn inside forward's jit) gives the same logits."""
    config, params, tokens = model
    pert = _pert(LOWRANK)
    inside, _ = forward_jit(config, params, tokens, perturbation=pert)
    hoisted, _ = forward_jit(config, params, tokens, perturbation=prepare_jit(pert, params))
    assert np.abs(np.asarray(inside) - np.asarray(hoisted)).max() <= 1e-6


@pytest.mark.parametrize("spec", [LOWRANK, FULL], ids=["lowrank", "full"])
def test_antithetic_pair_moves_opposite_ways(model, spec):
    config, params, tokens = model
    batched, _ = forward_jit(config, params, tokens, perturbation=prepare_jit(_pert(spec, sigma=1e-3), params))
    plain, _ = forward_jit(config, params, tokens)
    d0, d1 = np.asarray(batched[0] - plain[0]), np.asarray(batched[1] - plain[1])
    assert np.corrcoef(d0.ravel(), d1.ravel())[0, 1] < -0.9


def test_grouped_rows_share_one_member(model):
    config, params, tokens = model
    versions, indices, active = [1, 1, 2, 2, 0, 0], [4, 4, 7, 7, 0, 0], [True, True, True, True, False, False]
    grouped = Perturbation.create(LOWRANK, SIGMA, versions, indices, active, group_size=2)
    per_row = Perturbation.create(LOWRANK, SIGMA, versions, indices, active)
    a, _ = forward_jit(config, params, tokens, perturbation=prepare_jit(grouped, params))
    b, _ = forward_jit(config, params, tokens, perturbation=prepare_jit(per_row, params))
    assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-5


@pytest.mark.parametrize("spec", [LOWRANK, FULL], ids=["lowrank", "full"])
def test_perturbed_forward_with_cache_matches_full_sequence(model, spec):
    config, params, tokens = model
    prepared = prepare_jit(_pert(spec), params)
    full, _ = forward_jit(config, params, tokens, perturbation=prepared)
    B, T = tokens.shape
    cache = init_cache(config, B, 16)
    pos = np.broadcast_to(np.arange(T), (B, T))
    first, cache = forward_jit(config, params, tokens[:, :6], pos[:, :6], None, cache, prepared)
    rest, cache = forward_jit(config, params, tokens[:, 6:], pos[:, 6:], None, cache, prepared)
    assert int(cache["index"]) == T
    got = np.concatenate([np.asarray(first), np.asarray(rest)], axis=1)
    assert np.abs(got - np.asarray(full)).max() <= 2e-5


@pytest.mark.parametrize("spec, tied", [(LOWRANK, False), (LOWRANK, True), (FULL, True)],
                         ids=["lowrank", "lowrank-tied", "full-tied"])
def test_last_position_logits_equal_the_full_forwards_last_column(spec, tied):
    """A prefill's head runs at the last position only (forward_last): the cache is unchanged and the logits equal
    the full forward's last column up to float rounding of the perturbed head (bit for bit when the head is not
    perturbed, as for the embedded generative policy)."""
    config, params, tokens = _model(tied)
    prepared = prepare_jit(_pert(spec), params)
    B, T = tokens.shape
    full, full_cache = forward_jit(config, params, tokens, None, None, init_cache(config, B, 16), prepared)
    last, last_cache = jax.jit(lambda p, t, c: forward_last(config, p, t, None, None, c, prepared))(
        params, tokens, init_cache(config, B, 16))
    assert last.shape == (B, config.vocab_size)
    np.testing.assert_allclose(np.asarray(last), np.asarray(full)[:, -1], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(np.argmax(last, -1), np.argmax(np.asarray(full)[:, -1], -1))
    np.testing.assert_array_equal(np.asarray(last_cache["k"]), np.asarray(full_cache["k"]))


def test_bfloat16_lowrank_forward_close_to_float32(model):
    config, params, tokens = model
    prepared = prepare_jit(_pert(LOWRANK), params)
    f32, _ = forward_jit(config, params, tokens, perturbation=prepared)
    bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    bf16, _ = forward_jit(config, bf16_params, tokens, perturbation=prepared)
    assert bf16.dtype == jnp.float32
    assert np.abs(np.asarray(bf16) - np.asarray(f32)).max() < 0.05 * np.abs(np.asarray(f32)).max()


def test_matrices_are_kernels_and_the_embedding_and_stacked_vectors_get_noise_per_layer():
    """One definition of a matrix (``is_matrix``): a layer-stacked norm scale or bias ``[L, d]`` is a vector
    per layer, so ``Scope('matrices')`` leaves it alone and low-rank mode draws it dense (independent layers)."""
    config = tiny_config()
    params = init_params(config, jax.random.key(0))
    flat = {path_str(kp): x for kp, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    matrices = {p for p, x in flat.items() if Scope("matrices").contains(p, x)}
    assert matrices == {p for p in flat if p.endswith("/kernel") or p == "embed/embedding"}
    assert config.qkv_bias and flat["layers/attn/q_proj/bias"].ndim == 2 and flat["layers/input_norm/scale"].ndim == 2
    spec = NoiseSpec(seed=0, mode="lowrank", rank=2)
    assert spec.is_lowrank_leaf("w", (3, 4)) and not spec.is_lowrank_leaf("layers/input_norm/scale", (2, 8))
    draw = pair_noise(spec, "layers/input_norm/scale", (2, 8), 0, 0)  # one dense draw, a row per layer
    assert draw.shape == (2, 8)
    assert np.linalg.matrix_rank(np.asarray(pair_noise(spec, "layers/x/scale", (8, 8), 0, 0))) == 8  # not rank 2


@pytest.mark.parametrize("tied", [False, True])
def test_param_layout_is_stable(tied):
    config = tiny_config(tie_word_embeddings=tied)
    params = init_params(config, jax.random.key(0))
    check_params(config, params)
    paths = {"/".join(str(k.key) for k in kp) for kp, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    assert "layers/attn/q_proj/kernel" in paths and "layers/mlp/down_proj/kernel" in paths
    assert ("lm_head/kernel" in paths) != config.tie_word_embeddings
    assert params["layers"]["attn"]["q_proj"]["kernel"].shape == (config.num_layers, config.hidden_size, config.q_dim)
    axes = param_logical_axes(config)
    assert axes["layers"]["attn"]["k_proj"]["kernel"] == ("layers", "embed", "kv_heads")
    assert axes["embed"]["embedding"] == ("vocab", "embed")


def test_program_size_does_not_grow_with_depth():
    """The layer stack is a scan: the lowered program is the same size for 2 and 8 layers."""
    sizes = []
    for layers in (2, 8):
        config = tiny_config(num_layers=layers)
        params = param_shapes(config)
        pert = Perturbation.create(NoiseSpec(mode="lowrank"), SIGMA, [0, 0], [0, 1])
        text = forward_jit.lower(config, params, np.zeros((2, 4), np.int32), perturbation=pert).as_text()
        sizes.append(len(text.splitlines()))
    assert sizes[0] == sizes[1]


def test_bad_perturbation_rows_raise(model):
    config, params, tokens = model
    with pytest.raises(ValueError, match="group_size"):
        Perturbation.create(NoiseSpec(), SIGMA, [0, 0, 0], [0, 1, 2], group_size=2)
    pert = Perturbation.create(NoiseSpec(), SIGMA, [0, 0, 0, 0], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="perturbation has 4 rows"):
        forward_jit(config, params, tokens, perturbation=pert)
