"""Counter-based noise: determinism (calls, jit, vmap, sharded in 8 simulated devices), antithetic signs,
independence across leaves / layers / versions / pairs, and the low-rank matmul/embedding identities."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from esjax.es import noise as nz
from esjax.es.noise import NoiseSpec, Scope

PARAMS = {
    "embed": {"embedding": jnp.zeros((40, 16))},
    "layers": {"attn": {"kernel": jnp.zeros((3, 16, 24)), "bias": jnp.zeros((3, 24))}},
    "head": {"kernel": jnp.zeros((16, 40))},
    "norm": {"scale": jnp.ones((16,))},
}
SPECS = [
    NoiseSpec(seed=7, mode="full", scope=Scope("all")),
    NoiseSpec(seed=7, mode="lowrank", rank=2, scope=Scope("all")),
]


def _np(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def _equal_trees(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


SMALL = {"layers": {"kernel": jnp.zeros((2, 8, 6))}, "norm": jnp.ones((8,))}


def _noise_tree(spec, version, index):
    """Every leaf's signed dense noise of one member."""
    return {nz.path_str(p): nz.member_noise(spec, nz.path_str(p), leaf.shape, version, index)
            for p, leaf in jax.tree_util.tree_leaves_with_path(SMALL)}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.mode)
def test_noise_bit_identical_across_calls_jit_and_vmap(spec):
    members = [(5, 2), (5, 3)]
    eager = [_noise_tree(spec, v, i) for v, i in members]
    again = [_noise_tree(spec, v, i) for v, i in members]
    versions, indices = jnp.array([5, 5], jnp.int32), jnp.array([2, 3], jnp.int32)
    lowrank = dataclasses.replace(spec, mode="lowrank")

    @jax.jit
    def traced(versions, indices):
        return {
            "single": [_noise_tree(spec, v, i) for v, i in zip(versions, indices)],
            "vmapped": jax.vmap(lambda v, i: _noise_tree(spec, v, i))(versions, indices),
            "factors": nz.lowrank_factors(spec, "layers/kernel", (2, 8, 6), versions, indices),
            "draw": nz.pair_noise(lowrank, "layers/kernel", (2, 8, 6), versions[0], indices[0] // 2),
            "perturbed": nz.perturbed_params(spec, SMALL, versions[1], indices[1], 0.3),
        }

    out = traced(versions, indices)
    (a, b), (a1, b1) = out["factors"], out["draw"]
    for k in range(2):
        assert _equal_trees(eager[k], again[k])
        assert _equal_trees(eager[k], out["single"][k])
        assert _equal_trees(eager[k], jax.tree_util.tree_map(lambda x, k=k: x[k], out["vmapped"]))
        # Batched low-rank factors are one member's draws, with the member's sign on A.
        assert np.array_equal(a[k], (1 - 2 * k) * a1) and np.array_equal(b[k], b1)
    # A materialized member is θ + σ·ε (to rounding: jit may fuse the multiply-add).
    for p, x in jax.tree_util.tree_leaves_with_path(out["perturbed"]):
        base = 1.0 if nz.path_str(p) == "norm" else 0.0
        np.testing.assert_allclose(x, base + 0.3 * eager[1][nz.path_str(p)], rtol=1e-6, atol=1e-6)


def test_batched_pair_noise_is_bit_identical_to_pair_noise():
    leaves = [("a/kernel", (6, 5)), ("bias", (5,)), ("stack/kernel", (2, 4, 3)), ("big", (10, 12)),
              ("big2", (12, 10)), ("big3", (10, 12))]
    versions, pairs = jnp.array([0, 3, 3, 7], jnp.int32), jnp.array([0, 1, 5, 2], jnp.int32)
    for spec in SPECS:
        @jax.jit
        def both(v, p, spec=spec):
            # small_draw / large_draw shrunk so padding, same-size grouping and singletons all occur.
            batched = nz.batched_pair_noise(spec, leaves, v, p, small_draw=40, large_draw=100)
            one = lambda path, shape: jax.vmap(lambda vv, pp: nz.pair_noise(spec, path, shape, vv, pp))(v, p)
            one_by_one = [one(path, shape) for path, shape in leaves]
            return batched, one_by_one
        batched, one_by_one = both(versions, pairs)
        assert _equal_trees(batched, one_by_one), spec.mode


def test_noise_depends_on_paths_not_dict_order():
    spec = SPECS[0]
    forward = {"a": jnp.zeros((8, 8)), "b": jnp.zeros((8, 8))}
    backward = {"b": jnp.zeros((8, 8)), "a": jnp.zeros((8, 8))}
    p1 = nz.perturbed_params(spec, forward, 0, 0, 1.0)
    p2 = nz.perturbed_params(spec, backward, 0, 0, 1.0)
    assert np.array_equal(p1["a"], p2["a"]) and np.array_equal(p1["b"], p2["b"])
    # Same-shaped leaves do not share noise (the per-tensor reseeding bug of the ES-at-scale code).
    assert not np.allclose(p1["a"], p1["b"])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.mode)
def test_antithetic_partners_are_exact_negatives(spec):
    for pair in range(3):
        for path, leaf in jax.tree_util.tree_leaves_with_path(PARAMS):
            eps_p = nz.member_noise(spec, nz.path_str(path), leaf.shape, 2, 2 * pair)
            eps_m = nz.member_noise(spec, nz.path_str(path), leaf.shape, 2, 2 * pair + 1)
            assert np.array_equal(np.asarray(eps_p), -np.asarray(eps_m))
            assert not np.array_equal(np.asarray(eps_p), np.zeros(leaf.shape))
    # Without antithetic sampling, members 0 and 1 are unrelated draws.
    plain = NoiseSpec(seed=7, mode="full", antithetic=False)
    e0 = np.asarray(nz.member_noise(plain, "w", (64, 64), 0, 0)).ravel()
    e1 = np.asarray(nz.member_noise(plain, "w", (64, 64), 0, 1)).ravel()
    assert abs(np.corrcoef(e0, e1)[0, 1]) < 0.08


def test_noise_independent_across_leaves_layers_versions_pairs():
    spec = NoiseSpec(seed=11, mode="full")
    shape = (4, 64, 64)  # 4 layers of a stacked kernel, 4096 elements each
    base = np.asarray(nz.pair_noise(spec, "blocks/mlp/kernel", shape, 3, 5))
    others = {
        "other leaf": np.asarray(nz.pair_noise(spec, "blocks/attn/kernel", shape, 3, 5))[0],
        "other layer": base[1],
        "other version": np.asarray(nz.pair_noise(spec, "blocks/mlp/kernel", shape, 4, 5))[0],
        "other pair": np.asarray(nz.pair_noise(spec, "blocks/mlp/kernel", shape, 3, 6))[0],
        "other seed": np.asarray(nz.pair_noise(NoiseSpec(seed=12, mode="full"), "blocks/mlp/kernel", shape, 3, 5))[0],
    }
    x = base[0].ravel()
    assert abs(x.mean()) < 0.08 and abs(x.std() - 1.0) < 0.05
    bound = 5.0 / np.sqrt(x.size)  # 5 standard errors of a correlation of independent normals
    for name, y in others.items():
        corr = np.corrcoef(x, y.ravel())[0, 1]
        assert abs(corr) < bound, f"{name}: correlation {corr:.3f}"

    lowrank = NoiseSpec(seed=11, mode="lowrank", rank=8)
    a, b = (np.asarray(f) for f in nz.pair_noise(lowrank, "blocks/mlp/kernel", (4, 512, 256), 3, 5))
    a2, _ = (np.asarray(f) for f in nz.pair_noise(lowrank, "blocks/mlp/kernel", (4, 512, 256), 4, 5))
    for name, y in {"A layer": a[1], "A vs B": b[0], "A version": a2[0]}.items():
        n = min(a[0].size, y.size)
        corr = np.corrcoef(a[0].ravel()[:n], y.ravel()[:n])[0, 1]
        assert abs(corr) < 5.0 / np.sqrt(n), f"{name}: correlation {corr:.3f}"


def test_lowrank_matmul_and_embed_equal_materialized_kernels():
    spec = NoiseSpec(seed=3, mode="lowrank", rank=4)
    sigma = 0.05
    versions = jnp.array([0, 0, 1, 2, 2], jnp.int32)
    indices = jnp.array([0, 1, 0, 3, 4], jnp.int32)
    active = jnp.array([True, True, True, False, True])
    kernel = jax.random.normal(jax.random.key(0), (16, 12))
    table = jax.random.normal(jax.random.key(2), (30, 8))
    x = jax.random.normal(jax.random.key(1), (5, 7, 16))
    tokens = jax.random.randint(jax.random.key(3), (5, 6), 0, 30)

    @jax.jit
    def fast():
        a, b = nz.lowrank_factors(spec, "head/kernel", kernel.shape, versions, indices, active)
        ea, eb = nz.lowrank_factors(spec, "embed/embedding", table.shape, versions, indices, active)
        return nz.lowrank_matmul(x, kernel, a, b, sigma), nz.lowrank_embed(tokens, table, ea, eb, sigma)

    @jax.jit
    def materialized():
        def row(xr, tok, v, i, on):
            w = kernel + sigma * on * nz.member_noise(spec, "head/kernel", kernel.shape, v, i)
            t = table + sigma * on * nz.member_noise(spec, "embed/embedding", table.shape, v, i)
            return xr @ w, t[tok]
        return jax.vmap(row)(x, tokens, versions, indices, active.astype(jnp.float32))

    for got, want in zip(fast(), materialized()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    out, _ = fast()
    np.testing.assert_allclose(out[3], x[3] @ kernel, rtol=1e-6, atol=1e-6)  # inactive row: the plain model


def test_lowrank_stacked_layers_get_independent_factors():
    spec = NoiseSpec(seed=3, mode="lowrank", rank=1)
    eps = np.asarray(nz.member_noise(spec, "layers/kernel", (3, 32, 32), 0, 0))
    for layer in range(3):
        assert np.linalg.matrix_rank(eps[layer], tol=1e-4) == 1
    assert not np.allclose(eps[0], eps[1])


def test_scope_selects_leaves():
    params = {"attn": {"kernel": jnp.zeros((4, 4)), "bias": jnp.zeros((4,))}, "norm": {"scale": jnp.ones((4,))},
              "step": jnp.zeros((), jnp.int32)}
    def changed(scope):
        out = nz.perturbed_params(NoiseSpec(mode="full", scope=scope), params, 0, 0, 1.0)
        return {nz.path_str(p) for (p, a), b in zip(jax.tree_util.tree_leaves_with_path(params),
                                                     jax.tree_util.tree_leaves(out)) if not np.array_equal(a, b)}
    assert changed(Scope("matrices")) == {"attn/kernel"}
    assert changed(Scope("all")) == {"attn/kernel", "attn/bias", "norm/scale"}
    assert changed(Scope("all", exclude=("norm",))) == {"attn/kernel", "attn/bias"}
    assert changed(Scope("all", include=("attn",), exclude=("bias$",))) == {"attn/kernel"}
    with pytest.raises(ValueError, match="regular expression"):
        Scope(include=("(",))


_SHARDED_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from esjax.es import noise as nz
    from esjax.es.step import ESConfig, es_gradient
    assert jax.device_count() == 8, jax.devices()
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    shapes = {"layers": (4, 16, 24), "norm": (16,)}
    specs = {"layers": P(None, "data", "model"), "norm": P("model")}
    params = {k: jax.device_put(jnp.zeros(s), NamedSharding(mesh, specs[k])) for k, s in shapes.items()}
    out = {}
    versions = jnp.array([0, 0, 1, 3], jnp.int32); indices = jnp.array([0, 1, 4, 7], jnp.int32)
    weights = jnp.array([0.5, -0.25, 1.0, -1.0], jnp.float32)
    specs_by_mode = {m: nz.NoiseSpec(seed=5, mode=m, rank=2, scope=nz.Scope("all")) for m in ("full", "lowrank")}
    noise = jax.jit(lambda p, v, i: {m: nz.perturbed_params(s, p, v, i, 1.0) for m, s in specs_by_mode.items()})
    pert = [noise(params, v, i) for v, i in zip(versions, indices)]  # θ = 0, σ = 1: the members' noise
    assert pert[0]["full"]["layers"].sharding.spec == specs["layers"], pert[0]["full"]["layers"].sharding
    for m in specs_by_mode:
        out[m] = {k: np.stack([np.asarray(x[m][k]) for x in pert]).tolist() for k in shapes}
    g = jax.jit(es_gradient, static_argnums=0)(ESConfig(noise=specs_by_mode["full"]), params, versions, indices,
                                               weights)
    out["grad"] = {k: np.asarray(x).tolist() for k, x in g.items()}
    out["grad_sharding"] = {k: str(x.sharding.spec) for k, x in g.items()}
    json.dump(out, open(sys.argv[1], "w"))
""")


def test_noise_bit_identical_with_8_sharded_devices(tmp_path, python_child):
    from esjax.es.step import ESConfig, es_gradient

    result = tmp_path / "out.json"
    python_child(_SHARDED_SCRIPT, result, devices=8, timeout=300)
    out = json.loads(result.read_text())
    shapes = {"layers": (4, 16, 24), "norm": (16,)}
    params = {k: jnp.zeros(s) for k, s in shapes.items()}
    versions = jnp.array([0, 0, 1, 3], jnp.int32)
    indices = jnp.array([0, 1, 4, 7], jnp.int32)
    weights = jnp.array([0.5, -0.25, 1.0, -1.0], jnp.float32)
    specs_by_mode = {m: NoiseSpec(seed=5, mode=m, rank=2, scope=Scope("all")) for m in ("full", "lowrank")}
    local = jax.jit(jax.vmap(lambda v, i: {m: {k: nz.member_noise(spec, k, s, v, i) for k, s in shapes.items()}
                                           for m, spec in specs_by_mode.items()}))(versions, indices)
    for m in specs_by_mode:
        for k in shapes:
            here, there = np.asarray(local[m][k]), np.asarray(out[m][k], np.float32)
            if m == "lowrank" and len(shapes[k]) >= 2:
                # The draws are bit-identical (the full-mode rows); the low-rank product A·Bᵀ/√r is a matmul,
                # whose FMA contraction may differ by an ulp between a sharded and an unsharded program.
                np.testing.assert_allclose(there, here, rtol=0, atol=2e-6, err_msg=f"{m} {k}")
            else:
                assert np.array_equal(here, there), (m, k)
    g = jax.jit(es_gradient, static_argnums=0)(ESConfig(noise=specs_by_mode["full"]), params, versions, indices,
                                               weights)
    for k in shapes:
        np.testing.assert_allclose(np.asarray(out["grad"][k], np.float32), g[k], rtol=1e-6, atol=1e-7)
    # The gradient is laid out like the parameters, not replicated.
    assert out["grad_sharding"]["layers"] == "P(None, 'data', 'model')"
