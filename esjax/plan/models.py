"""Built-in model configs for planning without a download, and resolving ``--model PATH_OR_NAME``.

Values are the published ``config.json`` fields of each checkpoint (see REFERENCES.md, "Model families").
"""

from __future__ import annotations

import json
from pathlib import Path

from esjax.model.config import ModelConfig, ModelConfigError, RopeScaling, from_hf_dict


def _qwen(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                       head_dim=hidden // heads, intermediate_size=inter, rms_norm_eps=1e-6, rope_theta=1e6,
                       qkv_bias=True, tie_word_embeddings=tied, max_position_embeddings=32768,
                       model_type="qwen2", dtype="bfloat16")


BUILTIN: dict[str, ModelConfig] = {
    "Qwen2.5-0.5B": _qwen(896, 24, 14, 2, 4864, 151936, True),
    "Qwen2.5-1.5B": _qwen(1536, 28, 12, 2, 8960, 151936, True),
    "Qwen2.5-3B": _qwen(2048, 36, 16, 2, 11008, 151936, True),
    "Qwen2.5-7B": _qwen(3584, 28, 28, 4, 18944, 152064, False),
    "Llama-3.2-1B": ModelConfig(
        vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
        intermediate_size=8192, rms_norm_eps=1e-5, rope_theta=5e5,
        rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192), tie_word_embeddings=True,
        max_position_embeddings=131072, model_type="llama", dtype="bfloat16"),
}

#: Suffixes of hub names that do not change the architecture.
_SUFFIXES = ("-instruct", "-chat", "-base")


def _canonical(name: str) -> str:
    name = name.strip().rsplit("/", 1)[-1].lower()
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def resolve_model(name_or_path: str) -> tuple[ModelConfig, str]:
    """``(config, label)`` for an HF folder / ``config.json`` path, or a built-in name.

    Hub-style names work too (``Qwen/Qwen2.5-7B-Instruct`` → ``Qwen2.5-7B``). Raises ``ModelConfigError`` naming
    the input and the known names otherwise.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ModelConfigError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
        return from_hf_dict(data, str(path)), str(path.parent)
    wanted = _canonical(name_or_path)
    for name, config in BUILTIN.items():
        if _canonical(name) == wanted:
            return config, name
    raise ModelConfigError(f"--model {name_or_path!r}: not an HF folder with config.json and not a built-in model "
                      f"(built-in: {', '.join(BUILTIN)})")
