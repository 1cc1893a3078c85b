"""Gradual unfreezing under :class:`tropt.GradientMonitor`: parameters frozen when it was entered and trainable
later (fastai's ``freeze_to``, a step that unfreezes a layer group per epoch) join the watched ones, so one that then
gets gradients but is in no optimizer is found."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from .monitor import GradientMonitor


def watch_unfrozen(mon: GradientMonitor) -> None:
    """Start watching the parameters frozen at entry that are trainable now (a step that unfreezes layer groups
    as it goes): they get a column of NaN for the steps before, and are no longer listed in :attr:`frozen`."""
    new = [(n, p) for n, p in mon._late if p.requires_grad]
    mon._late = [(n, p) for n, p in mon._late if not p.requires_grad]
    start = len(mon._params)
    mon.names += [n for n, _ in new]
    mon._params += [p for _, p in new]
    added = {n for n, _ in new}
    mon.frozen = [n for n in mon.frozen if n not in added]
    mon._pid.update({id(p): start + j for j, (_, p) in enumerate(new)})
    mon._numel = torch.cat([mon._numel, torch.tensor([p.numel() for _, p in new], dtype=torch.float64)])
    mon._total_numel = max(1.0, float(mon._numel.sum()))
    grow = np.zeros(len(new), dtype=np.int64)
    mon.grad_seen = np.concatenate([mon.grad_seen, grow])
    mon.in_optimizer = np.concatenate([mon.in_optimizer, grow.astype(bool)])
    mon.lr_nonzero = np.concatenate([mon.lr_nonzero, grow.astype(bool)])
    mon._devices |= {p.device for _, p in new}
    if len(mon._devices) > 1 and mon._device.type != "cpu":
        mon._device = torch.device("cpu")
        mon._index_cache = {}
    assert mon._data is not None  # allocated by __enter__
    pad = torch.full((mon._data.shape[0], len(new), mon._data.shape[2]), float("nan"), dtype=mon._data.dtype,
                     device=mon._data.device)
    mon._data = torch.cat([mon._data, pad], dim=1).to(mon._device)
    mon._frac_cache, mon._layouts = {}, {}
    mon._all_in_optimizer = False
    mon._outside = [i for i in range(len(mon._params)) if not mon.in_optimizer[i]]

