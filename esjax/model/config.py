"""Decoder configuration, parsed from (and written back to) a Hugging Face ``config.json``.

One frozen, hashable dataclass covers the Qwen2 / Qwen2.5 and Llama 3.x families, so it can be a static
argument of ``jax.jit``. Parsing accepts both the legacy ``rope_theta`` / ``rope_scaling`` keys and the
newer ``rope_parameters`` dict; anything we cannot run faithfully is rejected with an error naming the
file and the key instead of silently producing a different model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from esjax.errors import EsjaxError

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
_DTYPES = ("float32", "bfloat16", "float16")


class ModelConfigError(EsjaxError, ValueError):
    """A config.json that esjax cannot run (names the file and key). A run config's problem is
    :class:`esjax.config.ConfigError`."""




@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``kind='llama3'`` is Llama 3.1+'s piecewise scaling; ``'linear'`` divides
    positions by ``factor``."""

    kind: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Qwen2 / Llama decoder.

    ``dtype`` is the default parameter / activation dtype for ``init_params`` and loading; the forward pass
    computes in the dtype of the parameters it is given (norms, RoPE and softmax always in float32).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    model_type: str = "qwen2"
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size"):
            if int(getattr(self, name)) < 1:
                raise ModelConfigError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                              f"({self.num_kv_heads})")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelConfigError(f"ModelConfig.model_type must be one of {SUPPORTED_MODEL_TYPES}, got "
                                   f"{self.model_type!r}")
        if self.dtype not in _DTYPES:
            raise ModelConfigError(f"ModelConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------


def _require(d: Mapping[str, Any], key: str, source: str) -> Any:
    if key not in d or d[key] is None:
        raise ModelConfigError(f"{source}: missing required key {key!r}")
    return d[key]


def _rope_from_hf(d: Mapping[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from either ``rope_parameters`` or ``rope_theta`` + ``rope_scaling``."""
    params = d.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params = dict(d.get("rope_scaling") or {})
        key = "rope_scaling"
        if "rope_theta" in d:
            params.setdefault("rope_theta", d["rope_theta"])
    if not isinstance(params, Mapping):
        raise ModelConfigError(f"{source}: {key!r} must be a dict, got {type(params).__name__}")
    if params and all(isinstance(v, Mapping) for v in params.values()):
        raise ModelConfigError(f"{source}: per-layer-type {key!r} (keys {sorted(params)}) is not supported")
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ModelConfigError(f"{source}: {key}.rope_type={kind!r} is not supported (supported: "
                               f"{SUPPORTED_ROPE_TYPES})")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelConfigError(f"{source}: {key}.partial_rotary_factor != 1 is not supported")
    if kind == "default":
        return theta, None
    factor = float(_require(params, "factor", f"{source} {key}"))
    if kind == "linear":
        return theta, RopeScaling(kind="linear", factor=factor)
    return theta, RopeScaling(
        kind="llama3",
        factor=factor,
        low_freq_factor=float(_require(params, "low_freq_factor", f"{source} {key}")),
        high_freq_factor=float(_require(params, "high_freq_factor", f"{source} {key}")),
        original_max_position_embeddings=int(_require(params, "original_max_position_embeddings",
                                                      f"{source} {key}")),
    )


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _dtype_from_hf(d: Mapping[str, Any]) -> str:
    value = d.get("dtype", d.get("torch_dtype")) or "float32"
    value = str(value).replace("torch.", "")
    return value if value in _DTYPES else "float32"


def from_hf_dict(d: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """Parse a Hugging Face config dict. ``source`` names the file in error messages."""
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelConfigError(f"{source}: model_type={model_type!r} is not supported "
                          f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    archs = d.get("architectures") or []
    expected = _ARCHITECTURES[model_type]
    if archs and any(a != expected for a in archs):
        raise ModelConfigError(f"{source}: architectures={archs!r} is not supported for model_type={model_type!r} "
                          f"(expected [{expected!r}])")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"{source}: hidden_act={act!r} is not supported (only 'silu')")
    if d.get("use_sliding_window"):
        raise ModelConfigError(f"{source}: use_sliding_window=true is not supported")
    layer_types = d.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise ModelConfigError(f"{source}: layer_types other than 'full_attention' are not supported")
    if int(d.get("pretraining_tp", 1)) != 1:
        raise ModelConfigError(f"{source}: pretraining_tp != 1 is not supported")

    hidden = int(_require(d, "hidden_size", source))
    heads = int(_require(d, "num_attention_heads", source))
    kv_heads = int(d.get("num_key_value_heads") or heads)
    head_dim = int(d.get("head_dim") or hidden // heads)
    theta, scaling = _rope_from_hf(d, source)
    if model_type == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
    else:
        qkv_bias = o_bias = bool(d.get("attention_bias", False))
        mlp_bias = bool(d.get("mlp_bias", False))
    return ModelConfig(
        vocab_size=int(_require(d, "vocab_size", source)),
        hidden_size=hidden,
        num_layers=int(_require(d, "num_hidden_layers", source)),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(_require(d, "intermediate_size", source)),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
        model_type=model_type,
        dtype=_dtype_from_hf(d),
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=_eos_ids(d.get("eos_token_id")),
        pad_token_id=d.get("pad_token_id"),
    )


def to_hf_dict(config: ModelConfig, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """HF ``config.json`` contents for ``config``; keys of ``base`` (the loaded file) are kept unless we own them."""
    out: dict[str, Any] = dict(base or {})
    for legacy in ("rope_scaling", "rope_theta", "torch_dtype"):
        out.pop(legacy, None)
    rope: dict[str, Any] = {"rope_theta": config.rope_theta, "rope_type": "default"}
    if config.rope_scaling is not None:
        s = config.rope_scaling
        rope = {"rope_theta": config.rope_theta, "rope_type": s.kind, "factor": s.factor}
        if s.kind == "llama3":
            rope.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                        original_max_position_embeddings=s.original_max_position_embeddings)
    eos: Any = list(config.eos_token_ids)
    eos = None if not eos else (eos[0] if len(eos) == 1 else eos)
    out.update(
        architectures=[_ARCHITECTURES[config.model_type]],
        model_type=config.model_type,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=rope,
        hidden_act="silu",
        tie_word_embeddings=config.tie_word_embeddings,
        max_position_embeddings=config.max_position_embeddings,
        dtype=config.dtype,
        bos_token_id=config.bos_token_id,
        eos_token_id=eos,
        pad_token_id=config.pad_token_id,
    )
    if config.model_type == "llama":
        if config.qkv_bias != config.o_bias:
            raise ModelConfigError("llama configs tie q/k/v and o biases (attention_bias); got qkv_bias != o_bias")
        out.update(attention_bias=config.qkv_bias, mlp_bias=config.mlp_bias)
    elif not config.qkv_bias or config.o_bias or config.mlp_bias:
        raise ModelConfigError("qwen2 configs have q/k/v bias and no o/mlp bias; use model_type='llama' otherwise")
    return out
