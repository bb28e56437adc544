"""The machine a measurement ran on: every run's ``run.json`` records it (:mod:`esjax.rundir.directory`), which is
why it lives in esjax; benchmarks and experiments record the same fields beside their numbers."""

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


def machine_info() -> dict:
    """CPU model, core count, Python version and load average, as JSON-ready fields a timing is read with."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(), "loadavg": load}
