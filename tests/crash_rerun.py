"""A pytest-xdist ``loadscope`` scheduler that survives a worker crash: the crashed test runs once more in a fresh
worker, the rest of its module goes on, and nothing hangs.

xdist's own ``loadscope`` puts a crashed worker's whole module back in the queue, the crashed test included, and
after a second crash the run hangs with idle workers (reproduced with ``os.abort()`` in a test, xdist 3.8.0; stop
48's CI ended that way). Here a test that crashed its worker is run once more in a new worker (the native crashes
seen in this suite — aborts inside XLA in workers that had loaded torch — did not recur when their tests were run
again alone); if it crashes again it fails, as xdist reports a crash. Every rerun is named in the terminal summary:
nothing is hidden.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

#: node ids whose worker crashed once, in order (printed in the terminal summary)
CRASHED_ONCE: list[str] = []


class CrashRerunLoadScope(LoadScopeScheduling):
    """``loadscope`` with crash handling: see the module docstring."""

    def remove_node(self, node: Any) -> str | None:
        """Called when a worker shuts down or dies; returns the test it died in (reported as failed), or None."""
        workload = self.assigned_work.pop(node)
        pending = [(unit, nodeid) for unit in workload.values() for nodeid, done in unit.items() if not done]
        if not pending:
            return None
        unit, crashed = pending[0]  # a worker runs its tests in the order sent: the first not done was running
        failed = crashed in CRASHED_ONCE
        if failed:
            unit[crashed] = True  # reported as a crash by xdist, not run a third time
        else:
            CRASHED_ONCE.append(crashed)
        self.workqueue.update({scope: tests for scope, tests in workload.items() if not all(tests.values())})
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed if failed else None


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """``--dist loadscope`` runs with :class:`CrashRerunLoadScope` (a hook: tests/conftest.py imports it)."""
    return CrashRerunLoadScope(config, log) if config.getvalue("dist") == "loadscope" else None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name every test that crashed its worker (a hook: tests/conftest.py imports it)."""
    if CRASHED_ONCE:
        terminalreporter.write_sep("=", "tests that crashed their worker and ran again in a new one")
        for nodeid in CRASHED_ONCE:
            terminalreporter.write_line(nodeid)
