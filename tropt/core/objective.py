"""The objective and its identification, shared by the model, dynamics and experiments code.

``loss_fn(model, batch)`` is a black box, so the objective is *identified*, not guessed: the model's output is
captured with a forward hook while ``loss_fn`` runs, and the standard losses (cross entropy, NLL, binary cross
entropy with or without logits, MSE, L1) are recomputed on that output against each tensor of the batch. The one
that reproduces the user's loss value names the objective and the target tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

from .batch import Path, leaves

if TYPE_CHECKING:
    from ..setup import Setup


# ---------------------------------------------------------------------------------------------- model output
def output_tensor(out: Any) -> torch.Tensor | None:
    """The prediction tensor in a model's output: itself, ``.logits``, ``["logits"]`` or the first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, Mapping):
        if isinstance(out.get("logits"), torch.Tensor):
            return out["logits"]
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for v in out:
            if isinstance(v, torch.Tensor):
                return v
    return None


class Capture:
    """Context manager capturing the root model's outputs (and the leaf modules' call order) during a call."""

    def __init__(self, model: nn.Module, order: bool = False) -> None:
        self.model, self.order = model, order
        self.outputs: list[torch.Tensor] = []
        self.calls: list[str] = []

    def __enter__(self) -> Capture:
        def hook(module: nn.Module, args: Any, out: Any) -> None:
            t = output_tensor(out)
            if t is not None:
                self.outputs.append(t.detach())

        self.handles = [self.model.register_forward_hook(hook)]
        if self.order:
            for name, m in self.model.named_modules():
                if name and any(True for _ in m.parameters(recurse=False)):
                    self.handles.append(m.register_forward_hook(lambda mod, a, o, name=name: self.calls.append(name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()

    @property
    def output(self) -> torch.Tensor | None:
        if len(self.outputs) == 1:
            return self.outputs[0]
        if len(self.outputs) > 1:  # several forwards (e.g. micro-batches): concatenate when shapes allow
            try:
                return torch.cat(self.outputs, 0)
            except RuntimeError:
                return None
        return None


# ---------------------------------------------------------------------------------------------- objectives
KIND_NAMES = {
    "cross_entropy": "cross entropy",
    "nll": "negative log-likelihood (log-probabilities)",
    "bce_logits": "binary cross entropy with logits",
    "bce": "binary cross entropy on probabilities",
    "mse": "mean squared error",
    "l1": "mean absolute error",
}


def class_layouts(out: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Ways to read (out, y) as (N, C) logits and (N,) class indices; each with C."""
    ways = []
    if out.ndim >= 2 and out.shape[:-1] == y.shape:
        ways.append((out.reshape(-1, out.shape[-1]), y.reshape(-1), out.shape[-1]))
    if out.ndim >= 3 and out.shape[0] == y.shape[0] and out.shape[2:] == y.shape[1:]:
        c = out.shape[1]
        ways.append((out.movedim(1, -1).reshape(-1, c), y.reshape(-1), c))
    return ways


@dataclass
class Objective:
    """An identified objective: its kind, where its target lives in the batch, and the class count if any."""

    kind: str
    target_path: Path
    num_classes: int | None
    layout: int = 0  # which class layout matched (see class_layouts)

    @property
    def name(self) -> str:
        return KIND_NAMES[self.kind]

    @property
    def is_classification(self) -> bool:
        return self.kind in ("cross_entropy", "nll", "bce_logits", "bce")

    def pairs(self, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(predictions, targets) flattened the way the objective reads them."""
        if self.kind in ("cross_entropy", "nll"):
            o, t, _ = class_layouts(out, y)[self.layout]
            return o, t
        return out.reshape(-1), y.reshape(-1)

    def correct(self, out: torch.Tensor, y: torch.Tensor) -> tuple[int, int] | None:
        """(correct, counted) predictions on a batch; None for regression."""
        if not self.is_classification:
            return None
        o, t = self.pairs(out.float(), y)
        if self.kind in ("cross_entropy", "nll"):
            valid = t != -100  # the default ignore_index
            return int(((o.argmax(-1) == t) & valid).sum()), int(valid.sum())
        cut = 0.0 if self.kind == "bce_logits" else 0.5
        return int(((o > cut) == (t > 0.5)).sum()), int(t.numel())


def _candidates(out: torch.Tensor, y: torch.Tensor) -> list[tuple[str, int, float, int | None]]:
    """(kind, layout, loss value, classes) for every standard objective that applies to (out, y)."""
    res: list[tuple[str, int, float, int | None]] = []
    out = out.float()
    if not y.is_floating_point() and not y.is_complex() and y.dtype != torch.bool:
        for i, (o, t, c) in enumerate(class_layouts(out, y)):
            t = t.long()
            if ((t >= 0) & (t < c) | (t == -100)).all():
                res.append(("cross_entropy", i, float(F.cross_entropy(o, t)), c))
                res.append(("nll", i, float(F.nll_loss(o, t)), c))
    if out.numel() == y.numel() and out.numel() > 0:
        o, t = out.reshape(-1), y.reshape(-1).float()
        if ((t >= 0) & (t <= 1)).all():
            res.append(("bce_logits", 0, float(F.binary_cross_entropy_with_logits(o, t)), 2))
            if ((o >= 0) & (o <= 1)).all():
                res.append(("bce", 0, float(F.binary_cross_entropy(o, t)), 2))
        res.append(("mse", 0, float(F.mse_loss(o, t)), None))
        res.append(("l1", 0, float(F.l1_loss(o, t)), None))
    return res


def identify_objective(loss: float, out: torch.Tensor | None, batch: Any, num_classes: int | None = None,
                       rtol: float = 1e-4) -> Objective | None:
    """The standard objective whose value on (``out``, a tensor of ``batch``) reproduces ``loss``, or None."""
    if out is None or not math.isfinite(loss):
        return None
    n_out = out.shape[0] if out.ndim else 0
    for path, y in leaves(batch):
        if y.ndim == 0 or y.shape[0] != n_out or y is out:
            continue
        with torch.no_grad():
            for kind, layout, value, classes in _candidates(out, y.to(out.device)):
                if math.isfinite(value) and abs(value - loss) <= rtol * max(1.0, abs(loss)):
                    if kind in ("cross_entropy", "nll") and num_classes is not None:
                        classes = num_classes
                    return Objective(kind, path, classes, layout)
    return None


def probe(setup: Setup, model: nn.Module, batch: Any,
          ctx: Any = None) -> tuple[float, torch.Tensor | None, Objective | None, list[str]]:
    """Run ``loss_fn`` once under no_grad (with gradients when the loss differentiates inside itself, see
    :func:`tropt.core.grad_mode.loss_grad_mode`): (loss value, model output, identified objective, leaf call order)."""
    from .grad_mode import loss_grad_mode

    with loss_grad_mode(setup, model, batch, ctx), Capture(model, order=True) as cap:
        if ctx is not None:
            with ctx.autocast():
                loss = setup.loss(model, batch)
        else:
            loss = setup.loss(model, batch)
    value = float(loss.detach().float())
    out = cap.output
    return value, out, identify_objective(value, out, batch, setup.num_classes), cap.calls

