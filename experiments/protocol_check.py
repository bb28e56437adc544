"""Check that the staleness study's protocol was committed before any of its run records (issue 32).

Git history is the proof of pre-registration: every file under ``experiments/results/study/`` must have entered
the repository in a commit that strictly descends from the first commit of ``experiments/protocol.md``.

    python -m experiments.protocol_check        # prints each problem; exit status 1 if there is one
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = "experiments/protocol.md"
RECORDS = "experiments/results/study"


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def first_commits(repo: Path, path: str) -> dict[str, str]:
    """``file -> commit`` that first added it, for every file ever added under ``path`` (following history)."""
    out = _git(repo, "log", "--diff-filter=A", "--format=commit %H", "--name-only", "--", path)
    if out.returncode:
        raise RuntimeError(f"git log failed in {repo}: {out.stderr.strip()}")
    added: dict[str, str] = {}
    commit = None
    for line in out.stdout.splitlines():
        if line.startswith("commit "):
            commit = line.split()[1]
        elif line.strip():
            added[line.strip()] = commit  # log runs newest first: the last assignment is the first add
    return added


def problems(repo: Path = REPO) -> list[str]:
    """Every record that does not come after the protocol (empty: the pre-registration holds)."""
    protocol = first_commits(repo, PROTOCOL).get(PROTOCOL)
    records = first_commits(repo, RECORDS)
    if protocol is None:
        return [f"{PROTOCOL} is not committed"] + [f"{f}: committed with no protocol" for f in sorted(records)]
    found = []
    for path, commit in sorted(records.items()):
        after = commit != protocol and _git(repo, "merge-base", "--is-ancestor", protocol, commit).returncode == 0
        if not after:
            found.append(f"{path}: first committed in {commit[:10]}, not after the protocol ({protocol[:10]})")
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    print("protocol precedes every study record" if not found else f"{len(found)} record(s) break the protocol")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
