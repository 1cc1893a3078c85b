"""Batch utilities: count samples, split one batch into micro-batches, move batches to a device.

A batch is any nesting of tensors (or numpy arrays), tuples/lists (namedtuples included) and mappings (dicts and
Mapping types such as Hugging Face's ``BatchEncoding``). Tensors are split along dimension 0; a list of plain
values (strings, numbers) whose length is the batch size is split like a tensor; anything else (scalars, None,
0-d tensors, metadata) is copied to every micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .errors import TroptError


def _is_array(x: Any) -> bool:
    return isinstance(x, (torch.Tensor, np.ndarray)) and x.ndim >= 1


def _is_plain_sequence(x: Any) -> bool:
    """A list/tuple of plain values (not containers): split like a column when its length is the batch size."""
    return (
        isinstance(x, (list, tuple))
        and not hasattr(x, "_fields")
        and len(x) > 0
        and all(isinstance(v, (str, bytes, int, float, bool)) or v is None for v in x)
    )


def _leading_sizes(batch: Any, out: list[int]) -> list[int]:
    if _is_array(batch):
        out.append(int(batch.shape[0]))
    elif isinstance(batch, Mapping):
        for v in batch.values():
            _leading_sizes(v, out)
    elif isinstance(batch, (list, tuple)) and not _is_plain_sequence(batch):
        for v in batch:
            _leading_sizes(v, out)
    return out


def batch_size(batch: Any) -> int:
    """Number of samples in a batch: the leading size shared by its tensors.

    Raises
    ------
    TroptError
        When the batch holds no tensor, or its tensors disagree on the leading size.
    """
    sizes = _leading_sizes(batch, [])
    if not sizes:
        if _is_plain_sequence(batch):
            return len(batch)
        raise TroptError(
            f"cannot tell the batch size of a {type(batch).__name__}: it holds no tensor with a batch dimension",
            "make batches tensors, or tuples/lists/dicts of tensors with the samples along dimension 0",
        )
    if len(set(sizes)) > 1:
        raise TroptError(
            f"the tensors of this batch disagree on the batch dimension (leading sizes {sorted(set(sizes))})",
            "put the samples along dimension 0 of every tensor in the batch (keep per-batch constants as "
            "Python numbers or 0-d tensors)",
        )
    return sizes[0]


def split_sizes(n: int, k: int) -> list[int]:
    """Sizes of ``k`` contiguous micro-batches of ``n`` samples; they differ by at most one (larger ones first)."""
    if k < 1:
        raise TroptError(f"cannot split a batch into {k} micro-batches", "use k >= 1")
    if k > n:
        raise TroptError(
            f"a batch of {n} samples cannot be split into {k} non-empty micro-batches",
            f"use a batch of at least {k} samples or fewer micro-batches",
        )
    base, extra = divmod(n, k)
    return [base + (i < extra) for i in range(k)]


def _rebuild(template: Any, items: Any) -> Any:
    """A container of the same type as ``template`` holding ``items``."""
    if isinstance(template, Mapping):
        for make in (lambda: type(template)(items), lambda: type(template)(**items)):
            try:
                return make()
            except Exception:  # noqa: BLE001 - Mapping types with unusual constructors fall back to dict
                continue
        return dict(items)
    if hasattr(template, "_fields"):  # namedtuple
        return type(template)(*items)
    if isinstance(template, tuple):
        return tuple(items)
    return list(items)


def _slice(x: Any, start: int, stop: int, n: int) -> Any:
    if _is_array(x):
        if x.shape[0] != n:
            return x
        return x[start:stop]
    if isinstance(x, Mapping):
        return _rebuild(x, {key: _slice(v, start, stop, n) for key, v in x.items()})
    if _is_plain_sequence(x):
        return _rebuild(x, x[start:stop]) if len(x) == n else x
    if isinstance(x, (list, tuple)):
        return _rebuild(x, [_slice(v, start, stop, n) for v in x])
    return x


def split_batch(batch: Any, k: int | None = None, *, sizes: Sequence[int] | None = None) -> list[Any]:
    """Split one batch into contiguous micro-batches of the same structure and type.

    Parameters
    ----------
    batch
        Tensor, tuple/list/namedtuple, dict or other Mapping (e.g. ``BatchEncoding``), nested.
    k
        Number of micro-batches of (nearly) equal size; uneven sizes differ by one (see :func:`split_sizes`).
    sizes
        Explicit micro-batch sizes instead of ``k`` (must be positive and sum to the batch size).

    Returns
    -------
    list
        The micro-batches; their samples concatenated in order are the original batch. Micro-batch tensors are
        views of the original (never modified).
    """
    n = batch_size(batch)
    if sizes is None:
        if k is None:
            raise TroptError("split_batch needs k or sizes", "pass k=4 or sizes=[...]")
        sizes = split_sizes(n, k)
    else:
        sizes = [int(s) for s in sizes]
        if any(s < 1 for s in sizes) or sum(sizes) != n:
            raise TroptError(
                f"micro-batch sizes {sizes} do not split a batch of {n} samples",
                f"give positive sizes that sum to {n}",
            )
    out, start = [], 0
    for size in sizes:
        out.append(_slice(batch, start, start + size, n))
        start += size
    return out


def to_device(batch: Any, device: str | torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in a (nested) batch to ``device``; other values pass through unchanged."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return _rebuild(batch, {key: to_device(v, device, non_blocking) for key, v in batch.items()})
    if isinstance(batch, (list, tuple)) and not _is_plain_sequence(batch):
        return _rebuild(batch, [to_device(v, device, non_blocking) for v in batch])
    return batch
