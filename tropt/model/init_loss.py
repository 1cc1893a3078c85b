"""``model.init_loss``: is the loss at initialisation what the objective implies? (Karpathy: "verify loss @ init")

A freshly initialised classifier should be maximally unsure: cross entropy near ln C, binary cross entropy near
ln 2; a regressor predicting roughly the mean has MSE near the label variance. A loss far above that means the
output layer is badly scaled (confidently wrong logits) or its bias is far from the target's offset, and the first
steps are spent undoing the initialisation (the "hockey stick" loss curve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ..core.batch import get_leaf
from ..core.objective import class_layouts, probe
from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from ._common import fmt, input_paths, input_scale
from .composition import LossFinding, loss_findings

if TYPE_CHECKING:
    from ..setup import Setup

CHECK = "model.init_loss"


def _expected(kind: str, num_classes: int | None, targets: torch.Tensor) -> tuple[float, str]:
    if kind in ("cross_entropy", "nll"):
        assert num_classes is not None  # identify_objective gives these kinds their class count
        return math.log(num_classes), f"ln C = ln {num_classes}"
    if kind in ("bce_logits", "bce"):
        return math.log(2.0), "ln 2"
    y = targets.double().reshape(-1)
    if kind == "mse":
        return float(y.var(unbiased=False)), "the label variance"
    return float((y - y.median()).abs().mean()), "the mean absolute deviation from the label median"


@dataclass
class _Probed:
    """What ``loss_fn`` gave at initialisation: per-batch losses, and from the first batch the objective, the
    leaf call order, the output, the input paths and any loss-composition findings."""

    losses: list[float] = field(default_factory=list)
    objective: Any = None
    outputs: list[torch.Tensor] = field(default_factory=list)
    targets: list[torch.Tensor] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    out0: torch.Tensor | None = None
    first_batch: Any = None
    find_inputs: Any = None  # () -> the batch paths the model reads: run only for a loss too high (its advice)
    findings: list[LossFinding] = field(default_factory=list)


def _probe_batches(setup: Setup, n_batches: int) -> _Probed:
    """Run ``loss_fn`` on ``n_batches`` batches of a fresh copy (train mode, no gradients)."""
    got = _Probed()
    with preserved(setup.model):
        ctx = setup.build()
        model = ctx.model
        model.train()
        for i, batch in enumerate(setup.batches(max(1, n_batches))):
            value, out, obj, order = probe(setup, model, batch, ctx)
            if i == 0:
                got.objective, got.calls, got.out0, got.first_batch = obj, order, out, batch
                got.find_inputs = _input_finder(setup, model, batch, ctx)
                got.findings = loss_findings(setup, model, batch, ctx)
            got.losses.append(value)
            if got.objective is not None and out is not None:
                got.outputs.append(out.float().cpu())
                got.targets.append(_target(batch, got.objective))
    return got


def _input_finder(setup: Setup, model: Any, batch: Any, ctx: Any) -> Any:
    """A call that finds which batch tensors the model reads (one forward per tensor, on the copy at init), made
    only when the input-scale advice needs it: a loss at init close to chance level never pays for it."""
    def find() -> set:
        with preserved(setup.model):  # its seeded forwards must leave the caller's RNG as it was
            return input_paths(setup, model, batch, ctx)
    return find


def _class_priors(objective: Any, y: torch.Tensor, metrics: dict, tables: dict) -> np.ndarray | None:
    """The training batches' class priors, for a cross-entropy/NLL objective (None otherwise)."""
    if objective.kind not in ("cross_entropy", "nll"):
        return None
    counts = np.bincount(y[y >= 0].long().numpy(), minlength=objective.num_classes).astype(float)
    priors = counts / max(counts.sum(), 1.0)
    with np.errstate(divide="ignore"):
        metrics["prior_entropy"] = float(-(priors[priors > 0] * np.log(priors[priors > 0])).sum())
    tables["class_priors"] = pd.DataFrame({"class": np.arange(len(priors)), "prior": priors,
                                           "log_prior": np.log(np.maximum(priors, 1e-12))})
    return priors


def _bias_advice(objective: Any, layer: str, y: torch.Tensor, priors: np.ndarray | None) -> list[str]:
    """How to initialise the last layer so the loss starts at the objective's chance level."""
    if not objective.is_classification:
        mean = float(y.float().mean()) if y.numel() else 0.0
        return [f"Set the bias of {layer} to the label mean ({fmt(mean)}) and scale down its weights, or "
                "standardise the targets."]
    advice = [f"Scale down the weights of {layer} at initialisation (e.g. multiply them by 0.01) so the "
              "initial outputs are near zero."]
    if priors is not None:
        shown = ", ".join(f"{v:.3g}" for v in np.log(np.maximum(priors, 1e-12))[:10])
        advice.append(f"Set the bias of {layer} to the log class priors "
                      f"([{shown}{', ...' if len(priors) > 10 else ''}]).")
    else:
        pos = float(y.float().mean()) if y.numel() else 0.5
        pos = min(max(pos, 1e-6), 1 - 1e-6)
        advice.append(f"Set the bias of {layer} to the log-odds of the positive rate "
                      f"(log({pos:.3g}/{1 - pos:.3g}) = {math.log(pos / (1 - pos)):.3g}).")
    return advice


def _too_high(got: _Probed, y: torch.Tensor, out_all: torch.Tensor | None, measured: float, expected: float,
              basis: str, ratio: float, metrics: dict, tables: dict, priors: np.ndarray | None) -> tuple[str, list]:
    """(summary, advice) for a loss at initialisation well above the objective's chance level."""
    objective, last = got.objective, metrics.get("last_layer")
    layer = f"the last layer ({last})" if last else "the last layer"
    cause = f"{layer} starts confidently wrong"
    if not objective.is_classification and out_all is not None and y.numel():
        # A fresh regressor outputs about 0: with a target far from zero mean the loss is mostly that offset.
        offset = float(y.float().mean()) - float(out_all.mean())
        share = offset ** 2 / measured if objective.kind == "mse" else abs(offset) / measured
        metrics.update(target_mean=float(y.float().mean()), target_std=float(y.float().std()), offset_share=share)
        if share > 0.5:
            cause = (f"the target's mean ({fmt(metrics['target_mean'])}) is far from the initial outputs "
                     f"({fmt(float(out_all.mean()))}); that offset is {share:.0%} of the loss")
    summary = (f"loss at initialisation is {fmt(measured)}, {fmt(ratio)}x the {fmt(expected)} ({basis}) that "
               f"{objective.name} implies: {cause}")
    advice: list[str] = []
    scale_table, scale_notes = input_scale(got.first_batch, got.find_inputs() if got.find_inputs else set())
    if scale_notes:
        advice.extend(scale_notes)
        tables["input_scale"] = scale_table
    advice.extend(_bias_advice(objective, layer, y, priors))
    if out_all is not None:
        tables["output"] = pd.DataFrame([{"layer": last, "output_mean": float(out_all.mean()),
                                          "output_std": float(out_all.std()),
                                          "output_abs_max": float(out_all.abs().max())}])
    return summary, advice


@register(CHECK, title="Loss at initialisation",
          description="Mean loss at init vs what the objective implies (ln C, ln 2, label variance).",
          budgets={'quick': {'n_batches': 2}, 'thorough': {'n_batches': 8}},
          plot="tropt.plots.model")
def check_init_loss(setup: Setup, *, n_batches: int = 4, warn_ratio: float = 1.5, fail_ratio: float = 3.0,
                    progress: bool = True) -> CheckResult:
    """Compare the mean loss over ``n_batches`` at initialisation with the objective's chance level.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`.
    n_batches
        Batches averaged (train mode, no gradients).
    warn_ratio, fail_ratio
        WARN when the loss is above ``warn_ratio`` x the expected value, FAIL above ``fail_ratio`` x.
    progress
        Unused (the check is quick); accepted for uniformity.

    The objective is identified by recomputing the standard losses on the model's output (see
    :func:`tropt.core.objective.identify_objective`); SKIP when none reproduces the user's loss.
    """
    setup.validate()
    got = _probe_batches(setup, n_batches)
    objective = got.objective
    measured = float(np.mean(got.losses))
    per_batch = pd.DataFrame({"batch": np.arange(len(got.losses)), "loss": got.losses})
    last = got.calls[-1] if got.calls else None
    if not math.isfinite(measured):
        return CheckResult(CHECK, Status.FAIL, f"the loss at initialisation is not finite ({measured})",
                           {"init_loss": measured}, {"batches": per_batch},
                           ["Check the inputs for NaN/inf and the loss for log(0) or a division by zero."])
    if got.findings:
        return _composition_result(got.findings, measured, per_batch, objective)
    if objective is None:
        return CheckResult(
            CHECK, Status.SKIP,
            f"could not infer the objective: the loss {fmt(measured)} is not cross entropy, NLL, binary cross "
            "entropy, MSE or L1 of the model's output against a tensor of the batch (custom or reduced-by-sum loss)",
            {"init_loss": measured, "model_output_captured": got.out0 is not None}, {"batches": per_batch})
    y = torch.cat([t.reshape(-1) for t in got.targets]) if got.targets else torch.zeros(0)
    width = _output_classes(got.out0, got.first_batch, objective)
    expected, basis = _expected(objective.kind, objective.num_classes, y)
    ratio = measured / expected if expected > 0 else math.inf
    metrics: dict[str, Any] = {
        "objective": objective.kind, "init_loss": measured, "expected_loss": expected, "ratio": ratio,
        "expected_basis": basis, "warn_ratio": warn_ratio, "fail_ratio": fail_ratio,
    }
    if objective.num_classes is not None and objective.kind in ("cross_entropy", "nll"):
        metrics["num_classes"] = objective.num_classes
    tables = {"batches": per_batch}
    # Flat: only the outputs' mean, std and largest magnitude are read, and batches padded to their own longest
    # sequence (dynamic padding: token classification, MLM) give outputs of different widths per sample.
    out_all = torch.cat([o.detach().reshape(-1) for o in got.outputs]) if got.outputs else None
    if out_all is not None:
        metrics["output_std"] = float(out_all.std())
        metrics["output_abs_max"] = float(out_all.abs().max())
    if last is not None:
        metrics["last_layer"] = last
    priors = _class_priors(objective, y, metrics, tables)
    advice: list[str] = []
    if ratio > warn_ratio:
        status = Status.FAIL if ratio > fail_ratio else Status.WARN
        summary, advice = _too_high(got, y, out_all, measured, expected, basis, ratio, metrics, tables, priors)
    else:
        status = Status.PASS
        summary = (f"loss at initialisation {fmt(measured)} is close to the {fmt(expected)} ({basis}) that "
                   f"{objective.name} implies")
        if ratio < 0.5:
            summary += " (well below it: a pretrained model, or a target that leaks into the inputs)"
    if setup.num_classes is not None and width is not None and width != setup.num_classes:
        # The chance level above used num_classes; the model disagrees about how many classes there are.
        metrics["output_classes"] = width
        status = status if status.rank >= Status.WARN.rank else Status.WARN
        summary = (f"the model outputs {width} class scores but the Setup says num_classes={setup.num_classes}; "
                   + summary)
        advice.insert(0, f"Make num_classes match the model's output width ({width}), or fix the output layer.")
    return CheckResult(CHECK, status, summary, metrics, tables, advice)


def _composition_result(findings: list[LossFinding], measured: float, per_batch: pd.DataFrame,
                        objective: Any) -> CheckResult:
    """FAIL naming how ``loss_fn`` composes the output with the loss wrongly (its value at init is then meaningless)."""
    metrics: dict[str, Any] = {"init_loss": measured, "composition": ", ".join(f.kind for f in findings)}
    if objective is not None:
        metrics["objective"] = objective.kind
    for f in findings:
        metrics.update({f"{f.kind}_{k}": v for k, v in f.metrics.items()})
        if f.line:
            metrics[f"{f.kind}_line"] = f.line
    table = pd.DataFrame([{"defect": f.kind, "where": f.where, "line": f.line or "", "finding": f.summary}
                          for f in findings])
    return CheckResult(CHECK, Status.FAIL, "; ".join(f.summary for f in findings), metrics,
                       {"composition": table, "batches": per_batch}, [f.advice for f in findings])


def _output_classes(out: torch.Tensor | None, batch: Any, objective: Any) -> int | None:
    """The number of class scores the model outputs for a cross-entropy/NLL objective (None otherwise)."""
    if out is None or objective is None or objective.kind not in ("cross_entropy", "nll"):
        return None
    layouts = class_layouts(out, get_leaf(batch, objective.target_path).to(out.device))
    return layouts[objective.layout][2] if objective.layout < len(layouts) else None


def _target(batch: Any, objective: Any) -> torch.Tensor:
    return get_leaf(batch, objective.target_path).detach().cpu()
