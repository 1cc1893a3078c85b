"""``Metric``: how a validation score is computed and which direction is better.

One object serves stage 2 (``model.eval_metric`` asks whether the metric represents the task) and stage 7
(``tropt.compare`` selects candidates by it), so both judge by the same number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import StepError, TroptError


@dataclass(frozen=True)
class Metric:
    """A validation metric ``fn(model, val_data) -> float`` and its direction.

    Parameters
    ----------
    fn
        Called as ``fn(model, val_data)`` with the model in eval mode under ``torch.no_grad()`` by tropt; returns a
        finite number (a Python number, a NumPy scalar or a one-element tensor).
    higher_is_better
        True for accuracy-like scores, False for losses and errors.
    name
        Shown in tables and plots; defaults to the function's name.
    """

    fn: Callable[[nn.Module, Any], Any]
    higher_is_better: bool = True
    name: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TroptError(f"Metric: fn is a {type(self.fn).__name__}, not callable",
                             "pass a function fn(model, val_data) -> float, e.g. "
                             "tropt.Metric(accuracy, higher_is_better=True)")
        if not isinstance(self.higher_is_better, bool):
            raise TroptError(f"Metric: higher_is_better={self.higher_is_better!r}; it must be True or False",
                             "True for accuracy-like scores, False for losses and errors")
        if self.name is None:
            object.__setattr__(self, "name", getattr(self.fn, "__name__", None) or type(self.fn).__name__)

    def __call__(self, model: nn.Module, data: Any) -> float:
        """Evaluate and validate: a finite float, or a :class:`StepError` saying what came back and how to fix it."""
        try:
            value = self.fn(model, data)
        except TroptError:
            raise
        except Exception as exc:
            raise StepError(f"the metric {self.name} raised {type(exc).__name__}: {exc}",
                            "fix the metric; tropt calls it as fn(model, val_data)") from exc
        return as_score(value, self.name or "metric")

    def better(self, a: float, b: float) -> bool:
        """Whether score ``a`` is strictly better than ``b`` in this metric's direction."""
        return a > b if self.higher_is_better else a < b


def as_score(value: Any, name: str = "metric") -> float:
    """A metric's return value as a finite float, or a StepError naming what it was."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise StepError(f"the metric {name} returned a tensor of shape {tuple(value.shape)}, expected one number",
                            "reduce it to a scalar (e.g. .mean()) and return .item()")
        value = value.item()
    if isinstance(value, bool) or (not isinstance(value, (int, float)) and not hasattr(value, "__float__")):
        raise StepError(f"the metric {name} returned a {type(value).__name__} ({value!r:.60}), expected a number",
                        "return a float, e.g. accuracy as correct / total")
    out = float(value)
    if not math.isfinite(out):
        raise StepError(f"the metric {name} returned {out}, not a finite number",
                        "check the metric for division by zero (an empty split) or NaN predictions")
    return out
