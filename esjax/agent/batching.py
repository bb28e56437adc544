"""Host-side batching for the policy primitives: padding token lists into bucketed arrays."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from esjax.model.perturb import Perturbation


def check_ids(seqs: Sequence[Sequence[int]], vocab_size: int, what: str, allow_empty: bool = False) -> None:
    """Every id in ``[0, vocab_size)`` (and no empty sequence unless allowed); names the first bad entry.

    Vectorized: one numpy pass over all ids (this runs on every policy call of the rollout loop).
    """
    lengths = np.fromiter((len(seq) for seq in seqs), np.int64, len(seqs))
    if not allow_empty and (lengths == 0).any():
        raise ValueError(f"{what}[{int(np.argmax(lengths == 0))}] is empty")
    if not lengths.sum():
        return
    ids = np.fromiter(itertools.chain.from_iterable(seqs), np.int64, int(lengths.sum()))  # C-level iteration
    bad = (ids < 0) | (ids >= vocab_size)
    if bad.any():
        pos = int(np.argmax(bad))
        row = int(np.searchsorted(np.cumsum(lengths), pos, side="right"))
        raise ValueError(f"{what}[{row}] has token id {ids[pos]} outside the vocabulary [0, {vocab_size})")


def left_pad(seqs: Sequence[Sequence[int]], rows: int, length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``[rows, length]`` tokens and mask with each sequence right-aligned (extra rows fully masked)."""
    tokens = np.full((rows, length), pad_id, np.int32)
    mask = np.zeros((rows, length), bool)
    for i, seq in enumerate(seqs):
        n = len(seq)
        if n:
            tokens[i, length - n:] = seq
            mask[i, length - n:] = True
    return tokens, mask


def right_pad(seqs: Sequence[Sequence[int]], rows: int, length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``[rows, length]`` tokens and mask with each sequence left-aligned."""
    tokens = np.full((rows, length), pad_id, np.int32)
    mask = np.zeros((rows, length), bool)
    for i, seq in enumerate(seqs):
        n = len(seq)
        tokens[i, :n] = seq
        mask[i, :n] = True
    return tokens, mask


def pad_perturbation(perturbation: Perturbation | None, rows: int, padded_rows: int) -> Perturbation | None:
    """Check ``perturbation`` covers ``rows`` rows and append inactive rows up to ``padded_rows``."""
    if perturbation is None:
        return None
    if perturbation.rows != rows:
        raise ValueError(f"perturbation has {perturbation.rows} rows, the batch has {rows}")
    return perturbation.pad_rows(padded_rows)
