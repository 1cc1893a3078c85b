"""The input-independent baseline of a validation loss: what the best constant prediction scores.

A model that learned something about its inputs beats, on held-out data, the best prediction that ignores them: the
training split's class prior for cross entropy / NLL, its positive rate for binary cross entropy, its mean target for
MSE and its median for L1. That constant is fitted on the *training* targets and scored on the validation targets
with the same loss the Setup uses, so the comparison needs no extra training run. The objective is identified the
same way ``model.init_loss`` identifies it (the standard losses recomputed on the model's output); with a loss tropt
does not recognise there is no baseline and no judgement.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.batch import get_leaf
from ..core.objective import probe
from ..snapshot import preserved

if TYPE_CHECKING:
    from ..setup import Setup


def _constant_loss(kind: str, train: torch.Tensor, val: torch.Tensor, classes: int | None) -> float | None:
    """Mean loss on ``val`` targets of the constant prediction fitted on ``train`` targets (None: not defined)."""
    t, v = train.reshape(-1).double(), val.reshape(-1).double()
    if kind in ("cross_entropy", "nll"):
        t, v = t[t != -100].long(), v[v != -100].long()
        if not v.numel() or classes is None:
            return None
        counts = torch.bincount(t.clamp(0, classes - 1), minlength=classes).double() + 0.5  # unseen classes: finite
        logp = torch.log(counts / counts.sum())
        return float(-logp[v.clamp(0, classes - 1)].mean())
    if kind in ("bce", "bce_logits"):
        p = float(t.mean()) if t.numel() else 0.5
        p = min(max(p, 1e-6), 1 - 1e-6)
        return float(-(v * math.log(p) + (1 - v) * math.log(1 - p)).mean())
    if kind == "mse":
        return float((v - t.mean()).pow(2).mean())
    if kind == "l1":
        return float((v - t.median()).abs().mean())
    return None


def input_independent_baseline(setup: Setup, ctx: Any, val_batches: int, train_batches: int = 16) -> dict | None:
    """``{"value", "kind", "basis"}``: the validation loss of the best input-independent prediction, over the same
    ``val_batches`` batches (weighted by batch size) that the loss-curve evaluation reads; None when the objective is
    not one of the standard losses. Leaves the model, its modes and every RNG as they were."""
    model = ctx.model
    modes = {m: m.training for m in model.modules()}
    with preserved():
        val = list(setup.batches(val_batches, which="val", cycle=False))
        if not val:
            return None
        try:
            model.eval()
            _, _, objective, _ = probe(setup, model, val[0], ctx)
        finally:
            for m, mode in modes.items():
                m.training = mode
        if objective is None:
            return None
        train = torch.cat([get_leaf(b, objective.target_path).detach().cpu().reshape(-1)
                           for b in setup.batches(train_batches, which="train", cycle=False)])
    total, count = 0.0, 0
    for b in val:
        value = _constant_loss(objective.kind, train, get_leaf(b, objective.target_path).detach().cpu(),
                               objective.num_classes)
        if value is None or not math.isfinite(value):
            return None
        n = setup.size(b)
        total, count = total + value * n, count + n
    basis = {"cross_entropy": "the training class prior", "nll": "the training class prior",
             "bce": "the training positive rate", "bce_logits": "the training positive rate",
             "mse": "the training mean target", "l1": "the training median target"}[objective.kind]
    return {"value": total / count, "kind": objective.kind, "basis": basis} if count else None


def beats_baseline(values: np.ndarray, baseline: float, margin: float) -> bool:
    """Whether any finite value lies more than ``margin`` (log units) below the positive ``baseline``."""
    v = values[np.isfinite(values) & (values > 0)]
    return bool(v.size and baseline > 0 and math.log(baseline) - math.log(float(v.min())) > margin)
