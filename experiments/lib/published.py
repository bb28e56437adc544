"""The published numbers of the asynchronous-ES study our staleness grid restates (arXiv 2610.04196), and the side
table both staleness reports print, labelled as theirs."""

from __future__ import annotations

#: Held-out success % on its public benchmark, Qwen2.5-7B-Instruct, full-parameter ES, N = 30, 120 updates: a side
#: table only, not comparable to ours.
PUBLISHED = {"base": 9.3, "sync": 25.4, "async": 25.9, "delay4": 23.8, "delay8": 22.3, "grpo": 29.0}
PUBLISHED_LABEL = ("arXiv 2610.04196, held-out success on its public benchmark, Qwen2.5-7B-Instruct "
                   "full-parameter ES — not comparable to ours")
PUBLISHED_STALE_SHARE = 0.095  # natural async, G = 4 workers for N = 30
PUBLISHED_POPULATION = 30  # N of every published run (3 of 30 delayed in delay-4 / delay-8)


def published_table() -> list[str]:
    """The published numbers as a markdown side table, each row beside our cell of the same definition."""
    sync = PUBLISHED["sync"]
    rows = [("base policy (no training)", PUBLISHED["base"], "version 0 of every run"),
            ("sync ES", sync, "sync"),
            (f"natural async (G = 4 workers, N = 30; ≈ {PUBLISHED_STALE_SHARE:.1%} of results 1 update stale)",
             PUBLISHED["async"], "async-G4 (G < N, the paper's regime); async-K1 is the saturated G = N variant"),
            ("delay-4 (27 fresh + 3 delayed by exactly 4)", PUBLISHED["delay4"], "delay4"),
            ("delay-8 (27 fresh + 3 delayed by exactly 8)", PUBLISHED["delay8"], "delay8"),
            ("GRPO", PUBLISHED["grpo"], "—")]
    lines = [f"**{PUBLISHED_LABEL}.** Success % is the share of solved tasks, not our score; N = 30, 120 updates. "
             "Shown for the direction and rough size of the published effects only.", "",
             "| published setting | held-out success % | Δ vs sync (points of success) | our cell of the same "
             "definition |", "|---|---|---|---|"]
    for label, value, ours in rows:
        delta = "—" if label.startswith(("base", "sync")) else f"{value - sync:+.1f}"
        lines.append(f"| {label} | {value} | {delta} | {ours} |")
    lines.append("| all fitness values stale (abstract) | not given | — | all-stale-k1 |")
    return lines
