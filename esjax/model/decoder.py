"""The Qwen2 / Llama decoder as pure functions over the parameter pytree.

``forward(config, params, tokens, positions, mask, cache=None, perturbation=None) -> (logits, cache)`` is
the whole model: no module state, so the ES update, the noise and the sharding all see one plain nested
dict (layout in ``esjax.model.params``). Layers are stacked ``[L, ...]`` and run with ``jax.lax.scan``
(compile time does not grow with depth); the per-group low-rank factors of stacked kernels are scanned
over the layer axis together with the kernels.

Padding and caching: ``mask [B, T]`` marks real tokens and ``positions [B, T]`` gives their RoPE
positions, so left- and right-padded batches both work. A cache holds ``k, v [L, B, S, KV, D]``, the slot
validity ``valid [B, S]`` and the next write slot ``index`` (shared by all rows); a call writes its ``T``
tokens at slots ``index .. index+T-1`` and each query sees the valid slots up to its own.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from esjax.model import layers as nn
from esjax.model.config import ModelConfig
from esjax.model.perturb import Perturbation, Prepared, prepare
from esjax.model.sharding import ACTIVATION_AXES, CACHE_AXES, constrain

Cache = dict[str, jax.Array]


def init_cache(config: ModelConfig, batch: int, length: int, dtype: Any = None) -> Cache:
    """Empty KV cache for ``batch`` rows and ``length`` slots."""
    dtype = jnp.dtype(dtype or config.dtype)
    shape = (config.num_layers, batch, length, config.num_kv_heads, config.head_dim)
    return {
        "k": constrain(jnp.zeros(shape, dtype), CACHE_AXES),
        "v": constrain(jnp.zeros(shape, dtype), CACHE_AXES),
        "valid": jnp.zeros((batch, length), bool),
        "index": jnp.zeros((), jnp.int32),
    }


def _get(tree: Any, *keys: str) -> Any:
    for key in keys:
        if tree is None:
            return None
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def _layer(config: ModelConfig, sigma, x, lp, ln, cos, sin, q_slots, k_valid, visible, kv, index, layer):
    """One decoder block. ``lp``: this layer's params; ``ln``: its per-group noise (or None)."""
    B, T, _ = x.shape

    def lin(h, group, *names):
        """The named linear layers of ``group`` on the same input ``h`` (one ``h A`` product for all)."""
        return nn.dense_shared_input(h, [(lp[group][name]["kernel"], _get(lp, group, name, "bias"),
                                          _get(ln, group, name, "kernel"), _get(ln, group, name, "bias"))
                                         for name in names], sigma)

    h = nn.rms_norm(x, lp["input_norm"]["scale"], config.rms_norm_eps, _get(ln, "input_norm", "scale"))
    q, k, v = lin(h, "attn", "q_proj", "k_proj", "v_proj")
    q = q.reshape(B, T, config.num_heads, config.head_dim)
    k = k.reshape(B, T, config.num_kv_heads, config.head_dim)
    v = v.reshape(B, T, config.num_kv_heads, config.head_dim)
    q = nn.apply_rope(q, cos, sin)
    k = nn.apply_rope(k, cos, sin)
    if kv is None:
        keys, values = k, v
    else:
        k_all, v_all = kv
        k_all = jax.lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), (layer, 0, index, 0, 0))
        v_all = jax.lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), (layer, 0, index, 0, 0))
        kv = (k_all, v_all)
        keys = jax.lax.dynamic_index_in_dim(k_all, layer, 0, keepdims=False).astype(q.dtype)
        values = jax.lax.dynamic_index_in_dim(v_all, layer, 0, keepdims=False).astype(q.dtype)
    attn = nn.attention(q, keys, values, q_slots, k_valid, visible)
    x = x + lin(attn, "attn", "o_proj")[0]
    x = constrain(x, ACTIVATION_AXES)
    h = nn.rms_norm(x, lp["post_attn_norm"]["scale"], config.rms_norm_eps, _get(ln, "post_attn_norm", "scale"))
    gate, up = lin(h, "mlp", "gate_proj", "up_proj")
    x = x + lin(jax.nn.silu(gate) * up, "mlp", "down_proj")[0]
    return constrain(x, ACTIVATION_AXES), kv


def _layer_axis_first(tree: Any) -> Any:
    """Per-group noise of stacked leaves is ``[G, L, ...]``; scan wants ``[L, G, ...]``."""
    return jax.tree.map(lambda x: jnp.moveaxis(x, 1, 0), tree)


def _core(config: ModelConfig, params, noise, sigma, tokens, positions, mask, visible, kv, index, return_hidden):
    """Forward on already-prepared low-rank noise (or none). ``kv``: (k, v, valid) or None."""
    table = params["embed"]["embedding"]
    x = nn.embed(tokens, table, _get(noise, "embed", "embedding"), sigma).astype(table.dtype)
    x = constrain(x, ACTIVATION_AXES)
    cos, sin = nn.rope_tables(config, positions)
    T = tokens.shape[1]
    if kv is None:
        q_slots, k_valid, carry_kv = jnp.arange(T), mask, None
    else:
        k_all, v_all, valid = kv
        valid = jax.lax.dynamic_update_slice(valid, mask, (0, index))
        q_slots, k_valid, carry_kv = index + jnp.arange(T), valid, (k_all, v_all)

    layer_noise = _layer_axis_first(noise["layers"]) if noise is not None else None

    def body(carry, xs):
        x, kv_c = carry
        lp, ln, layer = xs
        x, kv_c = _layer(config, sigma, x, lp, ln, cos, sin, q_slots, k_valid, visible, kv_c, index, layer)
        return (x, kv_c), None

    xs = (params["layers"], layer_noise, jnp.arange(config.num_layers))
    (x, carry_kv), _ = jax.lax.scan(body, (x, carry_kv), xs)
    x = nn.rms_norm(x, params["final_norm"]["scale"], config.rms_norm_eps, _get(noise, "final_norm", "scale"))
    new_kv = None if kv is None else (*carry_kv, k_valid)
    out = x if return_hidden else _head(config, params, noise, sigma, x)
    return out, new_kv


def _head(config: ModelConfig, params, noise, sigma, x) -> jax.Array:
    if config.tie_word_embeddings:
        logits = nn.tied_head(x, params["embed"]["embedding"], _get(noise, "embed", "embedding"), sigma)
    else:
        logits = nn.dense(x, params["lm_head"]["kernel"], None, _get(noise, "lm_head", "kernel"), None, sigma)
    return logits.astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------------
# Full mode: vmap over groups of rows, each with its own materialized params
# ---------------------------------------------------------------------------------------------------------


def _split_groups(x: jax.Array, groups: int, axis: int) -> jax.Array:
    shape = x.shape
    return x.reshape(*shape[:axis], groups, shape[axis] // groups, *shape[axis + 1:])


def _merge_groups(x: jax.Array, axis: int) -> jax.Array:
    shape = x.shape
    return x.reshape(*shape[:axis], shape[axis] * shape[axis + 1], *shape[axis + 2:])


def _core_full(config, prepared: Prepared, tokens, positions, mask, visible, kv, index, return_hidden):
    G = prepared.groups
    row_args = [_split_groups(a, G, 0) for a in (tokens, positions, mask)]
    vis_g, vis_axis = (None, None) if visible is None else (_split_groups(visible, G, 0), 0)
    kv_g = None
    kv_axes = None
    if kv is not None:
        kv_g = (_split_groups(kv[0], G, 1), _split_groups(kv[1], G, 1), _split_groups(kv[2], G, 0))
        kv_axes = (1, 1, 0)

    def one(p, t, pos, m, vis, kv_one):
        return _core(config, p, None, prepared.sigma, t, pos, m, vis, kv_one, index, return_hidden)

    out, new_kv = jax.vmap(one, in_axes=(0, 0, 0, 0, vis_axis, kv_axes), out_axes=(0, kv_axes))(
        prepared.group_params, *row_args, vis_g, kv_g)
    out = _merge_groups(out, 0)
    if new_kv is not None:
        new_kv = (_merge_groups(new_kv[0], 1), _merge_groups(new_kv[1], 1), _merge_groups(new_kv[2], 0))
    return out, new_kv


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------


def default_positions(mask: jax.Array, start: jax.Array | int = 0) -> jax.Array:
    """RoPE positions for a (left- or right-) padded batch: ``start + (#real tokens before)``."""
    mask = jnp.asarray(mask)
    return (start + jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)).astype(jnp.int32)


def forward(config: ModelConfig, params: Any, tokens: jax.Array, positions: jax.Array | None = None,
            mask: jax.Array | None = None, cache: Cache | None = None,
            perturbation: Perturbation | Prepared | None = None, *,
            visible: jax.Array | None = None, return_hidden: bool = False) -> tuple[jax.Array, Cache | None]:
    """Run the decoder on ``tokens [B, T]``; returns float32 ``logits [B, T, vocab]`` and the updated cache.

    Args:
      config: static model config (hashable; pass as a static jit argument).
      params: parameter tree (``esjax.model.params`` layout), any dtype / sharding.
      tokens: ``[B, T]`` int token ids.
      positions: ``[B, T]`` RoPE positions (default: ``default_positions(mask)``, offset by nothing).
      mask: ``[B, T]`` bool, True for real tokens (default: all True).
      cache: from ``init_cache`` or a previous call; the tokens are written at ``cache['index']``.
      perturbation: per-row members (or a ``prepare``-d one to reuse noise across calls); None: plain model.
      visible: optional ``[B, T, S]`` bool (``S`` = cache length, or ``T`` without a cache) ANDed with the
        causal and padding masks: key slot ``j`` is visible to query ``i`` only where it is True (packed
        candidates use it so each one sees the prompt and its own earlier tokens only).
      return_hidden: return the final-normed hidden states ``[B, T, hidden]`` instead of logits.
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    mask = jnp.ones(tokens.shape, bool) if mask is None else jnp.asarray(mask, bool)
    positions = default_positions(mask) if positions is None else jnp.asarray(positions, jnp.int32)
    if isinstance(perturbation, Perturbation) and perturbation.rows != tokens.shape[0]:
        raise ValueError(f"forward: perturbation has {perturbation.rows} rows, tokens have {tokens.shape[0]}")
    prepared = prepare(perturbation, params)
    if prepared is not None and tokens.shape[0] % prepared.groups:
        raise ValueError(f"forward: {tokens.shape[0]} rows do not split into {prepared.groups} member groups")
    kv = None if cache is None else (cache["k"], cache["v"], cache["valid"])
    index = None if cache is None else cache["index"]
    if prepared is not None and prepared.mode == "full":
        out, new_kv = _core_full(config, prepared, tokens, positions, mask, visible, kv, index, return_hidden)
    else:
        noise = None if prepared is None else prepared.noise
        sigma = jnp.zeros((), jnp.float32) if prepared is None else prepared.sigma
        out, new_kv = _core(config, params, noise, sigma, tokens, positions, mask, visible, kv, index, return_hidden)
    new_cache = None
    if new_kv is not None:
        new_cache = {"k": new_kv[0], "v": new_kv[1], "valid": new_kv[2], "index": index + tokens.shape[1]}
    return out, new_cache


def logits_from_hidden(config: ModelConfig, params: Any, hidden: jax.Array,
                       perturbation: Perturbation | Prepared | None = None) -> jax.Array:
    """Output head on final-normed ``hidden [B, ..., d]`` (for chunked log-prob computations)."""
    prepared = prepare(perturbation, params)
    if prepared is None:
        return _head(config, params, None, jnp.zeros((), jnp.float32), hidden)
    if prepared.mode == "full":
        hg = _split_groups(hidden, prepared.groups, 0)
        out = jax.vmap(lambda p, h: _head(config, p, None, prepared.sigma, h))(prepared.group_params, hg)
        return _merge_groups(out, 0)
    return _head(config, params, prepared.noise, prepared.sigma, hidden)


def forward_last(config: ModelConfig, params: Any, tokens: jax.Array, positions: jax.Array | None = None,
                 mask: jax.Array | None = None, cache: Cache | None = None,
                 perturbation: Perturbation | Prepared | None = None) -> tuple[jax.Array, Cache | None]:
    """:func:`forward`'s float32 logits at the last position only, ``[B, vocab]``, and the updated cache.

    A prefill needs the next-token distribution of the last prompt position alone; the output head at every
    position would be most of a small model's prefill (vocabulary × hidden per token: 65% of the FLOPs of the
    embedded generative policy's 384-token prefill). The logits equal ``forward(...)[0][:, -1]``.
    """
    prepared = prepare(perturbation, params)
    hidden, cache = forward(config, params, tokens, positions, mask, cache, prepared, return_hidden=True)
    return logits_from_hidden(config, params, hidden[:, -1:], prepared)[:, 0], cache


forward_jit = jax.jit(forward, static_argnames=("config", "return_hidden"))
