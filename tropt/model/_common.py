"""Helpers shared by the stage 2-3 checks only: which batch tensors the model reads, input scale, samples, numbers.

The objective and its identification live in :mod:`tropt.core.objective`, the model-mode helpers in
:mod:`tropt.core.modes`.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from ..core.batch import batch_size, get_leaf, leaves, map_leaves, split_batch
from ..core.grad_mode import loss_grad_mode
from ..core.modes import dropout_off
from ..core.objective import Capture, output_tensor
from ..errors import TroptError

if TYPE_CHECKING:
    from ..setup import Setup


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
        std = float(x.std()) if x.numel() > 1 else 0.0
        rows.append({"input": name, "shape": tuple(t.shape), "mean": mean, "std": std, "rms": rms})
        if 0 < rms < low or rms > high:
            notes.append(f"{name} has RMS {rms:.3g}, far from 1: standardise it (zero mean, unit variance per feature) "
                         "before the model; inputs this " + ("small" if rms < low else "large")
                         + " make the first layer " + ("learn slowly" if rms < low else "saturate or blow up") + ".")
    return pd.DataFrame(rows, columns=["input", "shape", "mean", "std", "rms"]), notes


def _loss_output(setup: Setup, model: nn.Module, batch: Any, ctx: Any = None,
                 zero: frozenset = frozenset(), transform: Any = None) -> torch.Tensor | None:
    """The model's output while ``loss_fn`` runs on ``batch`` (no grad unless the loss differentiates inside itself,
    dropout off, seeded), with the root model's arguments at ``zero`` positions zeroed (or passed through
    ``transform``)."""
    grad = loss_grad_mode(setup, model, batch, ctx)
    torch.manual_seed(0)  # any other randomness in the forward (noise layers) is the same in every probe
    with grad, dropout_off(model), Capture(model) as cap, zeroed_arguments(model, zero, transform):
        if ctx is not None:
            with ctx.autocast():
                setup.loss(model, batch)
        else:
            setup.loss(model, batch)
    return cap.output


def _changes(out: torch.Tensor | None, ref: torch.Tensor | None) -> bool:
    return ref is None or out is None or out.shape != ref.shape or not torch.equal(out, ref)


def _children_outputs(setup: Setup, model: nn.Module, batch: Any, ctx: Any = None) -> list[torch.Tensor]:
    """The outputs of the root model's direct children, in call order, while ``loss_fn`` runs on ``batch`` (as
    :func:`_loss_output`): what a loss that never calls the root model itself (an actor-critic's ``m.q(o, a)``)
    makes of the batch."""
    outs: list[torch.Tensor] = []

    def hook(module: nn.Module, args: Any, out: Any) -> None:
        t = output_tensor(out)
        if t is not None:
            outs.append(t.detach())

    handles = [child.register_forward_hook(hook) for child in model.children()]
    try:
        grad = loss_grad_mode(setup, model, batch, ctx)
        torch.manual_seed(0)
        with grad, dropout_off(model), (ctx.autocast() if ctx is not None else nullcontext()):
            setup.loss(model, batch)
    finally:
        for h in handles:
            h.remove()
    return outs


def _outputs_change(out: list[torch.Tensor], ref: list[torch.Tensor]) -> bool:
    return len(out) != len(ref) or any(_changes(a, b) for a, b in zip(out, ref))


def input_paths(setup: Setup, model: nn.Module, batch: Any, ctx: Any = None) -> set:
    """Paths of the batch tensors the model reads: those whose zeroing changes its output (a target only reaches the
    loss). Runs the loss once per tensor; a tensor whose zeroing breaks the forward counts as an input. When
    ``loss_fn`` never calls the root model, the outputs of its direct children are compared instead (a reward that
    only reaches the loss is a target there too); every tensor counts as an input only when none of them is seen."""
    ref: Any = _loss_output(setup, model, batch, ctx)
    observe: Any = _loss_output
    changed: Any = _changes
    if ref is None:
        kids = _children_outputs(setup, model, batch, ctx)
        if kids:
            ref, observe, changed = kids, _children_outputs, _outputs_change
    found = set()
    for path, _ in leaves(batch):
        try:
            def zero_at(p: Any, t: torch.Tensor, path: Any = path) -> torch.Tensor:
                return torch.zeros_like(t) if p == path else t

            zeroed = map_leaves(batch, zero_at)
            out = observe(setup, model, zeroed, ctx)
        except Exception:  # noqa: BLE001 - zeroing it broke the forward: the model reads it
            found.add(path)
            continue
        if changed(out, ref):
            found.add(path)
    return found


# Hugging Face's name for the target a model computes its own loss from. Encoder-decoders (T5, BART, M2M100,
# Whisper) also shift it right into their decoder input, so zeroing it changes the output; it stays a target.
TARGET_ARGUMENTS = ("labels",)


def argument_positions(setup: Setup, model: nn.Module, batch: Any, ctx: Any = None) -> frozenset | None:
    """The root model's tensor arguments (``("arg", i)`` / ``("kwarg", name)``) whose zeroing changes its output:
    what the input-independent baseline zeroes. Zeroing the model's arguments, not the batch, keeps targets that
    the loss derives from the inputs (a language model's shifted tokens) intact; the labels passed into the model
    (``labels=`` of a Hugging Face model, :data:`TARGET_ARGUMENTS`) are never zeroed, even where they change the
    output (an encoder-decoder builds its decoder input from them). A decoder input the loss passes explicitly is
    zeroed like any input: it cannot be told from a causal LM's own input, the same shift of the same tokens, and
    zeroing it only makes the baseline weaker. None when ``loss_fn`` never calls the root model."""
    seen: list = []

    def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not seen:
            seen.extend([("arg", i) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
                        + [("kwarg", k) for k, v in kwargs.items()
                           if isinstance(v, torch.Tensor) and k not in TARGET_ARGUMENTS])

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


def _zero(t: torch.Tensor) -> torch.Tensor:
    """Zeros shaped like ``t``; still joined to ``t``'s graph when it needs a gradient (a gradient penalty inside the
    loss differentiates the output with respect to it: a fresh zeros tensor would be no part of its graph)."""
    if t.requires_grad and torch.is_grad_enabled():
        return t.nan_to_num(0.0, 0.0, 0.0) * 0
    return torch.zeros_like(t)


def zeroed_arguments(model: nn.Module, positions: frozenset, transform: Any = None):
    """Context manager: every call of ``model`` gets zeros (or ``transform`` of them) in place of its tensor
    arguments at ``positions``."""
    from contextlib import nullcontext

    if not positions:
        return nullcontext()
    change = transform or _zero

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
        args = tuple(change(a) if ("arg", i) in positions and isinstance(a, torch.Tensor) else a
                     for i, a in enumerate(args))
        kwargs = {k: change(v) if ("kwarg", k) in positions and isinstance(v, torch.Tensor) else v
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
        return table, (f"the target's mean ({mean:.3g}) is {abs(mean) / max(std, 1e-12):.0f}x its std ({std:.3g}), "
                       "far from the ~0 a fresh model outputs")
    if std > 10:
        return table, f"the target's std is {std:.3g}, far from unit scale"
    return None


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


def acc_text(a: float) -> str:
    """An accuracy that never rounds up to 100% (99.9% of tokens is not all of them)."""
    return "100%" if a >= 1.0 else f"{math.floor(a * 1000) / 10:.1f}%"
