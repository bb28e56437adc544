"""Qwen2 / Llama decoder as pure functions over a parameter pytree, with in-matmul ES perturbations.

Modules: ``config`` (HF config.json ⇄ ``ModelConfig``), ``params`` (layout, logical axes, init),
``decoder`` (``forward``, ``init_cache``), ``perturb`` (per-row members: ``Perturbation``, ``prepare``),
``sharding`` (logical axis rules, mesh helpers), ``hf`` (safetensors / tokenizer / chat template load and
export), ``testing`` (tiny random checkpoints).
"""

from esjax.model.config import ModelConfig, ModelConfigError, RopeScaling, from_hf_dict, to_hf_dict
from esjax.model.decoder import forward, forward_jit, init_cache, logits_from_hidden
from esjax.model.params import init_params, param_logical_axes, param_shapes
from esjax.model.perturb import Perturbation, Prepared, prepare, prepare_jit

__all__ = [
    "ModelConfigError", "ModelConfig", "RopeScaling", "from_hf_dict", "to_hf_dict",
    "forward", "forward_jit", "init_cache", "logits_from_hidden",
    "init_params", "param_logical_axes", "param_shapes",
    "Perturbation", "Prepared", "prepare", "prepare_jit",
]
