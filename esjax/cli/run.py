"""``python -m esjax.run --config FILE``: train a policy with (asynchronous) ES and write a run directory."""

from __future__ import annotations

import argparse

from esjax.cli.common import run_cli
from esjax.config import load_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m esjax.run", description=__doc__)
    parser.add_argument("--config", help="YAML config (see configs/); defaults when omitted")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override one config key, e.g. --set run.seed=1 (repeatable; with es.scale=nes change "
                             "es.sigma together with es.learning_rate: σ also divides the step)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its latest checkpoint (a finished run with --set "
                             "run.updates=N: go on to N updates)")
    parser.add_argument("--run-dir", metavar="DIR", help="write the run here (default: runs/<name>-<time>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.resume:
        from esjax.rundir.directory import resume_config

        config = resume_config(args.resume, args.overrides)
    else:
        config = load_config(args.config, args.overrides)
    from esjax.train.session import train  # imported late: config errors are reported before JAX starts

    train(config, run_dir=args.resume or args.run_dir, resume=bool(args.resume), overrides=args.overrides)
    return 0


def cli() -> None:
    """The ``esjax-run`` console script: the same one-line errors and exit codes as ``python -m esjax.run``."""
    run_cli(main)


if __name__ == "__main__":
    cli()
