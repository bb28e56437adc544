"""Generate RELIABILITY.md from the committed reliability rows (and the soak run's report).

``python -m tests.reliability_table`` rewrites RELIABILITY.md; ``--check`` exits 1 when it is out of date;
``--accept`` first copies the rows the last test run observed (``tmp/reliability_rows/*.json``, see
``tests/reliability.py``) over the committed ones (``tests/reliability_rows/*.json``). The soak figures come
from ``benchmarks/soak_result.json`` (written by ``benchmarks/soak.py --out``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = REPO / "tests" / "reliability_rows"
OBSERVED = REPO / "tmp" / "reliability_rows"
SOAK = REPO / "benchmarks" / "soak_result.json"
OUT = REPO / "RELIABILITY.md"
AREAS = ["env", "numerical", "storage", "multi-host", "bad input"]

HEADER = """# Reliability

Every fault below is injected by a test, which asserts the outcome and only then checks the row it observed
against the one committed in `tests/reliability_rows/` (see `tests/reliability.py`); this file is generated
from those rows by `python -m tests.reliability_table` (and checked by `tests/test_reliability_table.py`) — do
not edit it by hand. "Accepted lost" compares the accepted fitness history (per-update cohorts, fitness
statistics, counters, θ) before and after the fault.
"""


def row_text(row: dict) -> str:
    """A row's file content (stable key order)."""
    return json.dumps(row, indent=1, sort_keys=True) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def rows() -> list[dict]:
    out = [json.loads(p.read_text()) for p in sorted(ROWS.glob("*.json"))]
    return sorted(out, key=lambda r: (AREAS.index(r["area"]) if r["area"] in AREAS else len(AREAS), r["id"]))


def _cpu_share_note(report: dict) -> str:
    shares = [x["cpu_share"] for x in report["samples"] if "cpu_share" in x]
    if not shares:
        return "CPU share not recorded"
    idle = min(shares) >= 0.9
    return (f"the soak process got {min(shares):.0%}–{max(shares):.0%} of one core per interval"
            + (" (it had a core to itself)" if idle else " (shared with other jobs)"))


def soak_section() -> str:
    if not SOAK.is_file():
        return "## Soak\n\nNo soak report yet: run `python benchmarks/soak.py --out benchmarks/soak_result.json`.\n"
    r = json.loads(SOAK.read_text())
    m = r["machine"]
    lines = [
        "## Soak",
        "",
        f"`benchmarks/soak.py --minutes {r['minutes']:g} --sessions {r['sessions']}` (in-process EnvPool, synthetic "
        f"catalog of {r['products']} products, oracle + 30% random clicks + 5% junk actions; samples every "
        f"{r['interval_s']:g} s).",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, load average at the end {m['loadavg_end']}, Python "
        f"{m['python']}; {_cpu_share_note(r)}",
        f"- {r['steps']:,} env steps, {r['episodes']:,} episodes",
        f"- throughput: median {r['median_steps_per_s']:,.0f} steps/s; the worst interval is "
        f"{r['max_deviation_from_median']:.1%} from the median — "
        f"{'within' if r['throughput_ok'] else 'OUTSIDE'} the ±20% target",
        f"- throughput per CPU second of the soak process: median {r['median_steps_per_cpu_s']:,.0f} steps/cpu-s; "
        f"the worst interval is {r['max_cpu_deviation_from_median']:.1%} from the median — "
        f"{'within' if r['throughput_cpu_ok'] else 'OUTSIDE'} the ±20% target",
        f"- resident memory: {r['rss_start_mb']:.1f} MiB at the first sample, {r['rss_end_mb']:.1f} MiB at the end; "
        f"growth over the last 5 minutes {r['rss_growth_last_5min']:+.2%} — "
        f"{'under' if r['memory_ok'] else 'OVER'} the 5% target",
    ]
    if not (r["throughput_ok"] and r.get("throughput_cpu_ok", True)):
        lines.append("- **throughput target not met**: " + _cpu_share_note(r)
                     + "; on a shared machine the wall-clock rate follows that share")
    lines += [
        "",
        "| t (s) | steps/s | steps/cpu-s | CPU share | RSS (MiB) | episodes |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {s['t']:.0f} | {s['steps_per_s']:,.0f} | {s['steps_per_cpu_s']:,.0f} | {s['cpu_share']:.0%} | "
              f"{s['rss_mb']:.1f} | {s['episodes']:,} |" for s in r["samples"]]
    return "\n".join(lines) + "\n"


MUTATION = """## Can the suite fail? (mutation run)

The faults above check what the trainer does when the world misbehaves; the mutation run checks that the tests
themselves can fail where it matters. `python -m tests.mutants` applies each of a list of deliberate, realistic
bugs (a stale member rolled out with the newest θ, pairing by position instead of by seed, Adam's settings ignored,
a purchase scored below its drawn price, antithetic signs, the lag bound off by one, shaping order, checkpoint
content, …) alone to a scratch copy of the repository, runs the few tests named for it there and reports the
mutants that survive; every one must be killed. The list is `tests/mutants.py`, the last run's table (which test
killed which mutant, and the run's wall time) is [`tests/mutants.md`](tests/mutants.md).

"""


NOT_COVERED = """## Scope and limits

- **Resume** is checked from *every* checkpoint of async, controlled and all-stale runs
  (`tests/train/test_trainer_resume.py`: final θ bit for bit, `metrics.jsonl` record for record, one record per
  (kind, version)), so it does not depend on where a kill lands; the SIGKILL tests add real kills, at a
  checkpoint and inside a save. A resume re-runs the ticks after its checkpoint: work done after the last
  checkpoint is recomputed, not lost.
- **Multi-host** is exercised at the level the trainer would use it: two `jax.distributed` CPU processes
  exchanging results every tick through `esjax.parallel.multihost`. The trainer itself refuses
  `mesh.distributed=true` for now (single host), so there is no 2-process *trainer* run to kill yet; a
  resumed trainer run would restart from its last checkpoint like any crash (see the storage rows).
- **Env timeouts** abandon the hung step's helper thread (Python cannot interrupt it) and give its session a
  fresh env; a step that never returns keeps one idle thread alive until the process exits.
- **Process-pool replay** is exact when the envs are seeded (`seed=`); an unseeded env's `<r>` query may
  draw differently on replay.
- **Soak** throughput is also reported per CPU second: on a shared machine the wall-clock rate follows the
  other jobs' load, the CPU-time rate shows whether the pool itself slows.
"""


def render() -> str:
    table = ["| area | fault | injected how | expected | observed | accepted lost? | test |",
             "|---|---|---|---|---|---|---|"]
    for r in rows():
        table.append("| " + " | ".join(_cell(r[k]) for k in ("area", "fault", "injection", "expected", "observed",
                                                              "accepted_lost")) + f" | `{r['test']}` |")
    return "\n".join([HEADER, "## Faults", "", *table, "", soak_section(), MUTATION + NOT_COVERED])


def accept() -> list[str]:
    """Copy the observed rows over the committed ones; returns the ids that changed."""
    changed = []
    for path in sorted(OBSERVED.glob("*.json")):
        target = ROWS / path.name
        if not target.is_file() or target.read_text() != path.read_text():
            ROWS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            changed.append(path.stem)
    return changed


def main(argv: list[str]) -> int:
    if "--accept" in argv:
        changed = accept()
        print(f"accepted {len(changed)} changed row(s) from {OBSERVED}: {', '.join(changed) or 'none'}")
    text = render()
    if "--check" in argv:
        current = OUT.read_text() if OUT.is_file() else ""
        if current != text:
            print("RELIABILITY.md is out of date: run python -m tests.reliability_table", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(rows())} fault rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
