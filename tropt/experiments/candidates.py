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
        base = changes.get("optimizer", setup.optimizer)
        if base is None:
            raise SetupError(f"compare: candidate {name!r} sets lr=, but the Setup has no optimizer to scale (a "
                             "hand-written update)", "give the candidate its own step, or an optimizer factory")
        changes["optimizer"] = ScaledLR(base, float(overrides["lr"]))
    try:
        return setup.replace(**changes), factory
    except TroptError as exc:
        raise type(exc)(f"compare: candidate {name!r}: {exc.message}", exc.fix) from None


def readable_callable(fn: Any) -> str:
    """A function's name a person can read: its qualname, or for a lambda or a nested function its name and where
    it is defined (never "make_candidates.<locals>.<lambda>")."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if "<" not in name:
        return name
    code = getattr(fn, "__code__", None)
    short = name.rsplit(".", 1)[-1]
    if code is None:
        return short
    import os

    return f"{short} at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _optimizer_text(opt: Any) -> str:
    """An optimizer by class and the hyperparameters of its first param group that differ from the class's
    defaults (the learning rate always): "SGD(lr=0.05, momentum=0.9)"."""
    import inspect

    group = opt.param_groups[0] if getattr(opt, "param_groups", None) else {}
    try:
        defaults = {k: p.default for k, p in inspect.signature(type(opt).__init__).parameters.items()}
    except (TypeError, ValueError):
        defaults = {}
    parts = []
    for k, v in group.items():
        if k == "params" or not isinstance(v, (int, float, bool, tuple, torch.Tensor)) or v is None:
            continue
        v = float(v) if isinstance(v, torch.Tensor) and v.numel() == 1 else v
        if k == "lr" or (k in defaults and defaults[k] != v):
            parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    return f"{type(opt).__name__}({', '.join(parts)})"


def _describe(key: str, value: Any, setup: Setup | None) -> str:
    if isinstance(value, (int, float, str, bool)) or value is None:
        return str(value)
    if isinstance(value, nn.Module):
        return f"{type(value).__name__} ({sum(p.numel() for p in value.parameters())} parameters)"
    if key == "optimizer" and callable(value) and setup is not None:
        from ..snapshot import preserved

        try:
            with preserved():
                return _optimizer_text(setup.replace(optimizer=value).build().optimizer)
        except Exception:  # noqa: BLE001 - the run reports a factory that fails; here its name is enough
            pass
    if isinstance(value, torch.utils.data.DataLoader):
        from torch.utils.data import RandomSampler

        return (f"DataLoader(batch_size={value.batch_size}, shuffle={isinstance(value.sampler, RandomSampler)}, "
                f"num_workers={value.num_workers})")
    if callable(value):
        return ("model factory " if key == "model" else "") + readable_callable(value)
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def describe_overrides(overrides: Mapping[str, Any], setup: Setup | None = None) -> dict[str, str]:
    """The overrides as short strings a person can read (for tables, the plan, JSON and MLflow params): numbers as
    they are, an optimizer factory as the optimizer it builds on a copy of ``setup``'s model ("SGD(lr=0.05,
    momentum=0.9)"), a DataLoader by its batch size and shuffling, a function by its name (a lambda by where it is
    defined)."""
    return {key: _describe(key, value, setup) for key, value in overrides.items()}


def lr_candidates(setup: Setup, factors: tuple[float, ...] = (0.3, 3.0)) -> dict[str, dict[str, Any]]:
    """Candidates that scale the Setup's learning rate (first param group) by each factor: ``{"lr_x3": {"lr": ...}}``.

    The base LR is read from an optimizer built on a copy of the model (the user's model is not touched).
    """
    from ..snapshot import preserved

    with preserved():
        ctx = setup.build()
    if ctx.optimizer is None:
        raise SetupError("lr_candidates: the Setup has no optimizer (a hand-written update), so it has no learning "
                         "rate to scale", "pass candidates of your own to compare")
    lr = float(ctx.optimizer.param_groups[0]["lr"])
    return {f"lr_x{f:g}": {"lr": lr * f} for f in factors}
