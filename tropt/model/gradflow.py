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
    # Columns as numpy arrays once: per-module pandas indexing cost ~1 ms a module, and the live callbacks judge
    # the record periodically during training.
    modules = s["module"].tolist()
    short = [n.rsplit(".", 1)[-1] for n in s["name"]]
    col = {c: s[c].to_numpy(np.float64) for c in ("numel", "grad_abs_sum_mean", "grad_abs_max", "update_ratio_mean",
                                                  "zero_fraction")}
    by_module: dict[str, list[int]] = {}
    for i, m in enumerate(modules):
        by_module.setdefault(m, []).append(i)
    rows = []
    for module in order:
        idx = by_module.get(module, [])
        if not idx:
            continue
        numel = float(col["numel"][idx].sum())
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
        abs_sum, abs_max = col["grad_abs_sum_mean"][idx], col["grad_abs_max"][idx]
        upd, zero = col["update_ratio_mean"][idx], col["zero_fraction"][idx]
        with np.errstate(invalid="ignore"):
            rows.append({
                "layer": module,
                "type": kinds.get(module, ""),
                "params": ", ".join(short[i] for i in idx),
                "numel": int(numel),
                "grad_norm_mean": float(np.nanmean(per_step)) if np.isfinite(per_step).any() else math.nan,
                "grad_rms_mean": float(np.nanmean(rms)) if np.isfinite(rms).any() else math.nan,
                "grad_rms_max": float(np.nanmax(rms)) if np.isfinite(rms).any() else math.nan,
                "grad_rms_active_mean": float(np.nanmean(active)) if np.isfinite(active).any() else math.nan,
                "grad_abs_mean": float(np.nansum(abs_sum) / numel) if (~np.isnan(abs_sum)).any() else math.nan,
                "grad_abs_max": float(np.nanmax(abs_max)) if (~np.isnan(abs_max)).any() else math.nan,
                "update_ratio_mean": float(np.nanmean(upd)) if (~np.isnan(upd)).any() else math.nan,
                "zero_fraction": float(np.nanmean(zero)) if (~np.isnan(zero)).any() else math.nan,
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


def init_reference(setup: Any, ctx: Any, batch: Any) -> tuple[float, float] | None:
    """(global gradient norm at the model's own initialisation, at PyTorch's default initialisation of the same
    architecture) on one batch: every module with ``reset_parameters`` re-initialised on a copy. None when no module
    can be re-initialised or a norm is not finite. The model's gradients are cleared afterwards; RNGs are restored."""
    import copy

    import torch

    from ._common import dropout_off

    ref = copy.deepcopy(ctx.model)
    norms = []
    with preserved():
        torch.manual_seed(setup.seed)
        resettable = [m for m in ref.modules() if callable(getattr(m, "reset_parameters", None))]
        if not resettable:
            return None
        try:
            for m in resettable:
                m.reset_parameters()
        except Exception:  # noqa: BLE001 - a custom reset_parameters with its own arguments: no reference
            return None
        for model in (ctx.model, ref):
            model.zero_grad(set_to_none=True)
            with dropout_off(model), ctx.autocast():
                loss = setup.loss(model, batch)
            loss.float().backward()
            grads = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
            norms.append(float(torch.stack(grads).norm()) if grads else math.nan)
            model.zero_grad(set_to_none=True)
    return (norms[0], norms[1]) if all(math.isfinite(n) and n > 0 for n in norms) else None


def _explosion(mon: GradientMonitor, gnorm: np.ndarray, max_ratio: float, max_growth: float,
               max_norm: float | None, init: tuple[float, float] | None = None, max_init_ratio: float = 1e3) -> dict:
    """Explosion judged against the model's own scale, not an absolute norm.

    A gradient norm means nothing alone: MSE on targets around 100 gives norms in the thousands on a healthy MLP,
    and Adam's update does not depend on the gradient's scale at all. What explodes is (1) the *update*: a step
    that moves the parameters by more than ``max_ratio`` times their own norm (the norm after the previous
    recorded step; the update is what the optimizer did, so this respects its invariances) while the gradient norm
    grows (above 2x the median of the steps before), or (2) the gradient norm itself growing ``max_growth`` times
    that median."""
    data = mon.array()
    metrics: dict[str, Any] = {"explode_update_ratio": max_ratio, "explode_growth": max_growth}
    if max_norm is not None:
        metrics["explode_norm"] = max_norm
    reasons: list[str] = []
    # growth[t]: step t's gradient norm over the median of the steps before it
    growth = np.full(len(gnorm), np.nan)
    for t in range(1, len(gnorm)):
        before = gnorm[:t][np.isfinite(gnorm[:t])]
        if before.size and np.median(before) > 0 and np.isfinite(gnorm[t]):
            growth[t] = gnorm[t] / np.median(before)
    if data.size:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            par = np.sqrt(np.nansum(data[:, :, 1] ** 2, axis=1))  # after each recorded step's update
            upd = np.sqrt(np.nansum(data[:, :, 2] ** 2, axis=1))
            upd = np.where(np.isnan(data[:, :, 2]).all(axis=1), np.nan, upd)
            ratio = np.r_[np.nan, upd[1:] / np.where(par[:-1] > 0, par[:-1], np.nan)]
        if np.isfinite(ratio).any():
            metrics["update_ratio_max"] = float(np.nanmax(ratio))
        # An update larger than the parameters *and* driven by a growing gradient: a zero-initialised model's first
        # steps move it by about its whole (tiny) norm too, but with a shrinking gradient.
        hit = np.flatnonzero((ratio > max_ratio) & (growth > 2.0))
        if hit.size:
            i = int(hit[np.argmax(ratio[hit])])
            reasons.append(f"updates: optimizer step {mon.recorded_steps[i]} moved the parameters by "
                           f"{fmt(float(ratio[i]))}x their norm (> {fmt(max_ratio)}) as the gradient norm grew "
                           f"{fmt(float(growth[i]))}x")
    if np.isfinite(growth).any():
        metrics["grad_norm_growth"] = float(np.nanmax(growth))
        if np.nanmax(growth) > max_growth:
            reasons.append(f"gradients: the global gradient norm grew {fmt(float(np.nanmax(growth)))}x the median of "
                           f"the steps before it (> {fmt(max_growth)})")
    if init is not None:
        # The same architecture at PyTorch's default initialisation, on the same batch and loss: a gradient far above
        # it comes from the initial weight scale, whatever the optimizer then does with it.
        metrics.update(init_grad_norm=init[0], default_init_grad_norm=init[1], init_grad_ratio=init[0] / init[1],
                       explode_init_ratio=max_init_ratio)
        if init[0] / init[1] > max_init_ratio:
            reasons.append(f"gradients at initialisation: the global gradient norm {fmt(init[0])} is "
                           f"{fmt(init[0] / init[1])}x that of the same architecture at PyTorch's default "
                           f"initialisation ({fmt(init[1])}; > {fmt(max_init_ratio)}x): the initial weights are far "
                           "too large")
    finite = gnorm[np.isfinite(gnorm)]
    if max_norm is not None and finite.size and finite.max() > max_norm:
        reasons.append(f"gradients: global norm up to {fmt(float(finite.max()))} > {fmt(max_norm)}")
    return {"metrics": metrics, "reasons": reasons}


def judge_gradient_flow(mon: GradientMonitor, *, vanish_ratio: float = 1e-3, vanish_rms: float = 1e-5,
                        explode_update_ratio: float = 1.0, explode_growth: float = 1e3,
                        explode_norm: float | None = None, grad_clip: float | None = None,
                        init_reference: tuple[float, float] | None = None, explode_init_ratio: float = 1e3,
                        check: str = CHECK) -> CheckResult:
    """The ``model.gradient_flow`` verdict on a monitor's record.

    FAIL for parameters that require grad but never get one (or only exact zeros), parameters that get gradients
    but are never updated (not in any optimizer param group), vanishing gradients (first-to-last layer gradient
    RMS ratio below ``vanish_ratio`` *and* first-layer RMS below ``vanish_rms``), exploding updates or gradients
    (a step moving the parameters by more than ``explode_update_ratio`` x their norm, or a global gradient norm
    ``explode_growth`` x the median of the steps before it; with ``init_reference`` (see :func:`init_reference`), a
    gradient at initialisation ``explode_init_ratio`` x that of PyTorch's default initialisation; ``explode_norm``,
    off by default, adds an absolute cap) or non-finite gradients. Deliberately frozen parameters are reported, not failed.
    """
    s = parameter_summary(mon)
    layers = layer_table(mon, s)
    steps = len(mon.recorded_steps)
    gnorm = mon.global_norms()
    metrics: dict[str, Any] = {
        "recorded_steps": steps, "parameters": len(mon.names), "frozen_parameters": len(mon.frozen),
        "vanish_ratio": vanish_ratio, "vanish_rms": vanish_rms,
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
    explosion = _explosion(mon, gnorm, explode_update_ratio, explode_growth, explode_norm, init_reference,
                           explode_init_ratio)
    metrics.update(explosion["metrics"])
    if explosion["reasons"]:
        big = layers.sort_values("grad_norm_mean", ascending=False).head(3)
        for _, r in big.iterrows():
            problems.append({"name": r["layer"], "problem": "exploding gradient",
                             "detail": f"mean gradient norm {fmt(r['grad_norm_mean'])}, mean update/parameter ratio "
                                       f"{fmt(r['update_ratio_mean'])}"})
        reasons.append("exploding " + "; ".join(explosion["reasons"]))
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
                        explode_update_ratio: float = 1.0, explode_growth: float = 1e3,
                        explode_init_ratio: float = 1e3, explode_norm: float | None = None, seed: int | None = None, progress: bool = True,
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
    explode_update_ratio, explode_growth
        Exploding when one optimizer step moves the parameters by more than ``explode_update_ratio`` x their norm,
        or the global gradient norm (as the optimizer sees it, after any clipping) reaches ``explode_growth`` x the
        median of the steps before it. Judged against the model's own scale: a large gradient norm alone (MSE on
        targets around 100, or any gradient under Adam, whose update ignores the gradient's scale) is not an
        explosion.
    explode_init_ratio
        Exploding when the gradient at initialisation is this many times that of the same architecture at PyTorch's
        default initialisation (every module's ``reset_parameters``) on the first batch: the initial weight scale.
    explode_norm
        Optional absolute cap on the global gradient norm (None: off).
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
        reference = init_reference(setup, ctx, setup.sample_batch())
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
    result = judge_gradient_flow(mon, vanish_ratio=vanish_ratio, vanish_rms=vanish_rms,
                                 explode_update_ratio=explode_update_ratio, explode_growth=explode_growth,
                                 explode_norm=explode_norm, grad_clip=setup.grad_clip, init_reference=reference,
                                 explode_init_ratio=explode_init_ratio)
    result.metrics["observed_at"] = "parameter change" if hand.recorded else "optimizer.step"
    return result
