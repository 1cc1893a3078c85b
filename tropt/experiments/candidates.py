"""Candidates: names mapped to overrides of Setup keywords, validated before anything runs and applied per run."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import SetupError, TroptError

if TYPE_CHECKING:
    from ..setup import Setup

BASELINE = "baseline"
# What a candidate may change: the training recipe. Everything else is the yardstick every run shares.
OVERRIDABLE = ("optimizer", "scheduler", "accumulation_steps", "grad_clip", "precision", "use_scaler", "step",
               "train_data", "batch_size", "model", "lr")
# Setup keywords a candidate must not change, and why.
FIXED = {
    "val_data": "it is the selection split every candidate is judged on",
    "metric": "it is the yardstick every candidate is judged by (pass compare(metric=...) to change it for all)",
    "loss_fn": "the default metric is the validation loss through loss_fn, so it is the yardstick",
    "seed": "seeds are compare(seeds=...), the same for every candidate",
    "device": "every run uses the Setup's device, so times are comparable",
    "num_classes": "it describes the task, not the recipe",
    "save_state": "it describes the loop, not the recipe", "load_state": "it describes the loop, not the recipe",
    "eval_augmentation": "it describes the evaluation, the same for every run",
    "distributed": "it describes the loop, not the recipe",
}


class ScaledLR:
    """An optimizer factory whose param groups' learning rates are rescaled so the first group's is ``lr``.

    Group ratios are kept (a head at 10× the backbone stays at 10×): ``lr=`` scales every group by one factor.
    A module-level class (not a closure) so it pickles with any executor.
    """

    def __init__(self, factory: Callable[[nn.Module], torch.optim.Optimizer], lr: float) -> None:
        self.factory, self.lr = factory, lr
        self.__qualname__ = f"{getattr(factory, '__qualname__', type(factory).__name__)} with lr={lr:g}"

    def __call__(self, model: nn.Module) -> torch.optim.Optimizer:
        opt = self.factory(model)
        groups = getattr(opt, "param_groups", None)
        if not groups or not isinstance(groups[0].get("lr"), (int, float, torch.Tensor)) or float(groups[0]["lr"]) <= 0:
            raise SetupError("lr= override: the optimizer's first param group has no positive learning rate to scale",
                             "give the candidate its own optimizer factory instead of lr=")
        factor = self.lr / float(groups[0]["lr"])
        for g in groups:
            g["lr"] = g["lr"] * factor
        return opt


def validate_candidates(candidates: Any) -> dict[str, dict[str, Any]]:
    """Check names and keywords of ``candidates``; returns a plain dict (never the user's mapping)."""
    fix = ("pass candidates={'adam': {'optimizer': lambda m: torch.optim.Adam(m.parameters(), lr=1e-3)}, "
           "'lr_x3': {'lr': 0.3}}")
    if not isinstance(candidates, Mapping):
        raise TroptError(f"compare: candidates is a {type(candidates).__name__}, expected a dict of name -> "
                         "overrides", fix)
    if not candidates:
        raise TroptError("compare: the candidate set is empty, so there is nothing to compare the baseline with "
                         "(the baseline, the Setup itself, is always run)", fix)
    out: dict[str, dict[str, Any]] = {}
    for name, overrides in candidates.items():
        if not isinstance(name, str) or not name.strip():
            raise TroptError(f"compare: candidate name {name!r} is not a non-empty string", fix)
        if name == BASELINE:
            raise TroptError(f"compare: a candidate is named {BASELINE!r}, the name of the Setup's own run",
                             "rename the candidate (the baseline is always run)")
        if not isinstance(overrides, Mapping):
            raise TroptError(f"compare: candidate {name!r} is a {type(overrides).__name__}, expected a dict of "
                             "Setup keywords", fix)
        for key in overrides:
            if key in FIXED:
                raise TroptError(f"compare: candidate {name!r} overrides {key!r}, which every run must share: "
                                 f"{FIXED[key]}",
                                 f"remove {key!r} from the candidate")
            if key not in OVERRIDABLE:
                close = difflib.get_close_matches(str(key), OVERRIDABLE, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise TroptError(f"compare: candidate {name!r} has an unknown Setup keyword {key!r}",
                                 f"{hint}a candidate may override {', '.join(OVERRIDABLE)}")
        lr = overrides.get("lr")
        if "lr" in overrides and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr)
                                  or lr <= 0):
            raise TroptError(f"compare: candidate {name!r} has lr={lr!r}; it must be a positive number",
                             "e.g. {'lr': 3e-4}")
        model = overrides.get("model")
        if "model" in overrides and not (isinstance(model, nn.Module) or callable(model)):
            raise TroptError(f"compare: candidate {name!r} has model={type(model).__name__}; expected an nn.Module "
                             "or a factory",
                             "pass model=lambda: MyNet(width=256) (called with the run's seed set) or a module")
        out[name] = dict(overrides)
    return out


def candidate_setup(setup: Setup, name: str,
                    overrides: Mapping[str, Any]) -> tuple[Any, Callable[[], nn.Module] | None]:
    """The Setup of one candidate (Setup keywords applied, validated) and its model factory, if it has one.

    A bad value (e.g. ``accumulation_steps=0``) raises here, before any run, naming the candidate.
    """
    changes = {k: v for k, v in overrides.items() if k not in ("lr", "model")}
    factory = None
    if "model" in overrides:
        if isinstance(overrides["model"], nn.Module):
            changes["model"] = overrides["model"]
        else:
            factory = overrides["model"]
    if "lr" in overrides:
        changes["optimizer"] = ScaledLR(changes.get("optimizer", setup.optimizer), float(overrides["lr"]))
    try:
        return setup.replace(**changes), factory
    except TroptError as exc:
        raise type(exc)(f"compare: candidate {name!r}: {exc.message}", exc.fix) from None


def describe_overrides(overrides: Mapping[str, Any]) -> dict[str, str]:
    """The overrides as short strings (for tables, JSON and MLflow params)."""
    out = {}
    for key, value in overrides.items():
        if isinstance(value, (int, float, str, bool)) or value is None:
            out[key] = str(value)
        elif isinstance(value, nn.Module):
            out[key] = type(value).__name__
        elif callable(value):
            out[key] = getattr(value, "__qualname__", None) or type(value).__name__
        elif isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
            out[key] = f"{type(value).__name__} of {len(value)}"
        else:
            out[key] = type(value).__name__
    return out


def lr_candidates(setup: Setup, factors: tuple[float, ...] = (0.3, 3.0)) -> dict[str, dict[str, Any]]:
    """Candidates that scale the Setup's learning rate (first param group) by each factor: ``{"lr_x3": {"lr": ...}}``.

    The base LR is read from an optimizer built on a copy of the model (the user's model is not touched).
    """
    from ..snapshot import preserved

    with preserved():
        ctx = setup.build()
    lr = float(ctx.optimizer.param_groups[0]["lr"])
    return {f"lr_x{f:g}": {"lr": lr * f} for f in factors}
