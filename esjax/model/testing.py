"""Tiny models and checkpoints for tests and examples (no downloads).

``make_hf_checkpoint`` builds a random ``transformers`` Qwen2 / Llama model (torch must be installed), with
non-trivial biases and norm scales so parity tests exercise every parameter, saves it with
``save_pretrained`` plus a small word-level ``tokenizer.json`` and a chat template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from esjax.model.config import ModelConfig

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "search for a red shirt under 30 dollars",
    "click buy now",
    "click back to search",
    "i need a blue cotton shirt size large",
    "the product page shows price rating description features reviews",
    "next page previous page options color size",
]


def tiny_config(**changes: Any) -> ModelConfig:
    """A 2-layer GQA config small enough for a CPU unit test."""
    base = dict(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                intermediate_size=48, qkv_bias=True, tie_word_embeddings=False)
    base.update(changes)
    return ModelConfig(**base)


def write_tiny_tokenizer(model_dir: str | Path, vocab_size: int = 128) -> Any:
    """Train a word-level ``tokenizers.Tokenizer`` on a few strings; write tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    model_dir = Path(model_dir)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(_CORPUS, trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=specials))
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(model_dir / "tokenizer.json"))
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                  "unk_token": "<unk>", "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2), encoding="utf-8")
    return tok


def make_hf_model(kind: str = "qwen2", tied: bool = False, seed: int = 0, vocab_size: int = 128,
                  hidden_size: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                  intermediate_size: int = 96, llama3_scaling: bool = True, scale: float = 0.2):
    """A random ``transformers`` causal LM (eval mode, float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate_size,
                  tie_word_embeddings=tied, max_position_embeddings=16384, eos_token_id=None, bos_token_id=None)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif kind == "llama":
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": 500000.0}
        if llama3_scaling:  # a short original context so all three llama3 frequency bands occur
            rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64, "rope_theta": 500000.0}
        model = LlamaForCausalLM(LlamaConfig(**common, rope_parameters=rope))
    else:
        raise ValueError(f"unknown kind {kind!r}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, scale)
    return model.eval()


def make_hf_checkpoint(model_dir: str | Path, kind: str = "qwen2", tied: bool = False, **kwargs: Any):
    """Save a random HF model + tiny tokenizer into ``model_dir``; returns the torch model."""
    model_dir = Path(model_dir)
    model = make_hf_model(kind, tied, **kwargs)
    model.save_pretrained(str(model_dir))
    write_tiny_tokenizer(model_dir, vocab_size=model.config.vocab_size)
    return model
