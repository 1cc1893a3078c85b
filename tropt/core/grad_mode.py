"""The grad mode a probe evaluates ``loss_fn`` in: no gradients, unless the loss needs autograd inside itself.

A gradient penalty (WGAN-GP's ``autograd.grad(critic(x_hat), x_hat, create_graph=True)``, R1 regularisation), input
gradient regularisation ("double backpropagation") or a loss that calls ``backward`` itself cannot run under
``torch.no_grad()``: autograd raises "element 0 of tensors does not require grad". A probe that only reads the loss's
value asks :func:`loss_grad_mode` for the context to evaluate it in: ``torch.no_grad()`` when the loss runs without
gradients, ``torch.enable_grad()`` when it raised that error under ``no_grad``. The answer comes from one trial
evaluation on the probe's model (its parameters, buffers, modes and the RNGs are restored after it) and is remembered
per ``loss_fn``. The whole loss runs in one mode: no probe switches grad mode between a forward and a backward inside
the loss.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..snapshot import preserved

if TYPE_CHECKING:
    from ..setup import Setup

# What autograd raises when a loss that differentiates itself runs without gradients.
_AUTOGRAD_MARKERS = ("does not require grad", "does not have a grad_fn", "inference tensor")
_KNOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_autograd_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is autograd's "this tensor has no graph" error."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, RuntimeError) and any(m in str(exc) for m in _AUTOGRAD_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _remembered(loss_fn: Any, training: bool) -> bool | None:
    try:
        return _KNOWN.get(loss_fn, {}).get(training)
    except TypeError:  # not hashable or not weak-referenceable: decided anew each time
        return None


def _remember(loss_fn: Any, training: bool, needs: bool) -> None:
    with contextlib.suppress(TypeError):
        _KNOWN.setdefault(loss_fn, {})[training] = needs


def loss_needs_grad(setup: Setup, model: nn.Module, batch: Any, ctx: Any = None) -> bool:
    """Whether ``loss_fn`` needs gradients enabled to run (it differentiates inside itself).

    Decided once per ``loss_fn`` by evaluating it under ``torch.no_grad()`` on ``model`` and ``batch`` (under the
    context's autocast when ``ctx`` is given), with the model's state and the RNGs restored afterwards; remembered per
    ``loss_fn`` and train/eval mode (a penalty computed only in training). A loss that fails for any other reason
    counts as not needing gradients (the probe's own call then raises that error)."""
    training = bool(model.training)
    known = _remembered(setup.loss_fn, training)
    if known is not None:
        return known
    needs = False
    try:
        with preserved(model), torch.no_grad(), (ctx.autocast() if ctx is not None else contextlib.nullcontext()):
            setup.loss(model, batch)
    except Exception as exc:  # noqa: BLE001 - any other failure is the probe's own call to report
        if not is_autograd_error(exc):
            return False
        needs = True
    _remember(setup.loss_fn, training, needs)
    return needs


def loss_grad_mode(setup: Setup, model: nn.Module, batch: Any,
                   ctx: Any = None) -> contextlib.AbstractContextManager[Any]:
    """``torch.enable_grad()`` when ``loss_fn`` needs gradients to run (a gradient penalty inside it), else
    ``torch.no_grad()``: the context a probe evaluates the loss in (see :func:`loss_needs_grad`)."""
    return torch.enable_grad() if loss_needs_grad(setup, model, batch, ctx) else torch.no_grad()


def grad_mode(needs_grad: bool) -> contextlib.AbstractContextManager[Any]:
    """``torch.enable_grad()`` or ``torch.no_grad()``, for a decision already taken by :func:`loss_needs_grad`."""
    return torch.enable_grad() if needs_grad else torch.no_grad()
