"""Shape buckets: pad rows and lengths to a few fixed sizes so a long run compiles a bounded set of programs.

Every jitted policy call is keyed by its padded shapes; without buckets each new prompt length would
compile a new program. Default: powers of two (from a minimum); or an explicit, sorted list of sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def bucket(n: int, sizes: Sequence[int] | None = None, minimum: int = 1, multiple: int = 1, what: str = "size") -> int:
    """Smallest bucket ``>= n`` (a power of two ``>= minimum`` if ``sizes`` is None), rounded up to ``multiple``."""
    if sizes:
        fitting = [s for s in sorted(sizes) if s >= n]
        if not fitting:
            raise ValueError(f"{what} {n} exceeds the largest configured bucket {max(sizes)}")
        size = fitting[0]
    else:
        size = max(next_power_of_two(n), minimum)
    return -(-size // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Bucket policy for rows (batch size), sequence lengths and candidate counts."""

    rows: tuple[int, ...] | None = None
    lengths: tuple[int, ...] | None = None
    candidates: tuple[int, ...] | None = None
    min_rows: int = 1
    min_length: int = 8
    min_candidates: int = 1

    def row(self, n: int, multiple: int = 1) -> int:
        return bucket(n, self.rows, self.min_rows, multiple, "row count")

    def length(self, n: int) -> int:
        return bucket(n, self.lengths, self.min_length, 1, "sequence length")

    def candidate(self, n: int) -> int:
        return bucket(n, self.candidates, self.min_candidates, 1, "candidate count")


DEFAULT_BUCKETS = Buckets()
