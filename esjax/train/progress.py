"""Live progress of a run (rich): the phase (what the loop waits for now), version / total, last fitness,
accepted, discarded, stale fraction, last eval, ETA.

On a terminal it is a live bar refreshed every tick; elsewhere (CI, logs) it prints one plain line per evaluation
and every tenth update, and the phase at most every ``HEARTBEAT_S`` seconds while no update comes, so logs stay
short but a long first update is never silent.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

#: seconds between plain-text phase lines while no update or evaluation is printed
HEARTBEAT_S = 30.0


class Progress:
    def __init__(self, total: int, enabled: bool = True):
        self.total = total
        self.enabled = enabled
        self.console = Console(file=sys.stdout)
        self.live = enabled and self.console.is_terminal
        self.last_eval: dict[str, Any] | None = None
        self.last_fitness: float | None = None
        self.phase_text = "starting"
        self._stats = ""  # the last update's line (fitness, accepted, ...), shown after the phase
        self.start = time.perf_counter()
        self._last_line = self.start
        self._bar: RichProgress | None = None
        self._task = None

    def __enter__(self) -> Progress:
        if self.live:
            self._bar = RichProgress(TextColumn("[bold]ES"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                     console=self.console)
            self._bar.__enter__()
            self._task = self._bar.add_task("train", total=self.total, info=self.phase_text)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def _info(self, totals: dict[str, Any]) -> str:
        accepted = totals.get("accepted", 0)
        stale = totals.get("stale_fraction", 0.0)
        evaluation = f"{self.last_eval['score']:.1f}" if self.last_eval else "-"
        fitness = f"{self.last_fitness:.3f}" if self.last_fitness is not None else "-"
        return (f"fitness {fitness} · accepted {accepted} · discarded {totals.get('discarded', 0)} · "
                f"stale {stale:.2f} · eval {evaluation}")

    def _line(self) -> str:
        return f"{self.phase_text} · {self._stats}" if self._stats else self.phase_text

    def phase(self, text: str) -> None:
        """What the run is doing now (e.g. ``update 3: 9/16 members in · eval v0 120/200``)."""
        self.phase_text = text
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._bar is not None:
            self._bar.update(self._task, info=self._line())
        elif now - self._last_line >= HEARTBEAT_S:
            print(f"{text} · {now - self.start:.0f}s elapsed", flush=True)
            self._last_line = now

    def update(self, version: int, record: dict[str, Any], totals: dict[str, Any]) -> None:
        self.last_fitness = record.get("fitness_mean")
        if not self.enabled:
            return
        self._stats = self._info(totals)
        if self._bar is not None:
            self._bar.update(self._task, completed=version, info=self._line())
        elif version % 10 == 0 or version == self.total:
            self._last_line = time.perf_counter()
            elapsed = time.perf_counter() - self.start
            eta = elapsed / max(version, 1) * (self.total - version)
            print(f"update {version}/{self.total} · {self._stats} · {elapsed:.0f}s elapsed, ETA {eta:.0f}s",
                  flush=True)

    def eval(self, record: dict[str, Any]) -> None:
        self.last_eval = record
        if self.enabled and self._bar is None:
            self._last_line = time.perf_counter()
            print(f"eval @ version {record['version']}: score {record['score']:.1f}, "
                  f"success {100 * record['success_rate']:.1f}% on {record['goals']} goals", flush=True)

    def final(self, summary: str, records: list[dict[str, Any]]) -> None:
        """The before/after evaluation table (always printed: it is the job's result)."""
        evals = [r for r in records if r.get("kind") == "eval"]
        table = Table(title="held-out evaluation (unperturbed θ, greedy)")
        for column in ("", "version", "score", "success rate", "goals"):
            table.add_column(column)
        if evals:
            for label, r in (("before", evals[0]), ("after", evals[-1])):
                table.add_row(label, str(r["version"]), f"{r['score']:.1f}", f"{100 * r['success_rate']:.1f}%",
                              str(r["goals"]))
        self.console.print(table)
        if len(evals) >= 2:
            self.console.print(f"Δ score: {evals[-1]['score'] - evals[0]['score']:+.1f}")
