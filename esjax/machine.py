"""The machine a measurement ran on: benchmarks and experiments record it beside their numbers."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> str:
    """One line: CPU model, core count, Python and load average (what a timing needs to be read)."""
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average {load}"
