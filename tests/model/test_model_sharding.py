"""Sharded forward / generation on a simulated (data, model) = (2, 4) mesh match one device (subprocess)."""

from __future__ import annotations

import textwrap

from jax.sharding import PartitionSpec as P

from esjax.model.sharding import LOGICAL_RULES, logical_to_spec

SCRIPT = textwrap.dedent(r"""
    import sys, tempfile
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    assert jax.device_count() == 8, jax.devices()
    from esjax.es.noise import NoiseSpec, Scope
    from esjax.model import hf
    from esjax.model.decoder import forward_jit
    from esjax.model.params import init_params
    from esjax.model.perturb import Perturbation, prepare_jit
    from esjax.model.sharding import make_mesh, put_batch
    from esjax.model.testing import tiny_config
    from esjax.agent.batch_generate import generate

    config = tiny_config(tie_word_embeddings=True)
    params = init_params(config, jax.random.key(0), std=0.2)
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (4, 12))
    spec = NoiseSpec(seed=3, mode="lowrank", rank=2, scope=Scope(kind="all"))
    pert = Perturbation.create(spec, 0.05, [1, 1, 2, 0], [0, 1, 3, 0], [True, True, True, False])
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [1]]

    ref_logits = np.asarray(forward_jit(config, params, tokens)[0])
    ref_pert = np.asarray(forward_jit(config, params, tokens, perturbation=prepare_jit(pert, params))[0])
    ref_gen = generate(config, params, prompts, pert, max_new_tokens=6, stop_token_ids=())

    mesh = make_mesh(2, 4)
    with tempfile.TemporaryDirectory() as d:
        hf.export_pretrained(d, config, params)
        sharded = hf.load_params(d, config, mesh)  # make_array_from_callback: each device reads its slice
    q = sharded["layers"]["attn"]["q_proj"]["kernel"]
    assert q.sharding.spec == P(None, None, "model"), q.sharding
    assert sharded["embed"]["embedding"].sharding.spec == P("model", None)
    assert len({s.data.shape for s in q.addressable_shards}) == 1
    assert q.addressable_shards[0].data.shape == (2, config.hidden_size, config.q_dim // 4)

    with jax.set_mesh(mesh):
        toks = put_batch(tokens)
        assert toks.sharding.spec == P("data", None)
        got = np.asarray(forward_jit(config, sharded, toks)[0])
        got_pert = np.asarray(forward_jit(config, sharded, toks, perturbation=prepare_jit(pert, sharded))[0])
        got_gen = generate(config, sharded, prompts, pert, max_new_tokens=6, stop_token_ids=())
    print("forward", np.abs(got - ref_logits).max(), "perturbed", np.abs(got_pert - ref_pert).max())
    assert np.abs(got - ref_logits).max() <= 1e-5
    assert np.abs(got_pert - ref_pert).max() <= 1e-5
    assert got_gen == ref_gen, (got_gen, ref_gen)
    print("OK")
""")


def test_logical_rules_replicate_what_does_not_divide():
    mesh_shape = {"data": 2, "model": 4}
    assert logical_to_spec(("layers", "embed", "heads"), (2, 64, 128), mesh_shape) == P(None, None, "model")
    assert logical_to_spec(("layers", "embed", "kv_heads"), (2, 64, 2 * 3), mesh_shape) == P(None, None, None)
    assert logical_to_spec(("batch", "seq", "embed"), (6, 8, 64), mesh_shape) == P("data", None, None)
    assert dict(LOGICAL_RULES)["vocab"] == "model" and dict(LOGICAL_RULES)["batch"] == "data"


def test_sharded_forward_and_generate_match_single_device(tmp_path, python_child):
    proc = python_child(SCRIPT, devices=8, cwd=tmp_path, timeout=900)
    assert proc.stdout.strip().endswith("OK")
