"""Reading and judging a :class:`tropt.GradientMonitor`'s record: the ``model.gradient_flow`` verdict.

This sits below both the monitor (whose :meth:`~tropt.GradientMonitor.result` judges its own record) and the
``model.gradient_flow`` check (which trains a copy under a monitor): it never imports :mod:`.monitor` at run
time, so the monitor can import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..result import CheckResult, Status
from ._common import fmt, names_list

if TYPE_CHECKING:
    from .monitor import GradientMonitor

CHECK = "model.gradient_flow"


def module_of(name: str) -> str:
    """The owning module's name of a parameter name (``"net.0.weight"`` -> ``"net.0"``; top level -> ``"(root)"``)."""
    return name.rsplit(".", 1)[0] if "." in name else "(root)"


def parameter_summary(mon: GradientMonitor) -> pd.DataFrame:
    """Per-parameter aggregates of a monitor's record."""
    data = mon.array()
    steps = data.shape[0]
    numel = mon._numel.numpy() if mon.names else np.zeros(0)
    rows = []
    for i, name in enumerate(mon.names):
        g = data[:, i, 0] if steps else np.zeros(0)
        finite_g = g[np.isfinite(g)]
        upd = data[:, i, 2] if steps else np.zeros(0)
        par = data[:, i, 1] if steps else np.zeros(0)
        nz = data[:, i, 3] if steps else np.zeros(0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = upd / par
        rows.append({
            "name": name,
            "module": module_of(name),
            "numel": int(numel[i]),
            "steps_with_grad": int(mon.grad_seen[i]),
            "in_optimizer": bool(mon.in_optimizer[i]),
            "lr_nonzero": bool(mon.lr_nonzero[i]),
            "grad_norm_mean": float(finite_g.mean()) if finite_g.size else math.nan,
            "grad_norm_max": float(finite_g.max()) if finite_g.size else math.nan,
            "grad_rms_mean": float(finite_g.mean() / math.sqrt(numel[i])) if finite_g.size else math.nan,
            # the latest measured
            "param_norm": float(par[np.isfinite(par)][-1]) if np.isfinite(par).any() else math.nan,
            "update_norm_max": float(np.nanmax(upd)) if steps and np.isfinite(upd).any() else math.nan,
            "update_ratio_mean": float(np.nanmean(ratio)) if steps and np.isfinite(ratio).any() else math.nan,
            "zero_fraction": float(np.nanmean(1.0 - nz / numel[i])) if steps and np.isfinite(nz).any() else math.nan,
            "nonfinite_steps": int(np.nansum(data[:, i, 4] > 0)) if steps else 0,
            "nonfinite_max": int(np.nanmax(data[:, i, 4])) if steps and np.isfinite(data[:, i, 4]).any() else 0,
            "grad_abs_sum_mean": (float(np.nanmean(data[:, i, 5])) if steps and np.isfinite(data[:, i, 5]).any()
                                  else math.nan),
            "grad_abs_max": float(np.nanmax(data[:, i, 6])) if steps and np.isfinite(data[:, i, 6]).any() else math.nan,
        })
    return pd.DataFrame(rows, columns=["name", "module", "numel", "steps_with_grad", "in_optimizer", "lr_nonzero",
                                       "grad_norm_mean", "grad_norm_max", "grad_rms_mean", "param_norm",
                                       "update_norm_max", "update_ratio_mean", "zero_fraction", "nonfinite_steps",
                                       "nonfinite_max", "grad_abs_sum_mean", "grad_abs_max"])


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
    return pd.DataFrame(rows, columns=["layer", "type", "params", "numel", "grad_norm_mean", "grad_rms_mean",
                                       "grad_rms_max", "grad_rms_active_mean", "grad_abs_mean", "grad_abs_max",
                                       "update_ratio_mean", "zero_fraction"])


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


def _explosion(mon: GradientMonitor, gnorm: np.ndarray, max_ratio: float, max_growth: float,
               max_norm: float | None, init: tuple[float, ...] | None = None, max_init_ratio: float = 1e3) -> dict:
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
        # (own, default[, noise floor, lower paired ratio]): with a stochastic loss both paired ratios must exceed
        # the limit, so the loss's own noise cannot make an explosion.
        floor, lowest = (init[2], init[3]) if len(init) >= 4 else (0.0, init[0] / init[1])
        metrics.update(init_grad_norm=init[0], default_init_grad_norm=init[1], init_grad_ratio=init[0] / init[1],
                       explode_init_ratio=max_init_ratio, noise_floor=floor)
        if init[0] / init[1] > max_init_ratio and lowest > max_init_ratio:
            reasons.append(f"gradients at initialisation: the global gradient norm {fmt(init[0])} is "
                           f"{fmt(init[0] / init[1])}x that of the same architecture at PyTorch's default "
                           f"initialisation ({fmt(init[1])}; > {fmt(max_init_ratio)}x): the initial weights are far "
                           "too large")
    finite = gnorm[np.isfinite(gnorm)]
    if max_norm is not None and finite.size and finite.max() > max_norm:
        reasons.append(f"gradients: global norm up to {fmt(float(finite.max()))} > {fmt(max_norm)}")
    return {"metrics": metrics, "reasons": reasons}

@dataclass
class _Findings:
    """What the rules found, in the order the verdict reports it."""

    problems: list[dict[str, Any]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said in the summary, not failed for


def _cancelled(zero: pd.DataFrame, cancelled: dict[str, dict[str, Any]], found: _Findings) -> pd.DataFrame:
    """Exactly-zero gradients that the loss's parts cancel by design (a Wasserstein critic's output bias): noted
    with the evidence, not failed; returns the zero-gradient rows left to judge."""
    mine = zero[zero["name"].isin(list(cancelled))]
    if not len(mine):
        return zero
    for name in mine["name"]:
        ev = cancelled[name]
        found.problems.append({"name": name, "problem": "cancelling gradient (by design)",
                               "detail": f"exactly zero at every step; under loss_fn its {ev['shares']} shares "
                                         f"(per forward call and block of samples; largest norm "
                                         f"{fmt(ev['largest_share_norm'])}) cancel to {fmt(ev['sum_of_shares_norm'])}"})
    found.notes.append(f"{len(mine)} parameter(s) get an exactly-zero gradient because the loss's parts cancel it, "
                       f"not because a path is cut ({names_list(mine['name'])}: the shares of the loss's terms are "
                       "non-zero and sum to zero, as a critic's output bias under mean(D(real)) - mean(D(fake)) does; "
                       "such a parameter never moves, which is harmless)")
    return zero[~zero["name"].isin(list(cancelled))]


def _missing_gradients(s: pd.DataFrame, found: _Findings, cancelled: dict[str, dict[str, Any]] | None = None) -> None:
    """Parameters that require grad but never get one, or only exact zeros (unless the loss's parts cancel them)."""
    no_grad = s[s["steps_with_grad"] == 0]
    zero_grad = s[(s["steps_with_grad"] > 0) & (s["zero_fraction"] >= 1.0)]
    if cancelled:
        zero_grad = _cancelled(zero_grad, cancelled, found)
    if len(no_grad):
        for name in no_grad["name"]:
            found.problems.append({"name": name, "problem": "no gradient",
                                   "detail": "requires grad but .grad stayed None at every step (detached or unused)"})
        found.reasons.append(f"{len(no_grad)} parameter(s) never get a gradient ({names_list(no_grad['name'])})")
        found.advice.append("Find where these parameters leave the graph (.detach(), .item(), torch.no_grad(), an "
                            "unused branch) and reconnect them, or set requires_grad=False if they are meant to be "
                            "frozen.")
    if len(zero_grad):
        for name in zero_grad["name"]:
            found.problems.append({"name": name, "problem": "zero gradient",
                                   "detail": "the gradient was exactly zero at every step"})
        found.reasons.append(f"{len(zero_grad)} parameter(s) get only exactly-zero gradients "
                             f"({names_list(zero_grad['name'])})")
        found.advice.append("Exactly-zero gradients mean the path from these parameters to the loss is cut: look for "
                            "dead ReLUs upstream (model.activation_stats), a multiplication by zero, or a detached "
                            "branch.")


def _never_updated(s: pd.DataFrame, found: _Findings) -> None:
    """Parameters that get gradients but are not in any optimizer param group, or only in groups with lr 0."""
    has_grad = s[(s["steps_with_grad"] > 0) & (s["zero_fraction"] < 1.0)]
    # Judged from the optimizers' param groups, not from a zero update: lr x a tiny gradient can round to no change
    # in fp32 (that is the vanishing rule's business).
    not_updated = has_grad[~has_grad["in_optimizer"] | ~has_grad["lr_nonzero"]]
    if not len(not_updated):
        return
    for _, r in not_updated.iterrows():
        detail = ("not in any optimizer param group" if not r["in_optimizer"]
                  else "its optimizer param group has learning rate 0")
        found.problems.append({"name": r["name"], "problem": "never updated", "detail": detail})
    outside = not_updated[~not_updated["in_optimizer"]]
    found.reasons.append(f"{len(not_updated)} parameter(s) get gradients but are never updated"
                         + (f" (not in any optimizer param group: {names_list(outside['name'])})" if len(outside) else
                            f" (learning rate 0: {names_list(not_updated['name'])})"))
    found.advice.append("Build the optimizer from model.parameters() (or include every group, each with a non-zero "
                        "learning rate), e.g. lambda m: torch.optim.AdamW(m.parameters(), lr=...).")


def _nonfinite(mon: GradientMonitor, s: pd.DataFrame, gnorm: np.ndarray, found: _Findings) -> None:
    """Parameters whose gradient held NaN or inf entries at some recorded step."""
    nonfinite = s[s["nonfinite_steps"] > 0]
    if not len(nonfinite):
        return
    for _, r in nonfinite.iterrows():
        found.problems.append({"name": r["name"], "problem": "non-finite gradient",
                               "detail": f"{int(r['nonfinite_steps'])} step(s), up to {int(r['nonfinite_max'])} "
                                         "entries"})
    first = int(np.argmax(~np.isfinite(gnorm))) if (~np.isfinite(gnorm)).any() else 0
    found.reasons.append(f"non-finite gradients in {len(nonfinite)} parameter(s) from step "
                         f"{mon.recorded_steps[first]} ({names_list(nonfinite['name'])})")
    found.advice.append("Lower the learning rate, clip gradients (grad_clip=1.0) and check the loss for log(0) or "
                        "division by zero.")


def _exploding(explosion: dict, layers: pd.DataFrame, found: _Findings) -> None:
    """The three layers with the largest gradients, when :func:`_explosion` found an explosion."""
    if not explosion["reasons"]:
        return
    big = layers.sort_values("grad_norm_mean", ascending=False).head(3)
    for _, r in big.iterrows():
        found.problems.append({"name": r["layer"], "problem": "exploding gradient",
                               "detail": f"mean gradient norm {fmt(r['grad_norm_mean'])}, mean update/parameter "
                                         f"ratio {fmt(r['update_ratio_mean'])}"})
    found.reasons.append("exploding " + "; ".join(explosion["reasons"]))
    found.advice.append("Lower the learning rate or the initial weight scale, add normalisation, or clip gradients "
                        "(grad_clip=1.0).")


def _vanishing(layers: pd.DataFrame, metrics: dict[str, Any], vanish_ratio: float, vanish_rms: float,
               found: _Findings) -> None:
    """First-to-last layer gradient RMS ratio below ``vanish_ratio`` and first-layer RMS below ``vanish_rms``."""
    rms_col = "grad_rms_active_mean"  # over entries that got a gradient (see layer_table)
    live = layers[np.isfinite(layers[rms_col]) & (layers[rms_col] > 0)]
    if len(live) < 2:
        return
    first_l, last_l = live.iloc[0], live.iloc[-1]
    ratio = first_l[rms_col] / last_l[rms_col]
    metrics.update(first_layer=first_l["layer"], last_layer=last_l["layer"], first_to_last_ratio=float(ratio),
                   first_layer_grad_rms=float(first_l[rms_col]))
    if ratio < vanish_ratio and first_l[rms_col] < vanish_rms:
        small = live[live[rms_col] < vanish_rms]
        for _, r in small.iterrows():
            found.problems.append({"name": r["layer"], "problem": "vanishing gradient",
                                   "detail": f"gradient RMS {fmt(r[rms_col])} vs {fmt(last_l[rms_col])} at "
                                             f"{last_l['layer']}"})
        found.reasons.append(f"vanishing gradients: the first layer {first_l['layer']} gets {fmt(ratio)}x the "
                             f"gradient of the last ({last_l['layer']}), RMS {fmt(first_l[rms_col])}")
        found.advice.append("Use ReLU/GELU instead of sigmoid/tanh in deep stacks, add residual connections or "
                            "normalisation layers, and use a fan-in aware init (kaiming/xavier).")


def judge_gradient_flow(mon: GradientMonitor, *, vanish_ratio: float = 1e-3, vanish_rms: float = 1e-5,
                        explode_update_ratio: float = 1.0, explode_growth: float = 1e3,
                        explode_norm: float | None = None, grad_clip: float | None = None,
                        init_reference: tuple[float, ...] | None = None, explode_init_ratio: float = 1e3,
                        check: str = CHECK, cancelled: dict[str, dict[str, Any]] | None = None) -> CheckResult:
    """The ``model.gradient_flow`` verdict on a monitor's record.

    FAIL for parameters that require grad but never get one (or only exact zeros), parameters that get gradients
    but are never updated (not in any optimizer param group), vanishing gradients (first-to-last layer gradient
    RMS ratio below ``vanish_ratio`` *and* first-layer RMS below ``vanish_rms``), exploding updates or gradients
    (a step moving the parameters by more than ``explode_update_ratio`` x their norm, or a global gradient norm
    ``explode_growth`` x the median of the steps before it; with ``init_reference`` (see
    :func:`tropt.model.gradient_flow.init_reference`), a gradient at initialisation ``explode_init_ratio`` x that
    of PyTorch's default initialisation; ``explode_norm``, off by default, adds an absolute cap) or non-finite
    gradients. Deliberately frozen parameters are reported, not failed, and so are the exactly-zero gradients in
    ``cancelled`` (parameter name -> evidence from :func:`tropt.model._cancellation.cancelling_parameters`: the
    loss's parts cancel them by design).
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

    found = _Findings()
    _missing_gradients(s, found, cancelled)
    _never_updated(s, found)
    _nonfinite(mon, s, gnorm, found)
    explosion = _explosion(mon, gnorm, explode_update_ratio, explode_growth, explode_norm, init_reference,
                           explode_init_ratio)
    metrics.update(explosion["metrics"])
    _exploding(explosion, layers, found)
    _vanishing(layers, metrics, vanish_ratio, vanish_rms, found)
    if found.problems:
        tables["problems"] = pd.DataFrame(found.problems, columns=["name", "problem", "detail"])
    if mon.frozen:
        tables["frozen"] = pd.DataFrame({"name": mon.frozen, "module": [module_of(n) for n in mon.frozen]})
    tables["parameters"] = s
    frozen_note = f"; {len(mon.frozen)} parameter(s) frozen on purpose (requires_grad=False)" if mon.frozen else ""
    frozen_note += "".join(f"; {n}" for n in found.notes)
    if cancelled:
        metrics["cancelling_parameters"] = len([n for n in cancelled if n in set(s["name"])])
        tables["cancelling_shares"] = pd.DataFrame([row for ev in cancelled.values() for row in ev["table"]])
    if found.reasons:
        return CheckResult(check, Status.FAIL, "; ".join(found.reasons) + frozen_note, metrics, tables, found.advice,
                           series)
    return CheckResult(
        check, Status.PASS,
        f"gradients reach all {len(mon.names)} trainable parameters and every one is updated over {steps} steps "
        f"(global norm median {fmt(metrics['global_grad_norm_median'])})" + frozen_note,
        metrics, tables, [], series)
