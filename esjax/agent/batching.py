"""Host-side batching for the policy primitives: padding token lists into bucketed arrays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from esjax.model.perturb import Perturbation


def check_ids(seqs: Sequence[Sequence[int]], vocab_size: int, what: str, allow_empty: bool = False) -> None:
    for i, seq in enumerate(seqs):
        if not allow_empty and len(seq) == 0:
            raise ValueError(f"{what}[{i}] is empty")
        for t in seq:
            if not 0 <= int(t) < vocab_size:
                raise ValueError(f"{what}[{i}] has token id {t} outside the vocabulary [0, {vocab_size})")


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
