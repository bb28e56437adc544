"""Test-session settings shared by every test (and inherited by the subprocesses tests start)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# A persistent XLA compilation cache: the suite compiles the same small programs in many processes
# (subprocess CLI runs, simulated-device meshes); reusing them cuts the suite's wall time severalfold.
_CACHE = Path(os.environ.get("ESJAX_TEST_XLA_CACHE", Path(tempfile.gettempdir()) / "esjax-test-xla-cache"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
