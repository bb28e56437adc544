"""``python -m esjax.eval``: evaluate a run or an export on held-out goals (entry point: :mod:`esjax.cli.eval`)."""

from esjax.cli.eval import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    cli()
