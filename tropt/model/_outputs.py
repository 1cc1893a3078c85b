"""Output formats for ``model.eval_metric``'s trivial predictors: replace a model's prediction in its own output
(tensor, ``.logits``, dict, tuple) and recompute the loss a model returns beside it (``outputs.loss``)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from ..core.objective import Objective, identify_objective
from ..errors import TroptError

CHECK = "model.eval_metric"


def replace_prediction(out: Any, new: torch.Tensor) -> Any:
    """The model's output with its prediction tensor (see :func:`output_tensor`) replaced by ``new``."""
    if isinstance(out, torch.Tensor):
        return new
    if isinstance(getattr(out, "logits", None), torch.Tensor):
        out = copy.copy(out)
        try:
            out.logits = new
        except (AttributeError, TypeError):
            out["logits"] = new
        return out
    if isinstance(out, Mapping):
        out = dict(out)
        key = ("logits" if isinstance(out.get("logits"), torch.Tensor)
               else next(k for k, v in out.items() if isinstance(v, torch.Tensor)))
        out[key] = new
        return out
    if isinstance(out, (list, tuple)):
        items = list(out)
        i = next(i for i, v in enumerate(items) if isinstance(v, torch.Tensor))
        items[i] = new
        return type(out)(items) if not hasattr(out, "_fields") else type(out)(*items)
    raise TroptError(f"{CHECK}: the model returns a {type(out).__name__} with no prediction tensor",
                     "return a tensor, .logits or a dict")


def own_loss(out: Any) -> torch.Tensor | None:
    """The loss a model computed itself and returns beside its prediction (``outputs.loss``, ``out["loss"]``)."""
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def set_loss(out: Any, loss: torch.Tensor) -> Any:
    """``out`` (already a copy made by :func:`replace_prediction`) with its own loss replaced."""
    if isinstance(out, MutableMapping):
        out["loss"] = loss  # a dict, or a Hugging Face ModelOutput (its attribute follows the key)
        return out
    with contextlib.suppress(AttributeError, TypeError):  # a frozen output object: left as it is
        out.loss = loss
    return out


def objective_loss(objective: Objective, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The value of a standard loss (see :mod:`tropt.core.objective`) on (``out``, ``y``)."""
    o, t = objective.pairs(out.float(), y.to(out.device))
    if objective.kind == "cross_entropy":
        return torch.nn.functional.cross_entropy(o, t.long())
    if objective.kind == "nll":
        return torch.nn.functional.nll_loss(o, t.long())
    if objective.kind == "bce_logits":
        return torch.nn.functional.binary_cross_entropy_with_logits(o, t.float())
    if objective.kind == "bce":
        return torch.nn.functional.binary_cross_entropy(o, t.float())
    if objective.kind == "mse":
        return torch.nn.functional.mse_loss(o, t.float())
    return torch.nn.functional.l1_loss(o, t.float())


def recompute_loss(loss: float, pred: torch.Tensor, new: torch.Tensor, args: tuple,
                    kwargs: dict) -> torch.Tensor | None:
    """The model's own loss for the prediction ``new``: the standard loss of (``pred``, one of the model's tensor
    arguments, ``labels=`` first) that reproduces ``loss``, also with the one-position shift of a causal language
    model (prediction at t against the target at t + 1), evaluated on ``new``. None when none reproduces it."""
    targets = [kwargs["labels"]] if isinstance(kwargs.get("labels"), torch.Tensor) else []
    targets += [a for a in (*args, *kwargs.values())
                if isinstance(a, torch.Tensor) and all(a is not t for t in targets)]
    for y in targets:
        shifts = [(pred, new, y)]
        if pred.ndim >= 3 and y.ndim >= 2 and y.shape[1] > 1:
            shifts.append((pred[:, :-1], new[:, :-1], y[:, 1:]))
        for p, n, t in shifts:
            objective = identify_objective(loss, p, {"target": t})
            if objective is not None:
                return objective_loss(objective, n, t)
    return None
