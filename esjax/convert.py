"""``python -m esjax.convert``: a GGUF checkpoint as an HF folder (the entry point is :mod:`esjax.cli.convert`)."""

from esjax.cli.convert import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    cli()
