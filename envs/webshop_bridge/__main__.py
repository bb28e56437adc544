"""``python -m envs.webshop_bridge``: the interactive terminal session (see cli.py)."""

import sys

from .cli import main

sys.exit(main())
