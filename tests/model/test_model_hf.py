"""Logits / generation parity with transformers, padding, export round trip, HF file handling and errors."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("needs torch and transformers (pip install -e '.[test]')", allow_module_level=True)


class _Lazy:
    """torch / transformers, imported when first used: collecting this file (every xdist worker collects every
    file) does not pay their ~3 s import."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("_"):  # what pytest probes while collecting (__test__, _pytestfixturefunction, ...)
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


torch = _Lazy("torch")
transformers = _Lazy("transformers")

from esjax.agent.batch_generate import generate  # noqa: E402
from esjax.model import hf  # noqa: E402
from esjax.model.config import ModelConfigError, from_hf_dict  # noqa: E402
from esjax.model.decoder import default_positions, forward_jit  # noqa: E402
from esjax.model.testing import CHAT_TEMPLATE, make_hf_checkpoint  # noqa: E402

CASES = [("qwen2", False), ("qwen2", True), ("llama", False)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{k}-{'tied' if t else 'untied'}" for k, t in CASES])
def checkpoint(request, tmp_path_factory):
    kind, tied = request.param
    path = tmp_path_factory.mktemp(f"{kind}_{tied}")
    model = make_hf_checkpoint(path, kind, tied)
    config, _ = hf.read_config(path)
    params = hf.load_params(path, config)
    return path, model, config, params


def _hf_logits(model, tokens, mask=None):
    with torch.no_grad():
        kwargs = {} if mask is None else {"attention_mask": torch.tensor(mask, dtype=torch.long)}
        return model(torch.tensor(tokens), **kwargs).logits.numpy()


def test_config_matches_checkpoint(checkpoint):
    _, model, config, _ = checkpoint
    assert config.num_layers == 2 and config.num_kv_heads == 2 and config.num_heads == 4
    assert config.tie_word_embeddings == model.config.tie_word_embeddings
    assert config.qkv_bias == (config.model_type == "qwen2")
    if config.model_type == "llama":
        assert config.rope_scaling is not None and config.rope_scaling.kind == "llama3"


def test_logits_parity(checkpoint):
    _, model, config, params = checkpoint
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (2, 40))
    ours, _ = forward_jit(config, params, tokens)
    assert np.abs(np.asarray(ours) - _hf_logits(model, tokens)).max() <= 1e-4


def test_greedy_generation_matches_transformers(checkpoint):
    _, model, config, params = checkpoint
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
    ours = generate(config, params, prompts, max_new_tokens=20, stop_token_ids=())
    for prompt, got in zip(prompts, ours):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        assert got == ref[0, len(prompt):].tolist()


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_unpadded_rows(checkpoint, side):
    _, _, config, params = checkpoint
    rng = np.random.RandomState(1)
    seqs = [rng.randint(0, config.vocab_size, n).tolist() for n in (9, 4, 13)]
    length = 16
    tokens = np.zeros((3, length), np.int32)
    mask = np.zeros((3, length), bool)
    for i, s in enumerate(seqs):
        sl = slice(length - len(s), length) if side == "left" else slice(0, len(s))
        tokens[i, sl] = s
        mask[i, sl] = True
    batched, _ = forward_jit(config, params, tokens, default_positions(mask), mask)
    for i, s in enumerate(seqs):
        alone, _ = forward_jit(config, params, np.asarray([s]))
        got = np.asarray(batched[i])[mask[i]]
        assert np.abs(got - np.asarray(alone[0])).max() <= 1e-5


def test_left_padded_batch_matches_transformers(checkpoint):
    _, model, config, params = checkpoint
    tokens = np.array([[0, 0, 0, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6, 7]])
    mask = tokens != 0
    mask[1] = True
    ours, _ = forward_jit(config, params, tokens, default_positions(mask), mask)
    ref = _hf_logits(model, tokens, mask)
    assert np.abs(np.asarray(ours)[mask] - ref[mask]).max() <= 1e-4


def test_export_round_trip(checkpoint, tmp_path):
    path, model, config, params = checkpoint
    # a tiny shard limit forces the sharded layout (and its index) on both write and read
    out = hf.export_pretrained(tmp_path / "export", config, params, source_dir=path, max_shard_bytes=40_000)
    assert (out / hf.WEIGHTS_INDEX_FILE).is_file() and (out / hf.TOKENIZER_FILE).is_file()
    modes = {f.name: f.stat().st_mode & 0o777 for f in out.iterdir()}  # weights as readable as their siblings
    assert len(set(modes.values())) == 1, modes
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokens = np.random.RandomState(2).randint(0, config.vocab_size, (2, 24))
    assert np.abs(_hf_logits(reloaded, tokens) - _hf_logits(model, tokens)).max() <= 1e-5
    ours_again = hf.load_params(out, hf.read_config(out)[0])
    a, _ = forward_jit(config, ours_again, tokens)
    b, _ = forward_jit(config, params, tokens)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))
    assert tok("click buy now")["input_ids"] == hf.load_tokenizer(path).encode("click buy now").ids
    auto_out, auto_src = (transformers.AutoTokenizer.from_pretrained(str(p)) for p in (out, path))
    assert auto_out("search for a red shirt")["input_ids"] == auto_src("search for a red shirt")["input_ids"]


def test_bfloat16_load_and_export(checkpoint, tmp_path):
    path, model, config, _ = checkpoint
    pre = hf.load_pretrained(path, dtype=jnp.bfloat16, tokenizer=False)
    assert pre.config.dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for x in __import__("jax").tree.leaves(pre.params))
    tokens = np.random.RandomState(3).randint(0, config.vocab_size, (1, 16))
    ours, _ = forward_jit(pre.config, pre.params, tokens)
    ref = _hf_logits(model, tokens)
    assert np.abs(np.asarray(ours) - ref).max() < 0.1 * np.abs(ref).max()
    out = hf.export_pretrained(tmp_path / "bf16", pre.config, pre.params, source_dir=path)
    assert json.loads((out / hf.CONFIG_FILE).read_text())["dtype"] == "bfloat16"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert reloaded.model.embed_tokens.weight.dtype == torch.bfloat16


def test_tokenizer_and_chat_template(checkpoint):
    path = checkpoint[0]
    pre = hf.load_pretrained(path)
    assert pre.chat_template == CHAT_TEMPLATE
    text = pre.apply_chat_template([{"role": "user", "content": "click buy now"}])
    assert text == "<|im_start|>user\nclick buy now<|im_end|>\n<|im_start|>assistant\n"
    ids = pre.tokenizer.encode("search for a red shirt").ids
    assert pre.tokenizer.decode(ids) == "search for a red shirt"
    ref = transformers.PreTrainedTokenizerFast.from_pretrained(str(path))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "click buy now"}]
    assert pre.apply_chat_template(messages, add_generation_prompt=False) == ref.apply_chat_template(
        messages, tokenize=False)


def test_legacy_rope_keys_parse_like_rope_parameters():
    legacy = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 16, "rope_theta": 500000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    new = {k: v for k, v in legacy.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = dict(legacy["rope_scaling"], rope_theta=500000.0)
    assert from_hf_dict(legacy) == from_hf_dict(new)
    assert from_hf_dict(legacy).rope_scaling.factor == 32.0


@pytest.mark.parametrize("change, match", [
    ({"model_type": "qwen3"}, "model_type='qwen3'"),
    ({"architectures": ["MistralForCausalLM"]}, "architectures"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope_parameters.rope_type='yarn'"),
    ({"hidden_size": None}, "missing required key 'hidden_size'"),
    ({"use_sliding_window": True}, "use_sliding_window"),
])
def test_unsupported_configs_name_file_and_key(checkpoint, tmp_path, change, match):
    path = checkpoint[0]
    raw = json.loads((path / hf.CONFIG_FILE).read_text())
    raw.update(change)
    (tmp_path / hf.CONFIG_FILE).write_text(json.dumps(raw))
    with pytest.raises(ModelConfigError, match=match) as err:
        hf.read_config(tmp_path)
    assert "config.json" in str(err.value)


def test_missing_files_and_tensors_are_named(checkpoint, tmp_path):
    path, _, config, _ = checkpoint
    with pytest.raises(hf.ModelFileError, match="config.json: file not found"):
        hf.read_config(tmp_path)
    shutil.copyfile(path / hf.CONFIG_FILE, tmp_path / hf.CONFIG_FILE)
    with pytest.raises(hf.ModelFileError, match="model.safetensors"):
        hf.load_params(tmp_path, config)
    index = {"weight_map": {"model.embed_tokens.weight": "model.safetensors"}}
    (tmp_path / hf.WEIGHTS_INDEX_FILE).write_text(json.dumps(index))
    shutil.copyfile(path / hf.WEIGHTS_FILE, tmp_path / hf.WEIGHTS_FILE)
    with pytest.raises(hf.ModelFileError, match=r"weight_map has no key 'model\."):
        hf.load_params(tmp_path, config)
    with pytest.raises(hf.ModelFileError, match="tokenizer.json: file not found"):
        hf.load_tokenizer(tmp_path)
    wrong = config.replace(intermediate_size=config.intermediate_size + 1)
    (tmp_path / hf.WEIGHTS_INDEX_FILE).unlink()
    with pytest.raises(hf.ModelFileError, match="has shape"):
        hf.load_params(tmp_path, wrong)
