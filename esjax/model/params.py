"""The parameter pytree: its layout, logical axis names and random initialization.

The layout is part of esjax's contract: ES noise is keyed by each leaf's path string (see
``esjax.es.noise``), so renaming a leaf changes every member's noise. Layers are stacked on a leading axis
of size ``num_layers`` and scanned. Kernels are ``[in, out]`` (Hugging Face stores ``[out, in]``)::

    embed/embedding               [vocab, hidden]          ('vocab', 'embed')
    layers/input_norm/scale       [L, hidden]              ('layers', 'norm')
    layers/attn/q_proj/kernel     [L, hidden, heads*hd]    ('layers', 'embed', 'heads')
    layers/attn/q_proj/bias       [L, heads*hd]            ('layers', 'heads')          if qkv_bias
    layers/attn/k_proj/kernel     [L, hidden, kv*hd]       ('layers', 'embed', 'kv_heads')
    layers/attn/k_proj/bias       [L, kv*hd]               ('layers', 'kv_heads')       if qkv_bias
    layers/attn/v_proj/kernel     [L, hidden, kv*hd]       ('layers', 'embed', 'kv_heads')
    layers/attn/v_proj/bias       [L, kv*hd]               ('layers', 'kv_heads')       if qkv_bias
    layers/attn/o_proj/kernel     [L, heads*hd, hidden]    ('layers', 'heads', 'embed')
    layers/attn/o_proj/bias       [L, hidden]              ('layers', 'norm')           if o_bias
    layers/post_attn_norm/scale   [L, hidden]              ('layers', 'norm')
    layers/mlp/gate_proj/kernel   [L, hidden, inter]       ('layers', 'embed', 'mlp')
    layers/mlp/up_proj/kernel     [L, hidden, inter]       ('layers', 'embed', 'mlp')
    layers/mlp/down_proj/kernel   [L, inter, hidden]       ('layers', 'mlp', 'embed')
    layers/mlp/{gate,up}_proj/bias [L, inter]              ('layers', 'mlp')            if mlp_bias
    layers/mlp/down_proj/bias     [L, hidden]              ('layers', 'norm')           if mlp_bias
    final_norm/scale              [hidden]                 ('norm',)
    lm_head/kernel                [hidden, vocab]          ('embed', 'vocab')           if not tied

With ``tie_word_embeddings`` the output head is ``embed/embedding`` transposed (one leaf, one noise).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from esjax.es.noise import leaf_id, path_str
from esjax.model.config import ModelConfig

Params = dict[str, Any]

def _spec(config: ModelConfig) -> dict[str, Any]:
    """Nested dict of (shape, logical axes) leaves, in the documented layout."""
    L, d, inter = config.num_layers, config.hidden_size, config.intermediate_size
    q, kv, v = config.q_dim, config.kv_dim, config.vocab_size

    def linear(n_in, n_out, ax_in, ax_out, bias):
        out = {"kernel": ((L, n_in, n_out), ("layers", ax_in, ax_out))}
        if bias:
            out["bias"] = ((L, n_out), ("layers", "norm" if ax_out == "embed" else ax_out))
        return out

    tree: dict[str, Any] = {
        "embed": {"embedding": ((v, d), ("vocab", "embed"))},
        "layers": {
            "input_norm": {"scale": ((L, d), ("layers", "norm"))},
            "attn": {
                "q_proj": linear(d, q, "embed", "heads", config.qkv_bias),
                "k_proj": linear(d, kv, "embed", "kv_heads", config.qkv_bias),
                "v_proj": linear(d, kv, "embed", "kv_heads", config.qkv_bias),
                "o_proj": linear(q, d, "heads", "embed", config.o_bias),
            },
            "post_attn_norm": {"scale": ((L, d), ("layers", "norm"))},
            "mlp": {
                "gate_proj": linear(d, inter, "embed", "mlp", config.mlp_bias),
                "up_proj": linear(d, inter, "embed", "mlp", config.mlp_bias),
                "down_proj": linear(inter, d, "mlp", "embed", config.mlp_bias),
            },
        },
        "final_norm": {"scale": ((d,), ("norm",))},
    }
    if not config.tie_word_embeddings:
        tree["lm_head"] = {"kernel": ((d, v), ("embed", "vocab"))}
    return tree


def _is_spec_leaf(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple)


def param_shapes(config: ModelConfig, dtype: Any = None) -> Params:
    """``jax.ShapeDtypeStruct`` tree of the parameters (no memory allocated)."""
    dtype = jnp.dtype(dtype or config.dtype)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s[0], dtype), _spec(config), is_leaf=_is_spec_leaf)


def param_logical_axes(config: ModelConfig) -> Params:
    """Tree of logical axis-name tuples, one per parameter leaf (mapped to mesh axes by ``sharding``)."""
    return jax.tree.map(lambda s: s[1], _spec(config), is_leaf=_is_spec_leaf)


def param_count(params: Params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


def init_params(config: ModelConfig, key: jax.Array, dtype: Any = None, std: float = 0.02) -> Params:
    """Random parameters: N(0, std) kernels, embedding and biases; ones for norm scales.

    Drawn on the host with numpy, seeded by ``(key, leaf_id(path))``: independent of dict order, and no XLA
    compile (jitted threefry draws cost about a second of CPU compile each). Meant for tests and small
    models; real checkpoints come from ``esjax.model.hf``.
    """
    import numpy as np

    dtype = jnp.dtype(dtype or config.dtype)
    key_words = [int(w) for w in np.asarray(jax.random.key_data(key)).ravel()]

    def init(key_path, shape_struct):
        path = path_str(key_path)
        shape = shape_struct.shape
        if path.endswith("/scale"):
            return jnp.ones(shape, dtype)
        rng = np.random.default_rng([*key_words, leaf_id(path)])
        return jnp.asarray((std * rng.standard_normal(shape, dtype=np.float32)).astype(dtype))

    return jax.tree_util.tree_map_with_path(init, param_shapes(config, dtype))


def check_params(config: ModelConfig, params: Params) -> None:
    """Raise a ValueError naming the first leaf whose path or shape does not match ``config``."""
    expected = {path_str(kp): s.shape for kp, s in jax.tree_util.tree_flatten_with_path(param_shapes(config))[0]}
    got = {path_str(kp): tuple(x.shape) for kp, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    for path, shape in expected.items():
        if path not in got:
            raise ValueError(f"params: missing leaf {path!r} (expected shape {shape})")
        if tuple(got[path]) != tuple(shape):
            raise ValueError(f"params: leaf {path!r} has shape {got[path]}, expected {shape}")
    extra = sorted(set(got) - set(expected))
    if extra:
        raise ValueError(f"params: unexpected leaves {extra}")


