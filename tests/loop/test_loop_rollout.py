"""Rollout call planning (rows split into calls of bucket sizes, so only the last call of a group pads rows) and
action sampling (the same index as numpy's ``Generator.choice``, which every committed run used)."""

from __future__ import annotations

import numpy as np
import pytest

from esjax.loop.rollout import MAX_CALL_ROWS, ROLLOUT_BUCKETS, call_sizes, sample_index

ROWS = ROLLOUT_BUCKETS.rows


@pytest.mark.parametrize("n, expected", [(1, [1]), (8, [8]), (111, [64, 32, 8, 7]), (67, [64, 3]),
                                         (128, [128]), (300, [128, 128, 32, 8, 4])])
def test_call_sizes_use_whole_buckets_first(n, expected):
    assert call_sizes(n, ROWS, most=128) == expected
    assert max(call_sizes(n, ROWS)) <= MAX_CALL_ROWS  # the default cap bounds a call's activation memory


def test_call_sizes_cover_every_row_and_pad_at_most_one_small_call():
    for n in range(1, 400):
        sizes = call_sizes(n, ROWS)
        assert sum(sizes) == n and max(sizes) <= MAX_CALL_ROWS
        assert sum(1 for s in sizes if s not in ROWS) <= 1 and all(s in ROWS for s in sizes[:-1])


def test_sample_index_is_generator_choice():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(2, 60))
        scores = (rng.normal(size=n) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32)
        scores[rng.integers(n)] = scores.max()  # ties
        probs = np.exp((scores - scores.max()) / np.float32(rng.choice([0.3, 1.0, 2.0])))
        probs /= probs.sum()
        seed = int(rng.integers(0, 2**63))
        assert sample_index(probs, seed) == int(np.random.default_rng(seed).choice(n, p=probs))
