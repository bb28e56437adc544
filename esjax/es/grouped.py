"""The ES update's optimizer step, one group of leaves after another (``ESExecution.update_chunk_bytes``).

Why: a float32 gradient of every leaf at once is 4x θ in bf16 (twice that with its temporary), the update's
peak memory: Qwen2.5-7B's update would not fit an 80 GB device beside θ and the previous version. Stepping
consecutive leaves in groups whose float32 gradients fit a budget keeps one group's gradient alive at a time;
the planner (:mod:`esjax.plan.memory`) counts the worst group. ``benchmarks/update_memory.py`` measures it.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax

from esjax.es.gradient import Draws, leaf_noise_sums, scoped_leaves, zero_gradient
from esjax.es.noise import NoiseSpec

PyTree = Any

#: Default of :attr:`ESExecution.update_chunk_bytes`: float32 gradient bytes one group of leaves may hold at once.
UPDATE_CHUNK_BYTES = 256 << 20


def leaf_groups(sizes: Sequence[int], budget: int | None) -> list[list[int]]:
    """Consecutive leaf indices whose sizes (float32 gradient bytes) sum to at most ``budget``; a leaf above it
    is a group alone; ``None``: one group of every leaf."""
    if budget is None:
        return [list(range(len(sizes)))] if sizes else []
    groups: list[list[int]] = []
    used = 0
    for i, size in enumerate(sizes):
        if not groups or used + size > budget:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += size
    return groups


def _keyed(tree: PyTree) -> tuple[list[str], list[Any], Any]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(kp) for kp, _ in flat], [x for _, x in flat], treedef


def _group_state(tx: optax.GradientTransformation, sub_params: PyTree, state: dict[str, Any]) -> optax.OptState:
    """The optimizer state of a group of leaves, cut out of the whole state by key path.

    ``sub_params`` is θ with the other leaves replaced by None; ``tx.init`` on it says which state leaves the
    group has (its parameter-like leaves, and shared scalars such as Adam's count). A per-leaf transformation's
    group state is a part of the whole state; anything else is refused.
    """
    abstract = jax.eval_shape(tx.init, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), sub_params))
    keys, leaves, treedef = _keyed(abstract)
    for key, leaf in zip(keys, leaves):
        if key not in state or np.shape(state[key]) != leaf.shape:
            raise ValueError(f"ES update: the optimizer's state for a part of the leaves has {key} {leaf.shape}, "
                             "which its state for all leaves does not: it is not a per-leaf transformation (set "
                             "ESConfig.per_leaf_optimizer=False or ESExecution.update_chunk_bytes=None)")
    return jax.tree_util.tree_unflatten(treedef, [state[k] for k in keys])


def _step_group(noise: NoiseSpec, tx, paths: list[str], in_scope: list[bool], sub_params: PyTree, sub_state,
                draws: Draws | None, after: jax.Array | None):
    """Gradient, optimizer step and new θ of one group: ``(new θ leaves, new state, |g|², |update|² per leaf)``."""
    leaves, treedef = jax.tree_util.tree_flatten(sub_params)
    scoped = [(p, x) for p, x, s in zip(paths, leaves, in_scope) if s]
    sums = iter(leaf_noise_sums(noise, scoped, draws, after))
    grad = [next(sums) if s else zero_gradient(x) for x, s in zip(leaves, in_scope)]
    descent = jax.tree_util.tree_unflatten(treedef, [-g for g in grad])  # the decays are transforms of the chain
    updates, new_state = tx.update(descent, sub_state, sub_params)
    new_params = jax.tree_util.tree_leaves(optax.apply_updates(sub_params, updates))
    squared = functools.partial(optax.tree.norm, squared=True)  # optax's own, so the norms add up as before
    return new_params, new_state, [squared(g) for g in grad], [squared(u) for u in jax.tree_util.tree_leaves(updates)]


def grouped_step(tx: optax.GradientTransformation, noise: NoiseSpec, groups: list[list[int]], params: PyTree,
                 opt_state: optax.OptState, draws: Draws | None):
    """The optimizer step on ``-g`` (optimizer ``tx``, noise ``noise``), one group of leaf indices of ``groups``
    (:meth:`ESExecution.update_groups`) after another, from θ = ``params`` and ``opt_state``.

    Why: a float32 gradient of every leaf at once is 4x θ in bf16 (twice that with its temporary), the update's
    peak. A group's sums wait for the previous group's ``|update|²`` (:func:`~esjax.es.gradient.leaf_noise_sums`'
    ``after``: a data dependency, which XLA keeps; an ``optimization_barrier`` did not order them on CPU), so at
    most one group's float32 gradient is alive. Every leaf sums the same draws in the same order and the
    optimizer is per-leaf, so the result equals one group of every leaf (bit for bit for SGD, momentum and the
    decays; see ``tests/es/test_es_update.py`` for Adam). Returns ``(params, opt_state, |g|², |update|²)``.
    """
    leaves, in_scope, treedef = scoped_leaves(noise, params)
    state_keys, state_leaves, state_treedef = _keyed(opt_state)
    old_state = dict(zip(state_keys, state_leaves))
    flat = [x for _, x in leaves]
    results: list[Any] = []  # per group: (new θ leaves, new state, |g|², |update|²)
    after = None  # Σ |update|² of the groups so far: each group waits for all before it
    for group in groups:
        sub_params = jax.tree_util.tree_unflatten(treedef, [x if i in group else None for i, x in enumerate(flat)])
        results.append(_step_group(noise, tx, [leaves[i][0] for i in group], [in_scope[i] for i in group],
                                   sub_params, _group_state(tx, sub_params, old_state), draws, after))
        after = functools.reduce(operator.add, results[-1][3], 0.0 if after is None else after)

    new_params, grad_sq, update_sq = [None] * len(leaves), [None] * len(leaves), [None] * len(leaves)
    new_state: dict[str, Any] = {}
    for group, (params_out, state_out, g_sq, u_sq) in zip(groups, results):
        for i, p, g, u in zip(group, params_out, g_sq, u_sq):
            new_params[i], grad_sq[i], update_sq[i] = p, g, u
        for key, leaf in zip(*_keyed(state_out)[:2]):
            new_state.setdefault(key, leaf)  # shared leaves (a step count) are equal in every group
    missing = [k for k in state_keys if k not in new_state]
    if missing:
        raise ValueError(f"ES update: no group of leaves updates the optimizer state's {missing[0]}")
    opt_state = jax.tree_util.tree_unflatten(state_treedef, [new_state[k] for k in state_keys])
    total = functools.partial(functools.reduce, operator.add)
    return (jax.tree_util.tree_unflatten(treedef, new_params), opt_state, total(grad_sq, 0), total(update_sq, 0))
