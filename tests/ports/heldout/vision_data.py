"""Shared generated data for the vision probe ports: 3x8x8 noise images with a bright blob in the quadrant of the
class (the corpus's image_classification generator, re-stated so the probe files stand alone)."""
from __future__ import annotations

import torch

C, HW = 4, 8


def images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    x = 0.5 * torch.randn(n, 3, HW, HW, generator=g)
    for i, c in enumerate(y.tolist()):
        r, s = 4 * (c // 2), 4 * (c % 2)
        x[i, :, r:r + 4, s:s + 4] += 1.5
    return x, y


def image_batches(n_batches: int, batch: int = 32, seed: int = 0) -> list:
    x, y = images(n_batches * batch, seed)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, n_batches * batch, batch)]


def accuracy(model, val_data) -> float:
    right = total = 0
    with torch.no_grad():
        for x, y in val_data:
            hard = y.argmax(1) if y.is_floating_point() else y
            right, total = right + int((model(x).argmax(1) == hard).sum()), total + len(hard)
    return right / total
