"""Reading a Setup's own data pipeline: the label of a batch (one documented rule), loader passes with the RNGs
seeded once and the loader's sampler state put back (content hashes of batches: :mod:`tropt.core.hashes`).

The label rule, shared by ``data.sampling``, ``data.eval_transforms`` and ``model.eval_metric``: the second element of
a tuple/list batch (or sample), or the first of the keys ``label``, ``labels``, ``y``, ``target``, ``targets`` in a
dict batch; it counts as class labels when its dtype is integer or bool and it holds one value per sample.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.batch import batch_size, is_plain_sequence, leaves
from ..errors import SetupError

if TYPE_CHECKING:
    from ..setup import Setup

LABEL_KEYS = ("label", "labels", "y", "target", "targets")


def samples_in(setup: Setup, batch: Any) -> int:
    """The number of samples in ``batch``, by the Setup's layout when it has one (``batch_dim``, ``size_fn``)."""
    size = getattr(setup, "size", None)
    return size(batch) if callable(size) else batch_size(batch)


def sample_dim(setup: Setup) -> int | None:
    """The dimension that holds samples (0 unless ``batch_dim`` says otherwise); None for a custom ``split_fn``."""
    if getattr(setup, "split_fn", None) is not None:
        return None
    return int(getattr(setup, "batch_dim", 0) or 0)


def label_path(batch: Any) -> tuple | None:
    """Where the label sits in a batch or sample by the documented rule, or None."""
    if isinstance(batch, Mapping):
        return next(((k,) for k in LABEL_KEYS if k in batch), None)
    if isinstance(batch, (list, tuple)) and not is_plain_sequence(batch) and len(batch) >= 2:
        return (1,)
    return None


def class_labels(batch: Any) -> tuple[torch.Tensor | None, str]:
    """The batch's class labels as a 1-d int64 CPU tensor, or (None, the reason they cannot be read)."""
    path = label_path(batch)
    if path is None:
        return None, (f"a {type(batch).__name__} batch has no label by tropt's rule "
                      "(the second element of a tuple/list "
                      f"batch, or a {'/'.join(LABEL_KEYS)} key of a dict batch)")
    y = batch[path[0]]
    if isinstance(y, np.ndarray):
        y = torch.from_numpy(y)
    elif isinstance(y, (list, tuple)) and y and all(isinstance(v, (int, bool, np.integer)) for v in y):
        y = torch.tensor([int(v) for v in y])
    if not isinstance(y, torch.Tensor):
        return None, f"the label batch[{path[0]!r}] is a {type(y).__name__}, not a tensor"
    if y.is_floating_point() or y.is_complex():
        return None, f"the label batch[{path[0]!r}] is floating point ({y.dtype}): not class labels (regression?)"
    if y.ndim == 0 or (y.ndim > 1 and y[0].numel() != 1):
        return None, f"the label batch[{path[0]!r}] has shape {tuple(y.shape)}: not one class per sample"
    return y.detach().reshape(-1).long().cpu(), ""


def sample_label(sample: Any) -> int | None:
    """One dataset sample's class label by the same rule, or None."""
    path = label_path(sample)
    if path is None:
        return None
    y = sample[path[0]]
    if isinstance(y, (torch.Tensor, np.ndarray)):
        if y.size == 0 if isinstance(y, np.ndarray) else y.numel() != 1:
            return None
        if (y.dtype.kind == "f") if isinstance(y, np.ndarray) else (y.is_floating_point() or y.is_complex()):
            return None
        return int(y.reshape(-1)[0])
    if isinstance(y, (bool, int, np.integer)):
        return int(y)
    return None


def _sampler_objects(loader: Any) -> list[Any]:
    """The loader and the samplers behind it (where generators and epochs live)."""
    objs = [loader]
    for attr in ("sampler", "batch_sampler"):
        obj = getattr(loader, attr, None)
        if obj is not None:
            objs.append(obj)
            inner = getattr(obj, "sampler", None)
            if inner is not None:
                objs.append(inner)
    return objs


@contextlib.contextmanager
def loader_state(loader: Any, seed: int) -> Iterator[None]:
    """Seed the global torch RNG and the loader's own generators once, and put the generators and any sampler
    ``epoch`` back on exit (a pass must not advance the user's pipeline). Run it inside
    :func:`tropt.snapshot.preserved`, which restores the global RNGs."""
    objs = _sampler_objects(loader)
    gens = {id(g): g for o in objs for g in [getattr(o, "generator", None)] if isinstance(g, torch.Generator)}
    saved = {k: g.get_state() for k, g in gens.items()}
    epochs = [(o, o.epoch) for o in objs if isinstance(getattr(o, "epoch", None), int)]
    torch.manual_seed(seed)
    for g in gens.values():
        g.manual_seed(seed)
    try:
        yield
    finally:
        for k, g in gens.items():
            g.set_state(saved[k])
        for o, e in epochs:
            o.epoch = e


def iter_pass(loader: Any, limit: int | None, what: str) -> Iterator[Any]:
    """Stream the first ``limit`` batches (all when None) of one pass over ``loader``, one batch in memory at a
    time; a pass without batches is a :class:`SetupError`."""
    count = 0
    for batch in loader:
        yield batch
        count += 1
        if limit is not None and count >= limit:
            return
    if count == 0:
        raise SetupError(f"Setup: {what} yielded no batches",
                         "check the dataset is not empty and drop_last/batch_size leave a batch")


def input_leaves(batch: Any) -> list[tuple[tuple, torch.Tensor]]:
    """The floating-point tensors of a batch other than its label (the inputs whose statistics are compared)."""
    label = label_path(batch)
    return [(p, t) for p, t in leaves(batch)
            if t.is_floating_point() and t.ndim >= 1 and (label is None or p[:1] != label)]


def path_name(path: tuple) -> str:
    """How the evidence names the input at ``path`` of a batch: ``batch[0]``, ``batch['x']``."""
    return "batch" + "".join(f"[{p!r}]" for p in path)
