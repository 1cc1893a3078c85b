"""``model.activation_stats``: are the units alive and unsaturated?

Forward hooks on activation modules (ReLU family, GELU, SiLU, sigmoid, tanh, ...) and on Linear/Conv outputs
record per layer the mean and standard deviation, which units are ever active (rectifiers: positive
pre-activation), and for sigmoid/tanh the fraction of saturated pre-activations (|x| > 5, where the derivative is
under 3% of its peak for sigmoid and 0.02% for tanh). Measured at initialisation on a few sampled batches, during a
short training of a copy (fastai's per-step activation histograms, the "colorful dimension"), and again after it.
Activation modules outside ``torch.nn`` (transformers' ``NewGELUActivation``/``GELUActivation``, timm's ``GELU``) are
recognised by their class name, and transformers' ``Conv1D`` (GPT-2's projections) counts as a Linear layer.
Functional activations (``F.relu`` inside ``forward``) have no module to hook: their inputs show up as the
Linear/Conv outputs, which are recorded but judge no unit. A run that judged no activation unit is a SKIP that says
so, never a PASS.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import pandas as pd
import torch
from torch import nn

from ..core.compiled import untraced
from ..core.grad_mode import grad_mode, loss_needs_grad
from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from ._common import require_samples

if TYPE_CHECKING:
    from ..setup import Setup

CHECK = "model.activation_stats"

RECTIFIERS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU,
              nn.Mish, nn.Hardswish, nn.Softplus)
SATURATING = (nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardsigmoid, nn.LogSigmoid, nn.Softsign)
LINEAR = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd)
BINS = 40
# Activation modules outside torch.nn, by class name (lower case; the first family that matches wins, so GELUTanh is a
# rectifier): transformers.activations, timm.layers.activations and most hand-written ones follow these names.
_NAMED_RECTIFIERS = ("gelu", "relu", "silu", "swish", "mish", "elu", "softplus")
_NAMED_SATURATING = ("sigmoid", "tanh", "softsign")
_NOT_ACTIVATIONS = ("linear", "identity", "laplace")  # transformers' LinearActivation, LaplaceActivation


def _kind(module: nn.Module) -> str | None:
    """How a module is judged: "rectifier", "saturating", "linear" (output statistics only) or None (not hooked).

    torch.nn's own classes decide by type; other leaf modules by their class name: an elementwise activation
    (``NewGELUActivation``) or transformers' ``Conv1D`` (a Linear with the weight transposed)."""
    if isinstance(module, RECTIFIERS):
        return "rectifier"
    if isinstance(module, SATURATING):
        return "saturating"
    if isinstance(module, LINEAR):
        return "linear"
    if type(module).__module__.startswith("torch.") or next(module.children(), None) is not None:
        return None
    name = type(module).__name__.lower()
    if name == "conv1d" and isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.ndim == 2:
        return "linear"
    if any(w in name for w in _NOT_ACTIVATIONS):
        return None
    if any(w in name for w in _NAMED_RECTIFIERS):
        return "rectifier"
    if any(w in name for w in _NAMED_SATURATING):
        return "saturating"
    return None


def _unit_dim(x: torch.Tensor, conv_like: bool) -> int:
    """The feature/channel axis of an activation tensor: 1 after convolutions (N, C, ...), else the last."""
    if x.ndim <= 2:
        return x.ndim - 1
    return 1 if conv_like else x.ndim - 1


HIST_SAMPLE = 1 << 16  # activations histogrammed per layer and forward at most (an evenly strided sample)


def _histogram(o: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """``BINS`` counts of ``o`` clamped to ``[lo, hi]``, from an evenly strided sample of at most :data:`HIST_SAMPLE`
    values scaled back to ``o``'s size: the per-step histograms feed the plot only (the verdicts count every value),
    and histogramming every value of a language model's activations cost a fifth of each training step."""
    flat = o.reshape(-1)
    n = flat.numel()
    if n > HIST_SAMPLE:
        flat = flat[:: n // HIST_SAMPLE]
    h = torch.histc(flat.clamp(lo, hi), bins=BINS, min=lo, max=hi)
    return h * (n / flat.numel()) if flat.numel() != n else h


class _LayerStats:
    def __init__(self, name: str, module: nn.Module, kind: str) -> None:
        self.name, self.module, self.kind = name, module, kind
        self.type = type(module).__name__
        self.reset()
        self.hist: list[torch.Tensor] = []
        self.range: tuple[float, float] | None = None
        self.step_hist: torch.Tensor | None = None

    def reset(self) -> None:
        self.count = 0
        self.sum: float | torch.Tensor = 0.0  # a tensor once a batch is added (no host sync per batch)
        self.sumsq: float | torch.Tensor = 0.0
        self.active: torch.Tensor | None = None
        self.saturated: float | torch.Tensor = 0.0
        self.elements = 0
        self.width = 0  # a saturating layer's units (a rectifier's are counted by ``active``)

    def update(self, inp: torch.Tensor | None, out: torch.Tensor, conv_like: bool, record_hist: bool) -> None:
        o = out.detach().float()
        self.sum += o.sum()
        self.sumsq += (o * o).sum()
        self.elements += o.numel()
        if self.kind == "rectifier" and inp is not None:
            x = inp.detach().float()
            d = _unit_dim(x, conv_like)
            act = (x > 0).movedim(d, -1).reshape(-1, x.shape[d]).any(0)
            self.active = act if self.active is None or self.active.shape != act.shape else self.active | act
        if self.kind == "saturating" and inp is not None:
            self.saturated += (inp.detach().float().abs() > 5).sum()
            self.width = int(inp.shape[_unit_dim(inp, conv_like)]) if inp.ndim else 1
        if record_hist:
            if self.range is None:
                lo, hi = float(o.min()), float(o.max())
                pad = 0.5 * max(hi - lo, 1e-6)
                self.range = (lo - pad if lo < 0 else lo, hi + pad)
            lo, hi = self.range
            h = _histogram(o, lo, hi)
            self.step_hist = h if self.step_hist is None else self.step_hist + h

    def end_step(self) -> None:
        if self.step_hist is not None:
            self.hist.append(self.step_hist.cpu())
            self.step_hist = None

    def stats(self) -> dict[str, Any]:
        n = max(self.elements, 1)
        mean = float(self.sum) / n
        var = max(float(self.sumsq) / n - mean * mean, 0.0)
        d: dict[str, Any] = {"mean": mean, "std": math.sqrt(var)}
        d["dead_fraction"] = (1.0 - float(self.active.float().mean())) if self.active is not None else math.nan
        d["units"] = int(self.active.numel()) if self.active is not None else self.width
        d["saturated_fraction"] = float(self.saturated) / n if self.kind == "saturating" else math.nan
        return d


class _Hooks:
    """Forward hooks on every activation and Linear/Conv module; stats per phase."""

    def __init__(self, model: nn.Module) -> None:
        self.layers: list[_LayerStats] = []
        self.record_hist = False
        self._last_conv = False
        self.handles = []
        for name, m in model.named_modules():
            kind = _kind(m)
            if kind is not None:
                st = _LayerStats(name or type(m).__name__, m, kind)
                self.layers.append(st)
                self.handles.append(m.register_forward_hook(untraced(self._hook(st), model)))

    def _hook(self, st: _LayerStats):
        def hook(module: nn.Module, args: Any, out: Any) -> None:
            if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                return
            if st.kind == "linear":
                self._last_conv = isinstance(module, nn.modules.conv._ConvNd)
            inp = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if st.kind != "linear" and (inp is None or inp.shape != out.shape):
                return  # not elementwise: no unit to judge (a module named like an activation that is not one)
            st.update(inp, out, self._last_conv or isinstance(module, nn.modules.conv._ConvNd), self.record_hist)
        return hook

    def snapshot(self, phase: str) -> list[dict[str, Any]]:
        rows = []
        for st in self.layers:
            if st.elements:
                rows.append({"layer": st.name, "type": st.type, "kind": st.kind, "phase": phase, **st.stats()})
            st.reset()
        return rows

    def end_step(self) -> None:
        for st in self.layers:
            st.end_step()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _record(setup: Setup, ctx: Any, hooks: _Hooks, batches: list, steps: int, seed: int,
            progress: bool, needs_grad: bool = False) -> list[dict[str, Any]]:
    """Layer statistics on the sampled batches at initialisation, over ``steps`` training steps, and after (the
    sampled batches without gradients, unless ``needs_grad``: the loss differentiates inside itself)."""
    from tqdm.auto import tqdm

    model = ctx.model
    with grad_mode(needs_grad), ctx.autocast():
        for b in batches:
            setup.loss(model, b)
    rows = hooks.snapshot("init")
    k = setup.accumulation_steps
    if steps > 0:
        hooks.record_hist = True
        for batch in tqdm(setup.batches(steps, seed=seed + 1), total=steps,
                          desc="activation stats", disable=not progress, leave=False):
            setup.run_step(ctx, setup.split(batch, k) if k > 1 else [batch])
            hooks.end_step()
        hooks.record_hist = False
        rows_train = hooks.snapshot("train")
        with grad_mode(needs_grad), ctx.autocast():
            for b in batches:
                setup.loss(model, b)
        rows += rows_train + hooks.snapshot("after")
    return rows


def _problems(dead_f: pd.DataFrame, dead_w: pd.DataFrame, sat_w: pd.DataFrame) -> list[dict[str, Any]]:
    problems = []
    for _, r in pd.concat([dead_f, dead_w]).iterrows():
        problems.append({"layer": r["layer"], "type": r["type"], "phase": r["phase"], "problem": "dead units",
                         "value": r["dead_fraction"],
                         "detail": f"{r['dead_fraction']:.0%} of {r['units']} units never active on the sampled "
                                   "batches"})
    for _, r in sat_w.iterrows():
        problems.append({"layer": r["layer"], "type": r["type"], "phase": r["phase"], "problem": "saturation",
                         "value": r["saturated_fraction"],
                         "detail": f"{r['saturated_fraction']:.0%} of pre-activations beyond |5|"})
    return problems


def _judge(stats: pd.DataFrame, metrics: dict[str, Any], tables: dict[str, pd.DataFrame], series: dict[str, Any],
           steps: int, dead_fail: float, dead_warn: float, saturation_warn: float) -> CheckResult:
    """Dead rectifier units and saturated sigmoid/tanh layers, at initialisation and after training."""
    judged = stats[stats["phase"] != "train"]
    rect = judged[judged["kind"] == "rectifier"]
    sat = judged[judged["kind"] == "saturating"]
    worst_dead = rect.sort_values("dead_fraction", ascending=False).drop_duplicates("layer")
    worst_sat = sat.sort_values("saturated_fraction", ascending=False).drop_duplicates("layer")
    metrics["max_dead_fraction"] = float(worst_dead["dead_fraction"].max()) if len(worst_dead) else 0.0
    metrics["max_saturated_fraction"] = float(worst_sat["saturated_fraction"].max()) if len(worst_sat) else 0.0
    dead_f = worst_dead[worst_dead["dead_fraction"] >= dead_fail]
    dead_w = worst_dead[(worst_dead["dead_fraction"] >= dead_warn) & (worst_dead["dead_fraction"] < dead_fail)]
    sat_w = worst_sat[worst_sat["saturated_fraction"] >= saturation_warn]
    problems = _problems(dead_f, dead_w, sat_w)
    if problems:
        tables["problems"] = pd.DataFrame(problems, columns=["layer", "type", "phase", "problem", "value", "detail"])
    advice, reasons = [], []
    if len(dead_f) or len(dead_w):
        worst = pd.concat([dead_f, dead_w])
        reasons.append("dead units: " + ", ".join(f"{r['layer']} ({r['type']}) {r['dead_fraction']:.0%} never active "
                                                   f"[{r['phase']}]" for _, r in worst.head(4).iterrows())
                       + (f" and {len(worst) - 4} more" if len(worst) > 4 else ""))
        advice.append("Check the bias and weight init of the layer feeding each dead activation (strongly negative "
                      "biases or huge weights kill ReLUs), lower the learning rate, or use LeakyReLU/GELU.")
    if len(sat_w):
        reasons.append("saturation: " + ", ".join(f"{r['layer']} ({r['type']}) {r['saturated_fraction']:.0%} beyond "
                                                  f"|5| [{r['phase']}]" for _, r in sat_w.head(4).iterrows()))
        advice.append("Scale the inputs and the weights feeding saturated sigmoid/tanh layers down (xavier init, "
                      "normalisation before them), or use a non-saturating activation.")
    if len(dead_f):
        status = Status.FAIL
    elif reasons:
        status = Status.WARN
    else:
        status = Status.PASS
    if reasons:
        summary = "; ".join(reasons)
    else:
        summary = (f"{metrics['judged_layers']} activation layers ({metrics['judged_units']} units) judged, "
                   f"{metrics['hooked_layers']} layers hooked: at most {metrics['max_dead_fraction']:.0%} dead units"
                   + (f", {metrics['max_saturated_fraction']:.0%} saturation" if len(worst_sat) else "")
                   + f" at init and after {steps} training steps")
    return CheckResult(CHECK, status, summary, metrics, tables, advice, series)


@register(CHECK, title="Activation statistics",
          description="Per-layer activation mean/std, dead units and saturation at init, during and after a short "
                      "training.",
          budgets={'quick': {'n_batches': 2, 'steps': 3}, 'thorough': {'n_batches': 8, 'steps': 50}},
          plot="tropt.plots.model")
def check_activation_stats(setup: Setup, *, n_batches: int = 4, steps: int = 20, dead_fail: float = 0.7,
                           dead_warn: float = 0.4, saturation_warn: float = 0.3, seed: int | None = None,
                           progress: bool = True) -> CheckResult:
    """Hook the activations of a copy and judge dead and saturated units.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`.
    n_batches
        Sampled batches on which units are judged, at initialisation and after the short training.
    steps
        Training steps of the copy in between (their per-step histograms feed the plot); 0 skips training.
    dead_fail, dead_warn
        FAIL when a rectifier layer has at least ``dead_fail`` of its units never active on the sampled batches,
        WARN from ``dead_warn``.
    saturation_warn
        WARN when at least this fraction of a sigmoid/tanh layer's pre-activations have ``|x| > 5``.
    seed
        Seed of the copy (the Setup's seed when None).
    progress
        Show a progress bar.
    """
    setup.validate()
    seed = setup.seed if seed is None else seed
    with preserved(setup.model):
        batches = list(setup.batches(max(1, n_batches)))
        require_samples(batches[0], 2, "a unit's activity on a single sample says nothing about whether it is dead",
                        CHECK, setup.layout)
        ctx = setup.build(seed=seed)
        needs_grad = loss_needs_grad(setup, ctx.model, batches[0], ctx)  # decided before the hooks see a forward
        hooks = _Hooks(ctx.model)
        try:
            if not hooks.layers:
                return CheckResult(CHECK, Status.SKIP, "no activation, Linear or Conv modules to hook (activations "
                                   "applied functionally in forward() cannot be observed)", {"hooked_layers": 0})
            rows = _record(setup, ctx, hooks, batches, steps, seed, progress, needs_grad)
        finally:
            hooks.remove()
    stats = pd.DataFrame(rows, columns=["layer", "type", "kind", "phase", "mean", "std", "dead_fraction", "units",
                                        "saturated_fraction"])
    metrics: dict[str, Any] = {"hooked_layers": int(stats["layer"].nunique()), "steps": steps,
                               "dead_fail": dead_fail, "dead_warn": dead_warn, "saturation_warn": saturation_warn}
    series: dict[str, Any] = {}
    hist_layers = [st for st in hooks.layers if st.hist]
    for st in hist_layers:
        series[f"hist/{st.name}"] = torch.stack(st.hist).numpy()  # (steps, bins)
    if hist_layers:
        metrics["hist_bins"] = BINS
    if stats.empty:
        return CheckResult(CHECK, Status.SKIP, "no hooked layer ran in the forward pass", metrics)
    judged = stats[stats["kind"] != "linear"].drop_duplicates("layer")
    metrics.update(judged_layers=len(judged), judged_units=int(judged["units"].sum()))
    tables = {"layers": stats}
    if not len(judged):
        # Linear/Conv outputs alone say nothing about dead or saturated units: a PASS here would have examined nothing.
        return CheckResult(CHECK, Status.SKIP,
                           f"no activation module ran in forward(): only {metrics['hooked_layers']} Linear/Conv "
                           "layer(s) were observed, and their outputs judge no unit (activations applied "
                           "functionally, e.g. F.relu or torch.tanh inside forward(), cannot be hooked)",
                           metrics, tables,
                           ["To have dead and saturated units judged, use activation modules (nn.ReLU(), nn.GELU(), "
                            "...) as attributes of the model instead of functional calls in forward()."])
    if hist_layers:
        # a layer with a histogram has its range (set before its first histogram step)
        ranges = [cast("tuple[float, float]", st.range) for st in hist_layers]
        tables["hist_ranges"] = pd.DataFrame([{"layer": st.name, "low": r[0], "high": r[1]}
                                              for st, r in zip(hist_layers, ranges)])
    return _judge(stats, metrics, tables, series, steps, dead_fail, dead_warn, saturation_warn)
