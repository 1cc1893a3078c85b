"""``model.gradient_flow``: does the gradient reach every parameter, at a sane size, and does each one get updated?

A copy is trained for a few steps with the user's optimizer and step under a :class:`tropt.GradientMonitor`; the
record is judged by :func:`judge_gradient_flow` (which a user can also apply to their own loop via
``monitor.result()``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from ._common import fmt, names_list
from .monitor import GradientMonitor, module_of, parameter_summary

CHECK = "model.gradient_flow"


def layer_table(mon: GradientMonitor, summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per module (layer) in forward order: gradient L2 norm and RMS, mean/max |grad| (when recorded), update ratio."""
    s = parameter_summary(mon) if summary is None else summary
    data = mon.array()
    order = list(mon.module_order) + [m for m in dict.fromkeys(s["module"]) if m not in mon.module_order]
    kinds = {name: type(m).__name__ for name, m in mon.model.named_modules()}  # plots label "0" as "0 (Linear)"
    rows = []
    for module in order:
        idx = [i for i, m in enumerate(s["module"]) if m == module]
        if not idx:
            continue
        numel = float(s["numel"].iloc[idx].sum())
        g = data[:, idx, 0] if data.size else np.zeros((0, len(idx)))
        per_step = np.sqrt(np.nansum(g ** 2, axis=1)) if g.size else np.zeros(0)
        any_grad = (~np.isnan(g)).any(axis=1) if g.size else np.zeros(0, dtype=bool)
        per_step = np.where(any_grad, per_step, np.nan)
        rms = per_step / math.sqrt(numel)
        # RMS over the entries that received a gradient: an embedding table's rows outside the batch get exactly
        # zero, which would make its whole-table RMS look vanishing.
        nz = np.nansum(data[:, idx, 3], axis=1) if g.size else np.zeros(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            active = np.where(nz > 0, per_step / np.sqrt(np.maximum(nz, 1)), np.nan)
        with np.errstate(invalid="ignore"):
            rows.append({
                "layer": module,
                "type": kinds.get(module, ""),
                "params": ", ".join(s["name"].iloc[idx].str.rsplit(".", n=1).str[-1]),
                "numel": int(numel),
                "grad_norm_mean": float(np.nanmean(per_step)) if np.isfinite(per_step).any() else math.nan,
                "grad_rms_mean": float(np.nanmean(rms)) if np.isfinite(rms).any() else math.nan,
                "grad_rms_max": float(np.nanmax(rms)) if np.isfinite(rms).any() else math.nan,
                "grad_rms_active_mean": float(np.nanmean(active)) if np.isfinite(active).any() else math.nan,
                "grad_abs_mean": float(s["grad_abs_sum_mean"].iloc[idx].sum() / numel) if s["grad_abs_sum_mean"].iloc[idx].notna().any() else math.nan,
                "grad_abs_max": float(np.nanmax(s["grad_abs_max"].iloc[idx])) if s["grad_abs_max"].iloc[idx].notna().any() else math.nan,
                "update_ratio_mean": float(np.nanmean(s["update_ratio_mean"].iloc[idx])) if s["update_ratio_mean"].iloc[idx].notna().any() else math.nan,
                "zero_fraction": float(np.nanmean(s["zero_fraction"].iloc[idx])) if s["zero_fraction"].iloc[idx].notna().any() else math.nan,
            })
    return pd.DataFrame(rows, columns=["layer", "type", "params", "numel", "grad_norm_mean", "grad_rms_mean", "grad_rms_max",
                                       "grad_rms_active_mean", "grad_abs_mean", "grad_abs_max", "update_ratio_mean", "zero_fraction"])


def layer_heatmap(mon: GradientMonitor, layers: list[str]) -> np.ndarray:
    """Gradient RMS per (recorded step, layer), layers in the given order."""
    data = mon.array()
    numel = mon._numel.numpy()
    mods = [module_of(n) for n in mon.names]
    out = np.full((data.shape[0], len(layers)), np.nan)
    for j, layer in enumerate(layers):
        idx = [i for i, m in enumerate(mods) if m == layer]
        g = data[:, idx, 0]
        has = (~np.isnan(g)).any(axis=1)
        out[:, j] = np.where(has, np.sqrt(np.nansum(g ** 2, axis=1) / numel[idx].sum()), np.nan)
    return out


def judge_gradient_flow(mon: GradientMonitor, *, vanish_ratio: float = 1e-3, vanish_rms: float = 1e-5,
                        explode_norm: float = 1e3, grad_clip: float | None = None, check: str = CHECK) -> CheckResult:
    """The ``model.gradient_flow`` verdict on a monitor's record.

    FAIL for parameters that require grad but never get one (or only exact zeros), parameters that get gradients
    but are never updated (not in any optimizer param group), vanishing gradients (first-to-last layer gradient
    RMS ratio below ``vanish_ratio`` *and* first-layer RMS below ``vanish_rms``), exploding (global norm above
    ``explode_norm``) or non-finite gradients. Deliberately frozen parameters are reported, not failed.
    """
    s = parameter_summary(mon)
    layers = layer_table(mon, s)
    steps = len(mon.recorded_steps)
    gnorm = mon.global_norms()
    metrics: dict[str, Any] = {
        "recorded_steps": steps, "parameters": len(mon.names), "frozen_parameters": len(mon.frozen),
        "vanish_ratio": vanish_ratio, "vanish_rms": vanish_rms, "explode_norm": explode_norm,
    }
    if grad_clip is not None:
        metrics["grad_clip"] = grad_clip
    series: dict[str, Any] = {"global_grad_norm": gnorm}
    tables: dict[str, pd.DataFrame] = {"layers": layers}
    if steps == 0:
        return CheckResult(check, Status.FAIL if mon.names else Status.SKIP,
                           "no optimizer step was recorded: the step never called optimizer.step() on an optimizer "
                           "holding these parameters", metrics, tables,
                           ["Make the training step call optimizer.step()."], series)
    series["layer_grad_rms"] = layer_heatmap(mon, list(layers["layer"]))
    series["recorded_steps"] = np.asarray(mon.recorded_steps, dtype=float)
    metrics["global_grad_norm_max"] = float(np.nanmax(gnorm)) if np.isfinite(gnorm).any() else math.nan
    metrics["global_grad_norm_median"] = float(np.nanmedian(gnorm)) if np.isfinite(gnorm).any() else math.nan

    problems: list[dict[str, Any]] = []
    advice: list[str] = []
    reasons: list[str] = []

    no_grad = s[s["steps_with_grad"] == 0]
    zero_grad = s[(s["steps_with_grad"] > 0) & (s["zero_fraction"] >= 1.0)]
    if len(no_grad):
        for name in no_grad["name"]:
            problems.append({"name": name, "problem": "no gradient", "detail": "requires grad but .grad stayed None at every step (detached or unused)"})
        reasons.append(f"{len(no_grad)} parameter(s) never get a gradient ({names_list(no_grad['name'])})")
        advice.append("Find where these parameters leave the graph (.detach(), .item(), torch.no_grad(), an unused "
                      "branch) and reconnect them, or set requires_grad=False if they are meant to be frozen.")
    if len(zero_grad):
        for name in zero_grad["name"]:
            problems.append({"name": name, "problem": "zero gradient", "detail": "the gradient was exactly zero at every step"})
        reasons.append(f"{len(zero_grad)} parameter(s) get only exactly-zero gradients ({names_list(zero_grad['name'])})")
        advice.append("Exactly-zero gradients mean the path from these parameters to the loss is cut: look for dead "
                      "ReLUs upstream (model.activation_stats), a multiplication by zero, or a detached branch.")
    has_grad = s[(s["steps_with_grad"] > 0) & (s["zero_fraction"] < 1.0)]
    # Judged from the optimizers' param groups, not from a zero update: lr x a tiny gradient can round to no change
    # in fp32 (that is the vanishing rule's business).
    not_updated = has_grad[~has_grad["in_optimizer"] | ~has_grad["lr_nonzero"]]
    if len(not_updated):
        for _, r in not_updated.iterrows():
            detail = ("not in any optimizer param group" if not r["in_optimizer"]
                      else "its optimizer param group has learning rate 0")
            problems.append({"name": r["name"], "problem": "never updated", "detail": detail})
        outside = not_updated[~not_updated["in_optimizer"]]
        reasons.append(f"{len(not_updated)} parameter(s) get gradients but are never updated"
                       + (f" (not in any optimizer param group: {names_list(outside['name'])})" if len(outside) else
                          f" (learning rate 0: {names_list(not_updated['name'])})"))
        advice.append("Build the optimizer from model.parameters() (or include every group, each with a non-zero "
                      "learning rate), e.g. lambda m: torch.optim.AdamW(m.parameters(), lr=...).")
    nonfinite = s[s["nonfinite_steps"] > 0]
    if len(nonfinite):
        for _, r in nonfinite.iterrows():
            problems.append({"name": r["name"], "problem": "non-finite gradient",
                             "detail": f"{int(r['nonfinite_steps'])} step(s), up to {int(r['nonfinite_max'])} entries"})
        first = int(np.argmax(~np.isfinite(gnorm))) if (~np.isfinite(gnorm)).any() else 0
        reasons.append(f"non-finite gradients in {len(nonfinite)} parameter(s) from step {mon.recorded_steps[first]} "
                       f"({names_list(nonfinite['name'])})")
        advice.append("Lower the learning rate, clip gradients (grad_clip=1.0) and check the loss for log(0) or "
                      "division by zero.")
    finite = gnorm[np.isfinite(gnorm)]
    if finite.size and finite.max() > explode_norm:
        big = layers.sort_values("grad_norm_mean", ascending=False).head(3)
        for _, r in big.iterrows():
            problems.append({"name": r["layer"], "problem": "exploding gradient",
                             "detail": f"mean gradient norm {fmt(r['grad_norm_mean'])}"})
        reasons.append(f"exploding gradients: global norm up to {fmt(float(finite.max()))} > {fmt(explode_norm)}")
        advice.append("Lower the learning rate or the initial weight scale, add normalisation, or clip gradients "
                      "(grad_clip=1.0).")
    rms_col = "grad_rms_active_mean"  # over entries that got a gradient (see layer_table)
    live = layers[np.isfinite(layers[rms_col]) & (layers[rms_col] > 0)]
    if len(live) >= 2:
        first_l, last_l = live.iloc[0], live.iloc[-1]
        ratio = first_l[rms_col] / last_l[rms_col]
        metrics.update(first_layer=first_l["layer"], last_layer=last_l["layer"], first_to_last_ratio=float(ratio),
                       first_layer_grad_rms=float(first_l[rms_col]))
        if ratio < vanish_ratio and first_l[rms_col] < vanish_rms:
            small = live[live[rms_col] < vanish_rms]
            for _, r in small.iterrows():
                problems.append({"name": r["layer"], "problem": "vanishing gradient",
                                 "detail": f"gradient RMS {fmt(r[rms_col])} vs {fmt(last_l[rms_col])} at {last_l['layer']}"})
            reasons.append(f"vanishing gradients: the first layer {first_l['layer']} gets {fmt(ratio)}x the gradient of "
                           f"the last ({last_l['layer']}), RMS {fmt(first_l[rms_col])}")
            advice.append("Use ReLU/GELU instead of sigmoid/tanh in deep stacks, add residual connections or "
                          "normalisation layers, and use a fan-in aware init (kaiming/xavier).")
    if problems:
        tables["problems"] = pd.DataFrame(problems, columns=["name", "problem", "detail"])
    if mon.frozen:
        tables["frozen"] = pd.DataFrame({"name": mon.frozen, "module": [module_of(n) for n in mon.frozen]})
    tables["parameters"] = s
    frozen_note = f"; {len(mon.frozen)} parameter(s) frozen on purpose (requires_grad=False)" if mon.frozen else ""
    if reasons:
        return CheckResult(check, Status.FAIL, "; ".join(reasons) + frozen_note, metrics, tables, advice, series)
    return CheckResult(
        check, Status.PASS,
        f"gradients reach all {len(mon.names)} trainable parameters and every one is updated over {steps} steps "
        f"(global norm median {fmt(metrics['global_grad_norm_median'])})" + frozen_note,
        metrics, tables, [], series)


class _HandUpdates:
    """Records a step that updates parameters by hand (no optimizer step) into a GradientMonitor.

    The gradients are the last ones each parameter accumulated in the call (kept by reference through
    ``register_post_accumulate_grad_hook``, so a step that sets ``.grad`` to None after its update is still seen);
    a parameter that moved counts as updated (in an optimizer with a non-zero learning rate, for the verdict).
    """

    def __init__(self, model: Any) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.last: dict[int, Any] = {}
        self.values: list | None = None
        self.handles: list = []
        self.recorded = 0  # hand-written updates recorded

    def __enter__(self) -> "_HandUpdates":
        for i, p in enumerate(self.params):
            self.handles.append(p.register_post_accumulate_grad_hook(lambda t, i=i: self.last.__setitem__(i, t.grad)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()

    def before(self, watch: bool) -> None:
        self.last.clear()
        self.values = [p.detach().clone() for p in self.params] if watch else None

    def record(self, mon: GradientMonitor) -> None:
        if self.values is None:
            return
        moved = [i for i, (p, v) in enumerate(zip(self.params, self.values)) if p.shape != v.shape or not torch.equal(p.detach(), v)]
        if not moved:
            return
        missing = [i for i, p in enumerate(self.params) if p.grad is None and self.last.get(i) is not None]
        for i in missing:
            self.params[i].grad = self.last[i]
        try:
            mon.record()
            self.recorded += 1
        finally:
            for i in missing:
                self.params[i].grad = None
        index = {id(p): j for j, p in enumerate(mon._params)}
        rows = [index[id(self.params[i])] for i in moved if id(self.params[i]) in index]
        mon.in_optimizer[rows] = True
        mon.lr_nonzero[rows] = True


@register(CHECK, title="Gradient flow",
          description="Train a copy for a few steps under GradientMonitor: missing, unused, vanishing or exploding gradients.")
def check_gradient_flow(setup: Any, *, steps: int = 20, vanish_ratio: float = 1e-3, vanish_rms: float = 1e-5,
                        explode_norm: float = 1e3, seed: int | None = None, progress: bool = True,
                        callback: Any = None) -> CheckResult:
    """Train a copy for ``steps`` optimizer steps with the user's step and judge its gradients.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`.
    steps
        Optimizer steps to record (each uses ``accumulation_steps`` micro-batches of one batch).
    vanish_ratio, vanish_rms
        Vanishing when the first layer's gradient RMS is below ``vanish_ratio`` x the last layer's and below
        ``vanish_rms`` in absolute terms (AUTOTRAINER's rule, both configurable).
    explode_norm
        Exploding when the global gradient norm (as the optimizer sees it, after any clipping) exceeds this.
    seed
        Seed of the copy (the Setup's seed when None).
    progress
        Show a progress bar.
    callback
        Optional ``callback({"check", "step", "total", "monitor"})`` after each step (live displays); raising
        :class:`tropt.errors.Cancelled` in it stops the run.
    """
    from tqdm.auto import tqdm

    setup.validate()
    with preserved(setup.model):
        ctx = setup.build(seed=setup.seed if seed is None else seed)
        k = setup.accumulation_steps
        with GradientMonitor(ctx.model, optimizer=ctx.optimizer, full_every=1, detail=True, capacity=steps) as mon, \
                _HandUpdates(ctx.model) as hand:
            stepped = False  # an optimizer step was seen: from then on no parameter copies are needed
            for i, batch in enumerate(tqdm(setup.batches(steps), total=steps, desc="gradient flow", disable=not progress, leave=False)):
                seen = mon.steps_seen
                hand.before(watch=ctx.optimizer is None or not stepped)
                setup.run_step(ctx, setup.split(batch, k) if k > 1 else [batch])
                stepped |= mon.steps_seen > seen
                if mon.steps_seen == seen:  # no optimizer step: a hand-written update, recorded from the parameters
                    hand.record(mon)
                if callback is not None:
                    callback({"check": CHECK, "step": i + 1, "total": steps, "monitor": mon})
    result = judge_gradient_flow(mon, vanish_ratio=vanish_ratio, vanish_rms=vanish_rms, explode_norm=explode_norm,
                                 grad_clip=setup.grad_clip)
    result.metrics["observed_at"] = "parameter change" if hand.recorded else "optimizer.step"
    return result
