"""Which of a model's parameters an optimizer holds, shared by the stage packages: an optimizer built over frozen
parameters only (every parameter it holds has ``requires_grad=False``) steps, but has nothing to update, while the
trainable parameters are in no optimizer. Checks that see "no gradient at optimizer.step()" name this cause when it
is what happened."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
from torch import nn

from .capture import stepping_optimizers


def _names(names: list[str], limit: int = 4) -> str:
    return ", ".join(repr(n) for n in names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass(frozen=True)
class FrozenOptimizer:
    """An optimizer whose parameters are all frozen: what it holds, and the trainable parameters it does not."""

    held: list[str]  # the parameters the optimizer (and any it wraps) holds, all requires_grad=False
    trainable: list[str]  # the model's trainable parameters, held by no optimizer
    table: pd.DataFrame  # every model parameter: requires_grad, in_optimizer

    def sentence(self) -> str:
        rest = (f"the {len(self.trainable)} trainable parameter(s) ({_names(self.trainable)}) are in no optimizer"
                if self.trainable else "the model has no trainable parameter")
        return (f"every parameter the optimizer holds ({len(self.held)}: {_names(self.held)}) has requires_grad=False, "
                f"and {rest}: optimizer.step() has nothing to update")

    @property
    def advice(self) -> str:
        return ("Build the optimizer over the parameters you train: torch.optim.AdamW([p for p in model.parameters() "
                "if p.requires_grad]) (after freezing); if the part it holds is meant to train, unfreeze it "
                "(requires_grad_(True)) instead.")

    def metrics(self) -> dict[str, Any]:
        return {"frozen_in_optimizer": len(self.held), "trainable_in_no_optimizer": len(self.trainable)}


def frozen_optimizer(model: nn.Module, optimizer: Any) -> FrozenOptimizer | None:
    """A :class:`FrozenOptimizer` when ``optimizer`` holds parameters and every one of them has
    ``requires_grad=False``; None otherwise (no optimizer, an empty one, or one holding a trainable parameter)."""
    if optimizer is None:
        return None
    held_params = {id(p): p for o in stepping_optimizers(optimizer) for g in o.param_groups for p in g["params"]}
    if not held_params or any(p.requires_grad for p in held_params.values()):
        return None
    named = list(model.named_parameters())
    held = [n for n, p in named if id(p) in held_params]
    outside = len(held_params) - len(held)
    held += [f"{outside} outside the model"] if outside else []
    trainable = [n for n, p in named if p.requires_grad]
    table = pd.DataFrame([{"parameter": n, "requires_grad": bool(p.requires_grad),
                           "in_optimizer": id(p) in held_params, "numel": int(p.numel())} for n, p in named])
    return FrozenOptimizer(held, trainable, table)
