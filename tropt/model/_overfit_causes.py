"""Named causes of a stall in ``model.overfit_batch``: outputs bounded before a loss that expects logits, and
spectrally normalised layers that bound the logits' scale (and the WARN that names them)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from torch import nn

from ..result import CheckResult, Status
from ._common import acc_text, fmt


def bounded_output_cause(out: torch.Tensor | None, objective: Any, squashes: bool = True) -> str | None:
    """A specific reason when the outputs are probabilities fed to a loss that expects logits.

    Rows that sum to 1 are softmax outputs whatever the model; outputs merely inside [0, 1] are blamed on a squashing
    layer only when the model has one (``squashes``): small logits of a model that has not learned look the same."""
    if out is None or objective is None:
        return None
    o = out.float()
    in_unit = bool(((o >= 0) & (o <= 1)).all())
    if objective.kind == "cross_entropy" and in_unit and o.ndim >= 2:
        sums = o.sum(-1) if objective.layout == 0 else o.sum(1)
        if torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            return ("the model's outputs are probabilities (each row sums to 1) but the loss is cross entropy, "
                    "which applies log_softmax itself: softmax is applied twice, bounding the logits to [0, 1]")
        if not squashes:
            return None
        return ("the model's outputs all lie in [0, 1] but the loss is cross entropy, which expects unbounded "
                "logits: a sigmoid/softmax before the loss bounds them")
    if objective.kind == "bce_logits" and in_unit and squashes:
        return ("the model's outputs all lie in [0, 1] but the loss is binary cross entropy *with logits*, which "
                "applies the sigmoid itself: the sigmoid is applied twice")
    return None


def spectral_norm_layers(model: nn.Module) -> list[tuple[str, str]]:
    """(module, kind) of each spectrally normalised module: ``torch.nn.utils.spectral_norm``'s hook (``weight_orig``
    and a ``SpectralNorm`` forward pre-hook) or ``torch.nn.utils.parametrizations.spectral_norm``'s parametrization
    (a ``_SpectralNorm`` in the module's parametrizations). Weight norm is not one: its gain is free."""
    from torch.nn.utils import parametrize
    from torch.nn.utils.spectral_norm import SpectralNorm

    found = []
    for name, module in model.named_modules():
        hooks = getattr(module, "_forward_pre_hooks", {}).values()
        if hasattr(module, "weight_orig") and any(isinstance(h, SpectralNorm) for h in hooks):
            found.append((name or "(model)", "torch.nn.utils.spectral_norm"))
        elif parametrize.is_parametrized(module) and any(
                type(p).__name__ == "_SpectralNorm" for plist in module.parametrizations.values() for p in plist):
            found.append((name or "(model)", "torch.nn.utils.parametrizations.spectral_norm"))
    return found


def spectral_floor(c: Any) -> CheckResult:
    """WARN: a stall of a model whose spectrally normalised layers bound the logits' scale, so the loss's floor
    (``c`` is overfit_batch's case)."""
    names = [name for name, _ in c.spectral]
    c.metrics["spectral_norm_layers"] = len(names)
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    summary = (f"the loss stalls at a floor of {fmt(c.final)} ({c.final / c.start:.0%} of its start) before memorising "
               f"{c.n} samples" + (f" (train accuracy {acc_text(c.acc)})" if c.acc is not None else "")
               + f"; the model has {len(names)} spectrally normalised layer(s) ({shown}): spectral normalisation "
               "bounds the logits' scale, so the loss has a floor: the floor is expected; judge memorisation by train "
               "accuracy or raise the logit scale/temperature")
    advice = [*c.scale_notes, "Judge memorisation by train accuracy (metrics['final_accuracy']), or raise the logit "
              "scale/temperature (multiply the logits by a constant) and rerun to see the loss fall further."]
    table = pd.DataFrame({"layer": names, "normalisation": [kind for _, kind in c.spectral]})
    return CheckResult("model.overfit_batch", Status.WARN, summary, c.metrics, {**c.tables, "spectral_norm": table},
                       advice, c.series)
