"""Content hashes of batches and of their samples, for "same batch?" and "same sample?" comparisons (the training
order between passes, a validation transform read twice, a model's inputs matched to their labels)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def fingerprint(batch: Any) -> str:
    """A content hash of every tensor and plain value in a batch (for "same batch?" comparisons)."""
    h = hashlib.blake2b(digest_size=16)

    def feed(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            h.update(str((x.dtype, tuple(x.shape))).encode())
            h.update(x.contiguous().view(torch.uint8).numpy().tobytes() if x.numel() else b"")
        elif isinstance(x, np.ndarray):
            h.update(str((x.dtype, x.shape)).encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, Mapping):
            for k in x:
                h.update(repr(k).encode())
                feed(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                feed(v)
        else:
            h.update(repr(x).encode())

    feed(batch)
    return h.hexdigest()


def row_hashes(x: torch.Tensor) -> list[bytes]:
    """A content hash of each sample (row along dimension 0) of a tensor."""
    flat = x.detach().cpu().contiguous().reshape(x.shape[0], -1)
    raw = flat.view(torch.uint8).numpy() if flat.numel() else None
    return [hashlib.blake2b(raw[i].tobytes(), digest_size=16).digest() if raw is not None else b""
            for i in range(x.shape[0])]
