"""``python -m esjax.export``: export a run's weights (the entry point is :mod:`esjax.cli.export`)."""

from esjax.cli.export import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    cli()
