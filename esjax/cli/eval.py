"""``python -m esjax.eval --run-dir DIR | --model PATH``: score a trained run or an HF folder on held-out goals.

A folder written by ``esjax.export`` carries the run's settings (``esjax.json``: data, goals, max steps,
prompt style, ...): ``--model`` uses them unless ``--config``, ``--data``, ``--split`` or ``--goals`` set a key
(or ``--ignore-run-settings`` is given), and says which settings came from the file.

``--json`` prints the score, success rate, their 95% intervals over goals, the seconds it took and, per goal, its
index, reward and success flag (generate mode: also the invalid-action rate and the tokens an episode cost);
``--traces FILE`` writes each episode's trace (as a run's ``traces/eval-v<version>.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from esjax.cli.common import UserError, run_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m esjax.eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-dir", help="a run directory written by esjax.run (uses its latest checkpoint)")
    source.add_argument("--model", help="an HF folder (config.json, model.safetensors, tokenizer.json; "
                                        "esjax.json when written by esjax.export)")
    parser.add_argument("--config", help="config for --model runs (env and agent sections); its keys override "
                                         "the export's esjax.json; default settings otherwise")
    parser.add_argument("--data", help="env.data: WebShop's 'synthetic' or a WebShop data folder (default: the run's / "
                                       "config's)")
    parser.add_argument("--split", default=None, choices=["test", "eval", "train"], help="goal split")
    parser.add_argument("--goals", type=int, default=None, help="number of goals (default: the config's)")
    parser.add_argument("--batch", type=int, default=256,
                        help="most episodes played side by side (default 256); each is a row of the model's batch, "
                             "so in generate mode a smaller batch bounds memory (100 SmolLM2 rows peaked at 19.9 GB)")
    parser.add_argument("--goal-set", default=None, choices=["templated", "human", "synthetic"],
                        help="WebShop's goal set (env.goals): templated = built from items_ins_v2, human = "
                             "items_human_ins.json, what published WebShop scores use ('synthetic': templated's "
                             "old name; default: the run's / config's)")
    parser.add_argument("--ignore-run-settings", action="store_true",
                        help="--model: do not read the export's esjax.json (use --config or the defaults)")
    parser.add_argument("--json", action="store_true",
                        help="print the result as JSON: score, success rate, their 95%% intervals over goals, and "
                             "per goal (in evaluation order) its index, reward and success flag")
    parser.add_argument("--traces", metavar="FILE",
                        help="write each episode's trace as a JSON line to FILE: goal, instruction, actions with "
                             "observation snippets, reward and WebShop's reward breakdown")
    return parser


def read_run_settings(model_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any], Path] | None:
    """(config sections, the whole file, its path) of an export's ``esjax.json``, or None when there is none."""
    from esjax.cli.export import SETTINGS_FILE

    path = Path(model_dir).expanduser() / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: cannot read the export's run settings ({err.__class__.__name__}); "
                        "pass --ignore-run-settings to evaluate without them") from None
    sections = data.get("config") if isinstance(data, dict) else None
    if not isinstance(sections, dict):
        raise UserError(f"{path}: no 'config' mapping of sections; pass --ignore-run-settings to evaluate "
                        "without it")
    return sections, data, path


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _settings_line(config: Any, base: dict[str, Any], user_set: dict[str, str], path: Path) -> str:
    """``settings from DIR/esjax.json: env.data=..., ...; overridden: env.eval_goals=8 (--goals)``."""
    from esjax.cli.export import eval_keys
    from esjax.train.parts import build_task

    task = build_task(config.env)
    dumped = config.model_dump(mode="json")
    used, overridden = [], []
    for key in eval_keys(config):
        if not task.applies(key):
            continue
        value = _lookup(dumped, key)
        if key in user_set:
            overridden.append(f"{key}={value} ({user_set[key]})")
        elif _lookup(base, key) is not None:
            used.append(f"{key}={value}")
    line = f"settings from {path}: {', '.join(used) or 'none used'}"
    if overridden:
        line += f"; overridden: {', '.join(overridden)}"
    return line


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch < 1:
        raise UserError(f"--batch {args.batch}: at least 1 episode must be played at a time")
    from esjax.config import key_paths, load_config, read_yaml
    from esjax.rundir.directory import resume_config
    from esjax.train.parts import build_agent, build_policy, held_out_goals, load_run, load_task, resolve_prompt_style

    overrides = []
    user_set: dict[str, str] = {}  # key -> the flag that set it
    for flag, key, value in (("--data", "env.data", args.data), ("--split", "env.eval_split", args.split),
                             ("--goals", "env.eval_goals", args.goals),
                             ("--goal-set", "env.goals", args.goal_set)):
        if value:
            overrides.append(f"{key}={value}")
            user_set[key] = flag
    if args.run_dir:
        config = resume_config(args.run_dir, overrides)
        task, policy, params, version = load_run(args.run_dir, config)
        what = f"{args.run_dir} (version {version})"
    else:
        if not Path(args.model).expanduser().is_dir():
            raise UserError(f"--model {args.model}: not a directory (an HF folder with config.json, "
                            "model.safetensors and tokenizer.json is expected)")
        found = None if args.ignore_run_settings else read_run_settings(args.model)
        if args.config:
            for keys in key_paths(read_yaml(args.config)):
                user_set.setdefault(".".join(keys), "--config")
        model = ["model.source=hf", f"model.path={args.model}"]
        if found is None:
            config = load_config(args.config, [*overrides, *model])
        else:
            base, data, path = found
            config = load_config(args.config, [*overrides, *model], base=base, base_source=str(path))
            print(_settings_line(config, base, user_set, path), file=sys.stderr)
            origin = data.get("exported_from") or {}
            run_eval = origin.get("run_eval") or {}
            if run_eval.get("score") is not None:
                print(f"the run ({origin.get('run_dir')}) scored {run_eval['score']:.1f} at version "
                      f"{run_eval.get('version')} on {run_eval.get('goals')} goals", file=sys.stderr)
        task = load_task(config.env)
        policy = build_policy(config.model, task, config.run.seed)
        params, what = policy.params, args.model
    goals = held_out_goals(config.env, task)
    if not goals:
        raise UserError(f"env.eval_split: no {config.env.eval_split!r} goals in {task.data_name()}")
    style = resolve_prompt_style(config.agent, policy, config.model.source)
    which = " ".join(filter(None, (config.env.eval_split, task.goal_label())))
    print(f"evaluating {what} on {len(goals)} {which} goals of {task.data_name()}, max "
          f"{config.env.max_steps} steps, prompt style {style}", file=sys.stderr)
    from esjax.train.standalone_eval import evaluate_policy

    agent = build_agent(config.agent, policy, config.model.source, task)
    result = evaluate_policy(policy.config, params, agent, task.pool, goals, config.env.max_steps, batch=args.batch,
                             traces=bool(args.traces), max_new_tokens=config.agent.max_new_tokens,
                             is_success=task.is_success)
    traces = result.pop("traces", None)
    if traces is not None:
        from esjax.rundir.traces import write_traces

        try:
            path = write_traces(args.traces, traces)
        except OSError as err:
            raise UserError(f"--traces {args.traces}: cannot write the traces ({err.strerror or err})") from None
        print(f"traces of {len(traces)} episodes written to {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{what}: score {result['score']:.1f}, success rate {100 * result['success_rate']:.1f}% "
              f"on {result['goals']} {which} goals ({task.data_name()}), {result['seconds']:.0f} s")
        if "tokens_per_episode" in result:
            tokens = result["tokens_per_episode"]
            print(f"written actions: {100 * result['invalid_action_rate']:.1f}% invalid; per episode "
                  f"{tokens['prompt']:.0f} prompt tokens prefilled, {tokens['generated']:.1f} generated")
    return 0


def cli() -> None:
    """``python -m esjax.eval``, with one-line user errors (:func:`esjax.cli.common.run_cli`)."""
    run_cli(main)


if __name__ == "__main__":
    cli()
