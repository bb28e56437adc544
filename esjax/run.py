"""``python -m esjax.run``: train a policy (the entry point is :mod:`esjax.cli.run`)."""

from esjax.cli.run import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    cli()
