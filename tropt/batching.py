"""The public batch helpers (``tropt.split_batch``, ``tropt.batch_size``, ``tropt.to_device``); they live in
:mod:`tropt.core.batch`, the one definition of a batch."""

from .core.batch import BatchLayout, batch_size, split_batch, split_sizes, to_device

__all__ = ["BatchLayout", "batch_size", "split_batch", "split_sizes", "to_device"]
