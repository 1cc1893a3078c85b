"""The batch tree, defined once: count samples, split one batch into micro-batches, walk its tensors, move it.

A batch is any nesting of tensors (or numpy arrays), tuples/lists (namedtuples included) and mappings (dicts and
Mapping types such as Hugging Face's ``BatchEncoding``). Tensors are split along the batch dimension (0 unless a
:class:`BatchLayout` says otherwise); a list of plain values (strings, numbers) whose length is the batch size is
split like a tensor; anything else (scalars, None, 0-d tensors, metadata) is copied to every micro-batch.

With ``batch_dim=d > 0`` (time-major ``(seq, batch)`` language-model batches), a tensor with at most ``d``
dimensions whose leading size is the product of the other tensors' first ``d + 1`` sizes is a flattened target
(``target.view(-1)`` of a ``(seq, batch)`` tensor): it is split as that shape; one whose leading size is the batch
size holds one value per sample (sequence lengths) and is split along it. Layouts tropt cannot infer take a
``split_fn(batch, sizes)`` and ``size_fn(batch)`` pair.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import TroptError


def _is_array(x: Any) -> bool:
    return isinstance(x, (torch.Tensor, np.ndarray)) and x.ndim >= 1


def is_plain_sequence(x: Any) -> bool:
    """A list/tuple of plain values (not containers): split like a column when its length is the batch size."""
    return (
        isinstance(x, (list, tuple))
        and not hasattr(x, "_fields")
        and len(x) > 0
        and all(isinstance(v, (str, bytes, int, float, bool)) or v is None for v in x)
    )


def _arrays(batch: Any, out: list) -> list:
    """Every array (ndim >= 1) in a nested batch, in order."""
    if _is_array(batch):
        out.append(batch)
    elif isinstance(batch, Mapping):
        for v in batch.values():
            _arrays(v, out)
    elif isinstance(batch, (list, tuple)) and not is_plain_sequence(batch):
        for v in batch:
            _arrays(v, out)
    return out


_LAYOUT_FIX = ("if the samples are along another dimension (time-major (seq, batch) tensors), pass "
               "Setup(batch_dim=1); for layouts tropt cannot infer pass Setup(split_fn=..., size_fn=...) "
               "(split_fn(batch, sizes) -> list of micro-batches, size_fn(batch) -> number of samples)")


def _time_major_hint(arrays: list) -> str:
    """' (looks time-major: ...)' when a 2-D+ tensor's first two sizes multiply to another tensor's length."""
    for a in arrays:
        if a.ndim >= 2 and any(b.ndim == 1 and b.shape[0] == a.shape[0] * a.shape[1] for b in arrays):
            return (f"; a ({a.shape[0]}, {a.shape[1]}) tensor beside a flattened one of "
                    f"{a.shape[0] * a.shape[1]} looks "
                    f"time-major (seq, batch): pass Setup(batch_dim=1)")
    return ""


def _reference_lead(arrays: list, dim: int) -> tuple[int, ...] | None:
    """The first ``dim + 1`` sizes of the first array that has a dimension ``dim`` (the batch's leading shape)."""
    for a in arrays:
        if a.ndim > dim:
            return tuple(int(s) for s in a.shape[: dim + 1])
    return None


def _is_flat(a: Any, lead: tuple[int, ...] | None, dim: int) -> bool:
    """A tensor with no dimension ``dim`` whose leading size is the product of ``lead``: a flattened target."""
    return lead is not None and a.ndim <= dim and int(a.shape[0]) == int(np.prod(lead))


def _is_per_sample(a: Any, lead: tuple[int, ...] | None) -> bool:
    """A tensor without the batch dimension whose first size is the batch size: one value per sample (lengths)."""
    return lead is not None and int(a.shape[0]) == lead[-1]


def batch_size(batch: Any, *, batch_dim: int = 0) -> int:
    """Number of samples in a batch: the size shared by its tensors along ``batch_dim``.

    Raises
    ------
    TroptError
        When the batch holds no tensor, or its tensors disagree on the batch size (the message says which
        ``Setup`` option fits the layout).
    """
    arrays = _arrays(batch, [])
    lead = _reference_lead(arrays, batch_dim) if batch_dim else None
    sizes, odd = [], []
    for a in arrays:
        if a.ndim > batch_dim:
            sizes.append(int(a.shape[batch_dim]))
        elif not (_is_flat(a, lead, batch_dim) or _is_per_sample(a, lead)):
            odd.append(tuple(a.shape))
    if not sizes:
        if is_plain_sequence(batch):
            return len(batch)
        raise TroptError(
            f"cannot tell the batch size of a {type(batch).__name__}: it holds no tensor with a batch dimension"
            + (f" {batch_dim}" if batch_dim else ""),
            f"make batches tensors, or tuples/lists/dicts of tensors with the samples along dimension {batch_dim}; "
            "for other layouts pass Setup(split_fn=..., size_fn=...)",
        )
    if odd:
        raise TroptError(
            f"with batch_dim={batch_dim} this batch holds tensors of shape {odd[:3]} that have no dimension "
            f"{batch_dim} "
            f"and are not flattened ({' x '.join(map(str, lead or ()))}) targets, "
            "so tropt cannot tell how to split them",
            "pass Setup(split_fn=..., size_fn=...) for this layout (split_fn(batch, sizes) -> list of micro-batches, "
            "size_fn(batch) -> number of samples)",
        )
    if len(set(sizes)) > 1:
        which = "leading sizes" if batch_dim == 0 else f"sizes along dimension {batch_dim}"
        raise TroptError(
            f"the tensors of this batch disagree on the batch dimension ({which} {sorted(set(sizes))})"
            + (_time_major_hint(arrays) if batch_dim == 0 else ""),
            "put the samples along one dimension of every tensor in the batch (keep per-batch constants as "
            f"Python numbers or 0-d tensors); {_LAYOUT_FIX}",
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


def rebuild(template: Any, items: Any) -> Any:
    """A container of the same type as ``template`` holding ``items``."""
    if isinstance(template, Mapping):
        cls: Any = type(template)  # a Mapping type; its constructor's signature is its own
        for make in (lambda: cls(items), lambda: cls(**items)):
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


def _slice(x: Any, start: int, stop: int, n: int, dim: int = 0, lead: tuple[int, ...] | None = None) -> Any:
    if _is_array(x):
        if x.ndim > dim:
            if x.shape[dim] != n:
                return x
            return x[(slice(None),) * dim + (slice(start, stop),)]
        if _is_flat(x, lead, dim):  # a flattened (seq, batch) target: slice it as that shape, flatten again
            shaped = x.reshape(*(lead or ()), *x.shape[1:])
            part = shaped[(slice(None),) * dim + (slice(start, stop),)]
            return part.reshape(-1, *x.shape[1:])
        if _is_per_sample(x, lead):  # one value per sample (e.g. sequence lengths beside time-major data)
            return x[start:stop]
        return x
    if isinstance(x, Mapping):
        return rebuild(x, {key: _slice(v, start, stop, n, dim, lead) for key, v in x.items()})
    if is_plain_sequence(x):
        return rebuild(x, x[start:stop]) if len(x) == n else x
    if isinstance(x, (list, tuple)):
        return rebuild(x, [_slice(v, start, stop, n, dim, lead) for v in x])
    return x


def split_batch(batch: Any, k: int | None = None, *, sizes: Sequence[int] | None = None,
                layout: BatchLayout | None = None) -> list[Any]:
    """Split one batch into contiguous micro-batches of the same structure and type.

    Parameters
    ----------
    batch
        Tensor, tuple/list/namedtuple, dict or other Mapping (e.g. ``BatchEncoding``), nested.
    k
        Number of micro-batches of (nearly) equal size; uneven sizes differ by one (see :func:`split_sizes`).
    sizes
        Explicit micro-batch sizes instead of ``k`` (must be positive and sum to the batch size).
    layout
        Where the samples are (:class:`BatchLayout`); dimension 0 when None.

    Returns
    -------
    list
        The micro-batches; their samples concatenated in order are the original batch. Micro-batch tensors are
        views of the original (never modified).
    """
    if layout is not None and layout.split_fn is not None:
        return layout.split(batch, k, sizes=sizes)
    dim = layout.batch_dim if layout is not None else 0
    n = batch_size(batch, batch_dim=dim)
    lead = _reference_lead(_arrays(batch, []), dim) if dim else None
    if sizes is None:
        if k is None:
            raise TroptError("split_batch needs k or sizes", "pass k=4 or sizes=[...]")
        joined = remembered_sizes(batch)  # K loader batches joined into one step: give back the loader's batches
        if joined is not None and len(joined) == k and (parts := remembered_parts(batch)) is not None:
            return parts
        sizes = list(joined) if joined is not None and len(joined) == k else split_sizes(n, k)
    else:
        sizes = [int(s) for s in sizes]
        if any(s < 1 for s in sizes) or sum(sizes) != n:
            raise TroptError(
                f"micro-batch sizes {sizes} do not split a batch of {n} samples",
                f"give positive sizes that sum to {n}",
            )
    out, start = [], 0
    for size in sizes:
        out.append(_slice(batch, start, start + size, n, dim, lead))
        start += size
    return out


def _check_sizes(sizes: Sequence[int] | None, k: int | None, n: int) -> list[int]:
    if sizes is None:
        if k is None:
            raise TroptError("split_batch needs k or sizes", "pass k=4 or sizes=[...]")
        return split_sizes(n, k)
    sizes = [int(s) for s in sizes]
    if any(s < 1 for s in sizes) or sum(sizes) != n:
        raise TroptError(f"micro-batch sizes {sizes} do not split a batch of {n} samples",
                         f"give positive sizes that sum to {n}")
    return sizes


@dataclass(frozen=True)
class BatchLayout:
    """Where a batch keeps its samples: along ``batch_dim``, or as the user's ``split_fn``/``size_fn`` say.

    ``split_fn(batch, sizes) -> list of micro-batches`` (sample counts ``sizes``, in order) and
    ``size_fn(batch) -> int`` are for layouts tropt cannot infer; they come together.
    """

    batch_dim: int = 0
    split_fn: Callable[[Any, list[int]], list] | None = None
    size_fn: Callable[[Any], int] | None = None

    def size(self, batch: Any) -> int:
        """The number of samples in ``batch``."""
        if self.size_fn is None:
            return batch_size(batch, batch_dim=self.batch_dim)
        try:
            n = self.size_fn(batch)
        except TroptError:
            raise
        except Exception as exc:
            raise TroptError(f"size_fn raised {type(exc).__name__}: {exc}",
                             "fix size_fn; tropt calls it as size_fn(batch)") from exc
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise TroptError(f"size_fn returned {n!r}, expected a number of samples (int >= 0)",
                             "return the batch's sample count")
        return int(n)

    def split(self, batch: Any, k: int | None = None, *, sizes: Sequence[int] | None = None) -> list[Any]:
        """Split ``batch`` into ``k`` (or ``sizes``) contiguous micro-batches."""
        if self.split_fn is None:
            return split_batch(batch, k, sizes=sizes, layout=self)
        joined = remembered_sizes(batch) if sizes is None else None
        if joined is not None and len(joined) == k and (kept := remembered_parts(batch)) is not None:
            return kept
        sizes = _check_sizes(sizes, k, self.size(batch))
        try:
            parts = list(self.split_fn(batch, list(sizes)))
        except TroptError:
            raise
        except Exception as exc:
            raise TroptError(f"split_fn raised {type(exc).__name__}: {exc}",
                             "fix split_fn; tropt calls it as split_fn(batch, sizes) "
                             "with sizes a list of sample counts") from exc
        got = [self.size(p) for p in parts]
        if got != list(sizes):
            raise TroptError(f"split_fn was asked for micro-batches of {list(sizes)} samples "
                             f"but size_fn counts {got} in what it returned",
                             "return one micro-batch per requested size, in order, each holding that many samples")
        return parts


def to_device(batch: Any, device: str | torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in a (nested) batch to ``device``; other values pass through unchanged."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return rebuild(batch, {key: to_device(v, device, non_blocking) for key, v in batch.items()})
    if isinstance(batch, (list, tuple)) and not is_plain_sequence(batch):
        return rebuild(batch, [to_device(v, device, non_blocking) for v in batch])
    return batch


# ---------------------------------------------------------------------------------------------- the walker
Path = tuple  # a path of keys/indices into a nested batch


def leaves(batch: Any, path: Path = ()) -> list[tuple[Path, torch.Tensor]]:
    """Every tensor in a nested batch with its path (the one rule: tensors are leaves; mappings and non-plain
    lists/tuples, namedtuples included, are walked; plain value lists, strings and other objects are not)."""
    if isinstance(batch, torch.Tensor):
        return [(path, batch)]
    if isinstance(batch, Mapping):
        return [x for k, v in batch.items() for x in leaves(v, (*path, k))]
    if isinstance(batch, (list, tuple)) and not is_plain_sequence(batch):
        return [x for i, v in enumerate(batch) for x in leaves(v, (*path, i))]
    return []


def get_leaf(batch: Any, path: Path) -> Any:
    """The value at ``path`` in a nested batch."""
    for key in path:
        batch = batch[key]
    return batch


def map_leaves(batch: Any, fn: Callable[[Path, torch.Tensor], torch.Tensor], path: Path = ()) -> Any:
    """A batch of the same structure with ``fn(path, tensor)`` in place of every tensor."""
    if isinstance(batch, torch.Tensor):
        return fn(path, batch)
    if isinstance(batch, Mapping):
        return rebuild(batch, {k: map_leaves(v, fn, (*path, k)) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)) and not is_plain_sequence(batch):
        return rebuild(batch, [map_leaves(v, fn, (*path, i)) for i, v in enumerate(batch)])
    return batch


# ------------------------------------------------------------------------------------ joining loader batches
def _join(parts: list, dim: int, path: str, lead: list[tuple[int, ...] | None], sizes: list[int]) -> Any:
    """``parts`` (the same node of each loader batch) joined along the batch dimension."""
    first = parts[0]
    if _is_array(first):
        if all(p.ndim > dim and int(p.shape[dim]) == s for p, s in zip(parts, sizes, strict=True)):
            if len({tuple(p.shape[:dim]) + tuple(p.shape[dim + 1:]) for p in parts}) > 1:
                raise _JoinError(path, f"its shapes differ beyond the batch dimension "
                                       f"({', '.join(str(tuple(p.shape)) for p in parts[:4])})")
            if isinstance(first, torch.Tensor):
                return torch.cat(list(parts), dim=dim)
            return np.concatenate(list(parts), axis=dim)
        elif first.ndim > dim:
            pass  # not one value per sample (a per-batch table): kept once when every batch holds the same
        elif all(_is_flat(p, ld, dim) for p, ld in zip(parts, lead, strict=True)):  # flattened (seq, batch) targets
            shaped = [p.reshape(*(ld or ()), *p.shape[1:]) for p, ld in zip(parts, lead, strict=True)]
            joined = torch.cat(shaped, dim=dim) if isinstance(first, torch.Tensor) else np.concatenate(shaped, dim)
            return joined.reshape(-1, *first.shape[1:])
        elif all(_is_per_sample(p, ld) for p, ld in zip(parts, lead, strict=True)):
            return torch.cat(list(parts)) if isinstance(first, torch.Tensor) else np.concatenate(list(parts))
    elif isinstance(first, Mapping):
        keys = list(first.keys())
        if any(list(p.keys()) != keys for p in parts):
            raise _JoinError(path, "the loader batches hold different keys")
        return rebuild(first, {k: _join([p[k] for p in parts], dim, f"{path}[{k!r}]", lead, sizes) for k in keys})
    elif is_plain_sequence(first) and all(is_plain_sequence(p) and len(p) == s
                                          for p, s in zip(parts, sizes, strict=True)):
        return rebuild(first, [v for p in parts for v in p])
    elif isinstance(first, (list, tuple)) and not is_plain_sequence(first):
        if any(not isinstance(p, (list, tuple)) or len(p) != len(first) for p in parts):
            raise _JoinError(path, "the loader batches hold different numbers of items")
        return rebuild(first, [_join([p[i] for p in parts], dim, f"{path}[{i}]", lead, sizes)
                               for i in range(len(first))])
    if all(_same(p, first) for p in parts[1:]):  # a per-batch constant (metadata, a 0-d tensor): kept once
        return first
    raise _JoinError(path, "it is a per-batch value that differs between the loader batches")


def _user_join(parts: list, layout: BatchLayout, join_fn: Callable[[list], Any]) -> Any:
    """``join_fn(parts)``, checked: it must hold every sample of the parts."""
    try:
        group = join_fn(list(parts))
    except TroptError:
        raise
    except Exception as exc:
        raise TroptError(f"join_fn raised {type(exc).__name__}: {exc}",
                         "fix join_fn; tropt calls it as join_fn(list of loader batches) -> one batch") from exc
    want, got = sum(layout.size(p) for p in parts), layout.size(group)
    if got != want:
        raise TroptError(f"join_fn joined {len(parts)} loader batches of {want} samples into a batch of {got}",
                         "return one batch holding every sample of the batches it is given, in order")
    return group


def _same(a: Any, b: Any) -> bool:
    try:
        if isinstance(a, (torch.Tensor, np.ndarray)) or isinstance(b, (torch.Tensor, np.ndarray)):
            return bool(type(a) is type(b) and a.shape == b.shape and (a == b).all())
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared are not the same
        return False


class _JoinError(Exception):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path or 'the batch'}: {why}")


def join_batches(parts: Sequence[Any], layout: BatchLayout | None = None,
                 join_fn: Callable[[list], Any] | None = None) -> Any:
    """Concatenate loader batches into one batch of the same structure (the samples of ``parts``, in order).

    Tensors and arrays are joined along the layout's batch dimension (flattened ``(seq, batch)`` targets as that
    shape), plain value lists whose length is the batch size are chained, and any other value must be the same in
    every part (it is kept once). :meth:`remember_parts` records the sizes, so :func:`split_batch` with ``k`` equal
    to the number of parts gives the parts back. ``join_fn(parts) -> batch`` joins layouts tropt cannot (batches
    padded to different lengths, a ``split_fn`` layout); its result must hold the parts' samples. Raises
    :class:`TroptError` for batches it cannot join.
    """
    parts = list(parts)
    layout = layout or BatchLayout()
    if len(parts) == 1:
        return parts[0]
    split = ("pass Setup(join_fn=...) (join_fn(list of loader batches) -> one batch), or "
             "Setup(accumulation='split') to split each loader batch into the K micro-batches instead of taking K "
             "loader batches per step")
    if join_fn is not None:
        return _user_join(parts, layout, join_fn)
    if layout.split_fn is not None:
        raise TroptError("Setup(accumulation='batches') takes K loader batches per optimizer step, but tropt cannot "
                         "join batches of a layout given by split_fn/size_fn", split)
    dim = layout.batch_dim
    sizes = [layout.size(p) for p in parts]
    lead = [_reference_lead(_arrays(p, []), dim) if dim else None for p in parts]
    try:
        return _join(parts, dim, "", lead, sizes)
    except _JoinError as exc:
        raise TroptError(f"Setup(accumulation='batches') joins K={len(parts)} consecutive loader batches into one "
                         f"optimizer step, but cannot join them at {exc}",
                         f"pad every loader batch to the same shape (a fixed max_length), or {split}") from None


# The loader-batch sizes of each joined group, so that splitting a group into its K parts gives the user's own
# micro-batches. Keyed by the group's id and guarded by a weak reference to its first array: an entry dies with the
# group, and an id reused by another object never matches (its first array is another object).
_GROUPS: dict[int, tuple[Any, tuple[int, ...], list | None]] = {}


def remember_parts(group: Any, sizes: Sequence[int], parts: list | None = None) -> Any:
    """Record that ``group`` joins loader batches of ``sizes`` samples (and keep ``parts`` themselves when slicing
    the group would not give them back: a ``join_fn`` that pads); returns ``group``."""
    arrays = _arrays(group, [])
    if not arrays or len(sizes) < 2:
        return group
    key = id(group)

    def forget(r: Any) -> None:  # the group is gone: drop its entry, unless a new group took the id already
        entry = _GROUPS.get(key)
        if entry is not None and entry[0] is r:
            del _GROUPS[key]

    try:
        ref = weakref.ref(arrays[0], forget)
    except TypeError:  # an array type without weak references: not remembered (split evenly)
        return group
    _GROUPS[key] = (ref, tuple(int(s) for s in sizes), parts)
    return group


def remembered_sizes(group: Any) -> tuple[int, ...] | None:
    """The loader-batch sizes ``group`` was joined from (:func:`join_batches`), or None."""
    entry = _GROUPS.get(id(group))
    if entry is None:
        return None
    arrays = _arrays(group, [])
    return entry[1] if arrays and entry[0]() is arrays[0] else None


def remembered_parts(group: Any) -> list | None:
    """The loader batches ``group`` was joined from, when they were kept (fresh containers, the same tensors)."""
    if remembered_sizes(group) is None:
        return None
    parts = _GROUPS[id(group)][2]
    return None if parts is None else [map_leaves(p, lambda _, t: t) for p in parts]
