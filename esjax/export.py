"""``python -m esjax.export --run-dir DIR --out HF_DIR``: write a run's tuned policy as an HF folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from esjax.cli_util import run_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m esjax.export", description=__doc__)
    parser.add_argument("--run-dir", required=True, help="a run directory written by esjax.run")
    parser.add_argument("--out", required=True, help="output folder (config.json, model.safetensors, tokenizer)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="storage dtype")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from esjax.model.hf import export_pretrained
    from esjax.trainer import load_run, resume_config

    config = resume_config(args.run_dir)
    _, policy, params, version = load_run(args.run_dir, config)
    out = export_pretrained(args.out, policy.config, params, source_dir=policy.source_dir,
                            raw_config=policy.raw_config, dtype=args.dtype)
    if policy.source_dir is None:  # a from-scratch tokenizer lives only in memory: write it out
        policy.tokenizer.save(str(Path(out) / "tokenizer.json"))
        (Path(out) / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "<eos>",
             "unk_token": "<unk>"}, indent=2))
    print(f"exported version {version} of {args.run_dir} to {out}")
    return 0


if __name__ == "__main__":
    run_cli(main)
