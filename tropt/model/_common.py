"""Shared machinery of the stage 2-3 checks: reading the objective off an opaque ``loss_fn``, batch leaves, layers.

``loss_fn(model, batch)`` is a black box, so the objective is *identified*, not guessed: the model's output is
captured with a forward hook while ``loss_fn`` runs, and the standard losses (cross entropy, NLL, binary cross
entropy with or without logits, MSE, L1) are recomputed on that output against each tensor of the batch. The one
that reproduces the user's loss value names the objective and the target tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F

from ..core.batch import Path, batch_size, get_leaf, leaves, map_leaves, split_batch
from ..errors import TroptError

def zero_inputs(batch: Any, inputs: set) -> Any:
    """The batch with the tensors at ``inputs`` zeroed (the rest, e.g. the target, kept): the input-independent
    baseline's data."""
    return map_leaves(batch, lambda p, t: torch.zeros_like(t) if p in inputs else t)


def take_samples(batch: Any, n: int, layout: Any = None) -> Any:
    """The first ``n`` samples of a batch (the batch itself when it holds no more); ``layout`` is the Setup's
    :class:`tropt.batching.BatchLayout` (samples along dimension 0 when None)."""
    total = layout.size(batch) if layout is not None else batch_size(batch)
    if total <= n:
        return batch
    return (layout.split if layout is not None else split_batch)(batch, sizes=[n, total - n])[0]


def require_samples(batch: Any, minimum: int, why: str, check: str, layout: Any = None) -> int:
    """The batch's sample count, or a TroptError saying the batch is too small for ``check`` and why."""
    n = layout.size(batch) if layout is not None else batch_size(batch)
    if n < minimum:
        raise TroptError(
            f"{check}: the first batch holds {n} sample(s), too few to sample: it needs at least {minimum} ({why})",
            f"use batches of at least {minimum} samples (batch_size on the DataLoader or Setup)",
        )
    return n


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

    def __enter__(self) -> "Capture":
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


def _class_layouts(out: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
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
    layout: int = 0  # which class layout matched (see _class_layouts)

    @property
    def name(self) -> str:
        return KIND_NAMES[self.kind]

    @property
    def is_classification(self) -> bool:
        return self.kind in ("cross_entropy", "nll", "bce_logits", "bce")

    def pairs(self, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(predictions, targets) flattened the way the objective reads them."""
        if self.kind in ("cross_entropy", "nll"):
            o, t, _ = _class_layouts(out, y)[self.layout]
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
    res = []
    out = out.float()
    if not y.is_floating_point() and not y.is_complex() and y.dtype != torch.bool:
        for i, (o, t, c) in enumerate(_class_layouts(out, y)):
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


def probe(setup: Any, model: nn.Module, batch: Any, ctx: Any = None) -> tuple[float, torch.Tensor | None, Objective | None, list[str]]:
    """Run ``loss_fn`` once under no_grad: (loss value, model output, identified objective, leaf call order)."""
    with torch.no_grad(), Capture(model, order=True) as cap:
        if ctx is not None:
            with ctx.autocast():
                loss = setup.loss(model, batch)
        else:
            loss = setup.loss(model, batch)
    value = float(loss.detach().float())
    out = cap.output
    return value, out, identify_objective(value, out, batch, setup.num_classes), cap.calls


def input_scale(batch: Any, inputs: set, low: float = 0.1, high: float = 10.0) -> tuple[pd.DataFrame, list[str]]:
    """Per floating-point input tensor of the batch (paths in ``inputs``): its mean and RMS, and a sentence for each
    one whose RMS lies outside [low, high] (inputs far from unit scale make the first layer learn slowly or blow up)."""
    rows, notes = [], []
    for path, t in leaves(batch):
        if path not in inputs or not t.is_floating_point() or t.numel() == 0:
            continue
        x = t.detach().double()
        rms, mean = float(x.pow(2).mean().sqrt()), float(x.mean())
        name = "batch" + "".join(f"[{p!r}]" for p in path)
        rows.append({"input": name, "shape": tuple(t.shape), "mean": mean, "std": float(x.std()) if x.numel() > 1 else 0.0,
                     "rms": rms})
        if 0 < rms < low or rms > high:
            notes.append(f"{name} has RMS {rms:.3g}, far from 1: standardise it (zero mean, unit variance per feature) "
                         "before the model; inputs this " + ("small" if rms < low else "large") + " make the first layer "
                         + ("learn slowly" if rms < low else "saturate or blow up") + ".")
    return pd.DataFrame(rows, columns=["input", "shape", "mean", "std", "rms"]), notes


def _loss_output(setup: Any, model: nn.Module, batch: Any, ctx: Any = None, zero: frozenset = frozenset()) -> torch.Tensor | None:
    """The model's output while ``loss_fn`` runs on ``batch`` (no grad, dropout off, seeded), with the root model's
    arguments at ``zero`` positions zeroed."""
    torch.manual_seed(0)  # any other randomness in the forward (noise layers) is the same in every probe
    with torch.no_grad(), dropout_off(model), Capture(model) as cap, zeroed_arguments(model, zero):
        if ctx is not None:
            with ctx.autocast():
                setup.loss(model, batch)
        else:
            setup.loss(model, batch)
    return cap.output


def _changes(out: torch.Tensor | None, ref: torch.Tensor | None) -> bool:
    return ref is None or out is None or out.shape != ref.shape or not torch.equal(out, ref)


def input_paths(setup: Any, model: nn.Module, batch: Any, ctx: Any = None) -> set:
    """Paths of the batch tensors the model reads: those whose zeroing changes its output (a target only reaches the
    loss). Runs the loss once per tensor; a tensor whose zeroing breaks the forward counts as an input."""
    ref = _loss_output(setup, model, batch, ctx)
    found = set()
    for path, _ in leaves(batch):
        try:
            out = _loss_output(setup, model, map_leaves(batch, lambda p, t: torch.zeros_like(t) if p == path else t), ctx)
        except Exception:  # noqa: BLE001 - zeroing it broke the forward: the model reads it
            found.add(path)
            continue
        if _changes(out, ref):
            found.add(path)
    return found


def argument_positions(setup: Any, model: nn.Module, batch: Any, ctx: Any = None) -> frozenset | None:
    """The root model's tensor arguments (``("arg", i)`` / ``("kwarg", name)``) whose zeroing changes its output:
    what the input-independent baseline zeroes. Zeroing the model's arguments, not the batch, keeps targets that
    the loss derives from the inputs (a language model's shifted tokens) and labels passed into the model
    (``labels=`` of a Hugging Face model) intact. None when ``loss_fn`` never calls the root model."""
    seen: list = []

    def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not seen:
            seen.extend([("arg", i) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
                        + [("kwarg", k) for k, v in kwargs.items() if isinstance(v, torch.Tensor)])

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        ref = _loss_output(setup, model, batch, ctx)
    finally:
        handle.remove()
    if not seen and ref is None:
        return None
    found = set()
    for pos in seen:
        try:
            out = _loss_output(setup, model, batch, ctx, frozenset([pos]))
        except Exception:  # noqa: BLE001 - zeroing it broke the forward: the model reads it
            found.add(pos)
            continue
        if _changes(out, ref):
            found.add(pos)
    return frozenset(found)


def zeroed_arguments(model: nn.Module, positions: frozenset):
    """Context manager: every call of ``model`` gets zeros in place of its tensor arguments at ``positions``."""
    from contextlib import nullcontext

    if not positions:
        return nullcontext()

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
        args = tuple(torch.zeros_like(a) if ("arg", i) in positions and isinstance(a, torch.Tensor) else a
                     for i, a in enumerate(args))
        kwargs = {k: torch.zeros_like(v) if ("kwarg", k) in positions and isinstance(v, torch.Tensor) else v
                  for k, v in kwargs.items()}
        return args, kwargs

    class _Zeroed:
        def __enter__(self) -> None:
            self.handle = model.register_forward_pre_hook(hook, with_kwargs=True)

        def __exit__(self, *exc: Any) -> None:
            self.handle.remove()

    return _Zeroed()


def target_scale(batch: Any, objective: Any) -> tuple[pd.DataFrame, str] | None:
    """For a regression objective whose target is far from zero mean / unit scale: its statistics and a sentence.

    A freshly initialised regressor outputs about 0, so a target with mean 150 makes the first hundreds of steps
    nothing but moving the output bias (a model and its zeroed-input baseline then look alike)."""
    if objective is None or objective.kind not in ("mse", "l1"):
        return None
    y = get_leaf(batch, objective.target_path).detach().double()
    mean, std = float(y.mean()), float(y.std()) if y.numel() > 1 else 0.0
    table = pd.DataFrame([{"target": "batch" + "".join(f"[{p!r}]" for p in objective.target_path), "mean": mean,
                           "std": std, "abs_max": float(y.abs().max())}])
    if abs(mean) > 3 * max(std, 1e-12) and abs(mean) > 1:
        return table, f"the target's mean ({mean:.3g}) is {abs(mean) / max(std, 1e-12):.0f}x its std ({std:.3g}), far from the ~0 a fresh model outputs"
    if std > 10:
        return table, f"the target's std is {std:.3g}, far from unit scale"
    return None



def dropout_off(model: nn.Module):
    """Context manager: dropout modules in eval mode and attention dropout at 0 (other modules untouched), restored
    on exit. ``nn.MultiheadAttention`` keeps its dropout as a float applied whenever it trains."""
    from contextlib import contextmanager

    @contextmanager
    def cm():
        drops = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training]
        attn = [(m, m.dropout) for m in model.modules() if isinstance(m, nn.MultiheadAttention) and m.dropout]
        for m in drops:
            m.eval()
        for m, _ in attn:
            m.dropout = 0.0
        try:
            yield
        finally:
            for m in drops:
                m.train()
            for m, p in attn:
                m.dropout = p

    return cm()


def fmt(x: float) -> str:
    """A short number for summaries."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return str(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e4):
        return f"{x:.2e}"
    return f"{x:.3g}"


def names_list(names: list[str], limit: int = 4) -> str:
    """``a, b, c and 3 more``."""
    names = list(names)
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f" and {len(names) - limit} more"
