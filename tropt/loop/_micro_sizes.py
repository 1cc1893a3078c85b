"""The micro-batch sizes a Setup really produces: what ``loop.accumulation`` judges unequal micro-batches on.

Training splits each batch of the train data into ``accumulation_steps`` contiguous micro-batches that differ by at
most one sample (:func:`tropt.core.batch.split_sizes`). Unequal micro-batches therefore happen only when the Setup
accumulates and one of its batches does not divide by K (a short last batch, variable-size batches). The batch sizes
are read without iterating the data: computed from a DataLoader's batch sampler, measured on a list of batches, or
derived from a Dataset's length and the Setup's ``batch_size``; None when they cannot be known without reading it all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core.batch import split_sizes

if TYPE_CHECKING:
    from ..setup import Setup


def _loader_sizes(data: torch.utils.data.DataLoader) -> list[int] | None:
    """Batch sizes of one pass over a DataLoader whose batches a plain ``BatchSampler`` draws from a sized sampler.

    The sampler, not the dataset, says how many samples a pass draws (a ``SubsetRandomSampler``, a
    ``DistributedSampler``'s shard, a ``WeightedRandomSampler``'s ``num_samples``); ``drop_last`` is the batch
    sampler's, whether given to the DataLoader or to a ``BatchSampler`` passed as ``batch_sampler``."""
    if isinstance(data.dataset, torch.utils.data.IterableDataset):
        return None
    bs = data.batch_sampler
    if type(bs) is not torch.utils.data.BatchSampler or not isinstance(bs.batch_size, int):
        return None  # a custom batch sampler (bucketing by length, ...) may give any size
    try:
        m = len(bs.sampler)  # type: ignore[arg-type]
    except TypeError:
        return None
    size = bs.batch_size
    return [size] * (m // size) + ([] if bs.drop_last or m % size == 0 else [m % size])


def train_batch_sizes(setup: Setup) -> list[int] | None:
    """The batch sizes one optimizer step's data has over one pass of the training data, when they can be known
    without guessing; else None.

    A DataLoader with a plain batch sampler (and a sized sampler) is computed, a list of batches is measured, and a
    Dataset is batched by the Setup's ``batch_size``, as :meth:`tropt.Setup.loader` does (the remainder kept). With
    ``accumulation="batches"`` a step reads K loader batches: equal loader batches give equal micro-batches (one
    step of K x the size), and otherwise each step's total is returned (a stand-in: the check then splits that
    total, not the loader's own sizes).
    """
    sizes = _loader_batch_sizes(setup)
    per = setup.loader_batches_per_step
    if sizes is None or per <= 1:
        return sizes
    if len(set(sizes)) == 1:
        return [per * sizes[0]]
    return [sum(sizes[i:i + per]) for i in range(0, len(sizes), per)]


def _loader_batch_sizes(setup: Setup) -> list[int] | None:
    """The loader's batch sizes over one pass, or None."""
    data = setup.train_data
    try:
        if isinstance(data, torch.utils.data.DataLoader):
            return _loader_sizes(data) or None
        if isinstance(data, torch.utils.data.Dataset):
            m, bs = len(data), setup.batch_size  # type: ignore[arg-type]
            return [bs] * (m // bs) + ([m % bs] if m % bs else [])
        if isinstance(data, (list, tuple)) and len(data) <= 10_000:
            return [setup.size(b) for b in data]
    except Exception:  # noqa: BLE001 - unknown layouts: assume unequal sizes can happen (keep the WARN)
        return None
    return None


def unequal_sizes(sizes: list[int], k: int) -> list[int]:
    """The batch sizes (distinct, ascending) that split into ``k`` micro-batches of unequal sizes."""
    return sorted({s for s in sizes if s >= k and s % k})


def most_unequal(sizes: list[int], k: int, limit: int) -> int | None:
    """Of the batch sizes that split unequally into ``k``, the one whose micro-batches differ the most relative to
    their size (the hardest test of a loop that divides by K), among those of at most ``limit`` samples."""
    usable = [s for s in unequal_sizes(sizes, k) if s <= limit]
    if not usable:
        return None
    return max(usable, key=lambda s: (max(split_sizes(s, k)) / min(split_sizes(s, k)), -s))
