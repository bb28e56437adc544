"""Load the policy a run fine-tunes: the embedded default, an HF folder, or a tiny random model.

All three go through the same objects (config, params, tokenizer, chat template), and the embedded default
is itself an HF folder read by the same loader as a real checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from esjax.model.config import ModelConfig, from_hf_dict
from esjax.model.hf import load_pretrained, render_chat
from esjax.model.params import init_params

#: The policies shipped in the package, by ``model.embedded`` name: (asset folder, the ``experiments`` script that
#: regenerates it). ``default`` scores WebShop's candidate actions (score mode); ``hasty`` is a handicapped recipe of
#: it (taught to buy without options on 70% of its last stage's demonstrations: issue 31's main job,
#: configs/hasty.yaml; the same weights as ``default`` until issue 54 replaces the default); ``generate`` writes
#: WebShop's actions (generate mode); ``generate-hasty`` is ``generate`` taught to buy without options on a third of
#: its demonstrations (a habit for ES to unlearn: configs/generate.yaml); ``babyai`` scores BabyAI's actions
#: (envs/babyai_bridge/agent.py).
EMBEDDED_RECIPES = {"default": ("default_policy", "pretrain_default_policy"),
                    "hasty": ("hasty_policy", "pretrain_default_policy"),
                    "generate": ("generate_policy", "pretrain_generate_policy"),
                    "generate-hasty": ("generate_hasty_policy", "pretrain_generate_policy"),
                    "babyai": ("babyai_policy", "pretrain_babyai_policy")}
EMBEDDED_POLICIES = {name: Path(__file__).resolve().parents[1] / "assets" / folder
                     for name, (folder, _) in EMBEDDED_RECIPES.items()}
EMBEDDED_POLICY_DIR = EMBEDDED_POLICIES["default"]

#: A tiny Qwen2-architecture config for ``model.source: random`` (tests, smoke runs).
TINY_RANDOM_CONFIG: dict[str, Any] = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 512, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "hidden_act": "silu", "eos_token_id": 1, "pad_token_id": 0,
}


@dataclasses.dataclass
class LoadedPolicy:
    """A policy's model and text interface."""

    config: ModelConfig
    params: Any
    tokenizer: Any
    chat_template: str | None = None
    special_tokens: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    source_dir: Path | None = None
    raw_config: Mapping[str, Any] | None = None

    def chat_renderer(self) -> Callable[[Sequence[Mapping[str, Any]]], str] | None:
        if self.chat_template is None:
            return None
        template, special = self.chat_template, dict(self.special_tokens)
        return lambda messages: render_chat(template, messages, True, **special)

    def stop_token_ids(self) -> list[int]:
        """The tokens that end a written reply: config.json's end-of-sequence ids and the tokenizer's own
        (``eos_token`` and the usual chat-turn ends), sorted."""
        stop = set(self.config.eos_token_ids)
        for name in ("eos_token", "<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            token = self.special_tokens.get(name, name) if name == "eos_token" else name
            token_id = self.tokenizer.token_to_id(token) if isinstance(token, str) else None
            if token_id is not None:
                stop.add(int(token_id))
        return sorted(stop)


def load_policy(source: str, path: str | None = None, dtype: str = "float32", *,
                random_config: Mapping[str, Any] | None = None, seed: int = 0,
                texts: Callable[[], Iterable[str]] | None = None, mesh: Any = None,
                embedded: str = "default") -> LoadedPolicy:
    """Load the policy named by a run's ``model`` section.

    Args:
      source: ``'embedded'`` (shipped in the package), ``'hf'`` (folder at ``path``) or ``'random'``.
      embedded: for ``'embedded'``: which shipped policy (a key of ``EMBEDDED_POLICIES``).
      texts: for ``'random'``: the corpus its BPE tokenizer is trained on (e.g. the shop's text).
    """
    if source in ("embedded", "hf"):
        if source == "embedded" and embedded not in EMBEDDED_POLICIES:
            raise ValueError(f"model.embedded: expected one of {sorted(EMBEDDED_POLICIES)}, got {embedded!r}")
        folder = EMBEDDED_POLICIES[embedded] if source == "embedded" else Path(path or "").expanduser()
        if source == "embedded" and not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder}: the embedded {embedded} policy is missing from this installation "
                                    f"(regenerate it with python -m experiments.{EMBEDDED_RECIPES[embedded][1]})")
        pre = load_pretrained(folder, mesh=mesh, dtype=dtype)
        return LoadedPolicy(pre.config, pre.params, pre.tokenizer, pre.chat_template, pre.special_tokens,
                            pre.path, pre.raw_config)
    if source == "random":
        from esjax.agent.tokenizer import train_bpe

        raw = dict(TINY_RANDOM_CONFIG if random_config is None else random_config)
        config = from_hf_dict(raw, "model.random_config")
        params = init_params(config, jax.random.key(seed), dtype)
        corpus = list(texts()) if texts is not None else ["goal page act choose buy now open next back"]
        tokenizer = train_bpe(corpus, config.vocab_size)
        return LoadedPolicy(config, params, tokenizer, raw_config=raw)
    raise ValueError(f"model.source: expected 'embedded', 'hf' or 'random', got {source!r}")
