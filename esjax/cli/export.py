"""``python -m esjax.export --run-dir DIR --out HF_DIR``: write a run's tuned policy as an HF folder.

Beside the weights, ``esjax.json`` records the run's agent and env settings (prompt style resolved, data
folder made absolute) and its evaluation of the exported version, so that ``python -m esjax.eval --model
HF_DIR`` evaluates the export the way the run did, with no extra flags.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from esjax.cli.common import run_cli

#: the run settings written beside an exported model (read by ``esjax.eval --model``)
SETTINGS_FILE = "esjax.json"
SETTINGS_FORMAT = 1
#: the settings ``esjax.eval`` uses besides the task's own ``env`` keys (:func:`eval_keys`), in the order it prints them
EVAL_KEYS = ("env.eval_split", "env.eval_goals", "env.max_steps", "agent.prompt_style", "agent.score_norm",
             "agent.max_prompt_tokens", "agent.max_candidate_tokens", "model.dtype")


def eval_keys(config: Any) -> tuple[str, ...]:
    """The settings ``esjax.eval`` uses, in the order it prints them: the task's own ``env`` keys (its ``Options``),
    ``env.task``, then :data:`EVAL_KEYS`."""
    from esjax.train.parts import build_task

    options = build_task(config.env).Options.model_fields
    return (*(f"env.{key}" for key in options), "env.task", *EVAL_KEYS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m esjax.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a run directory written by esjax.run")
    parser.add_argument("--out", required=True, help="output folder (config.json, model.safetensors, tokenizer, "
                                                     f"{SETTINGS_FILE})")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="storage dtype")
    return parser


def run_settings(config: Any, policy: Any) -> dict[str, Any]:
    """The config sections an evaluation of this run's policy needs: the whole ``env`` and ``agent`` sections
    (``agent.prompt_style`` with ``auto`` resolved, since a reloaded export is an HF model and ``auto`` could
    then pick another style; the task's data paths made absolute, :meth:`esjax.task.Task.portable_env`) and
    ``model.dtype``."""
    from esjax.train.parts import build_task, resolve_prompt_style

    env = build_task(config.env).portable_env(config.env.model_dump(mode="json"))
    agent = config.agent.model_dump(mode="json")
    agent["prompt_style"] = resolve_prompt_style(config.agent, policy, config.model.source)
    return {"env": env, "agent": agent, "model": {"dtype": config.model.dtype}}


def _run_eval(run_dir: Path, version: int) -> dict[str, Any] | None:
    """The run's own evaluation of ``version`` (from metrics.jsonl), or None."""
    from esjax.rundir.metrics import read_metrics

    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"
             and r.get("version") == version]
    if not evals:
        return None
    r = evals[-1]
    return {key: r.get(key) for key in ("version", "score", "success_rate", "goals")}


def write_settings(out: str | Path, run_dir: str | Path, config: Any, policy: Any, version: int) -> Path:
    import esjax

    run_dir = Path(run_dir)
    data = {"format": SETTINGS_FORMAT, "esjax": esjax.__version__,
            "exported_from": {"run_dir": str(run_dir.resolve()), "version": version,
                              "run_eval": _run_eval(run_dir, version)},
            "config": run_settings(config, policy)}
    path = Path(out) / SETTINGS_FILE
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from esjax.model.hf import export_pretrained
    from esjax.rundir.directory import resume_config
    from esjax.train.parts import load_run

    config = resume_config(args.run_dir)
    _, policy, params, version = load_run(args.run_dir, config)
    out = export_pretrained(args.out, policy.config, params, source_dir=policy.source_dir,
                            raw_config=policy.raw_config, dtype=args.dtype)
    if policy.source_dir is None:  # a from-scratch tokenizer lives only in memory: write it out
        policy.tokenizer.save(str(Path(out) / "tokenizer.json"))
        (Path(out) / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "<eos>",
             "unk_token": "<unk>"}, indent=2))
    settings = write_settings(out, args.run_dir, config, policy, version)
    print(f"exported version {version} of {args.run_dir} to {out} (run settings for esjax.eval: {settings.name})")
    return 0


def cli() -> None:
    """``python -m esjax.export``, with one-line user errors (:func:`esjax.cli.common.run_cli`)."""
    run_cli(main)


if __name__ == "__main__":
    cli()
