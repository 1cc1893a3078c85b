"""``GradientMonitor``: per-parameter gradient, parameter and update statistics at every optimizer step.

Drop it into any loop::

    with tropt.GradientMonitor(model) as mon:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    mon.frame()            # one row per (step, parameter)
    mon.result().plot()    # the model.gradient_flow verdict and its bar chart

It records at the moment an optimizer that holds any of the model's parameters calls ``step()`` (global
optimizer step hooks, removed on exit; pass ``optimizer=`` to watch only that one). Statistics are computed with
batched ``torch._foreach_norm`` calls into preallocated tensors on the parameters' device: on an accelerator nothing
is copied to the host and nothing synchronises until you read the results.

Cost is counted in passes over gradient- or parameter-sized memory (:attr:`GradientMonitor.passes`). A recorded step
makes one pass over the gradients: their L2 norms, which also flag non-finite entries (a NaN/inf entry makes its norm
non-finite; on CPU the entries are counted only then). The statistics that drift slowly are measured on every
``full_every``-th recorded step (10 by default): the parameter norm (one pass), the exact-zero count (one pass over the
gradients) and the update norm. The update norm is read from the optimizer's own step where that is exact
(``torch.optim.SGD``: ``lr * ||grad||`` without momentum, ``lr * ||momentum buffer||`` with it: no copy, at most
one pass); for other optimizers it is ``||p_after - p_before||`` from a copy of the parameters (six passes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..core.capture import group_lr
from ..core.own_hooks import norm_view, owned_hook
from ..errors import TroptError
from ._monitor_unfreeze import watch_unfrozen
from .gradient_verdict import judge_gradient_flow, parameter_summary
from .update_norms import flat_copies, sgd_update_rules

# Columns of the per-step record, in the order of the preallocated tensor's last axis.
FIELDS = ("grad_norm", "param_norm", "update_norm", "nonzero", "nonfinite", "grad_abs_sum", "grad_abs_max")


# Same-width integer dtypes: counting non-zero bit patterns is branch-free, while count_nonzero on CPU floats slows
# down about 20x on sparse gradients (ReLU, embeddings) from branch misprediction.
_INT_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


def _count_nonzero(g: torch.Tensor) -> torch.Tensor:
    """Entries of ``g`` that are not exactly zero (a -0.0 entry, rare in gradients, counts as non-zero here)."""
    as_int = _INT_VIEW.get(g.dtype)
    return torch.count_nonzero(g.view(as_int) if as_int is not None else g)


class GradientMonitor:
    """Record gradient statistics of ``model``'s parameters at every ``every``-th optimizer step.

    Parameters
    ----------
    model
        The module whose parameters to watch (those with ``requires_grad``; one frozen when the monitor is entered
        is listed in :attr:`frozen` until it becomes trainable, then watched from that step on).
    every
        Record one optimizer step in ``every``; the others cost nothing.
    optimizer
        Watch only this optimizer's steps; by default any optimizer that holds one of the model's parameters.
    track_updates
        Also measure the update the optimizer applies (its L2 norm per parameter, exact). For ``torch.optim.SGD``
        it is read from the step itself (``lr`` times the norm of the gradient or of the momentum buffer: no copy);
        for other optimizers ``||p_after - p_before||`` from one copy of the watched parameters on their device.
    full_every
        Measure the parameter norm, the update norm and the exact-zero count on one recorded step in ``full_every``
        (rows 0, k, 2k, ...; ``param_norm``, ``update_norm`` and ``zero_fraction`` are NaN on the others). They
        drift slowly (dead units stay dead, parameters move by ~lr per step), and each costs one or more passes over
        parameter-sized memory (a copy-based update norm six), against the one pass over the gradients every
        recorded step makes. The default of 10 keeps the monitor within 5% of a training step at one and two
        threads (``benchmarks/bench_gradflow.py``); the gradient norm and non-finite gradients are still measured
        at every recorded step. Use 1 to measure everything at every recorded step (the ``model.gradient_flow``
        check does).
    detail
        Also record the mean and max absolute gradient entry per parameter (two more passes over the gradients;
        the gradient-flow check turns it on for its bar chart).
    capacity
        Initial number of recorded steps to preallocate (grows by doubling, without a host sync).
    callback
        Optional ``callback({"step": optimizer step, "monitor": self})`` after each recorded step (a live display,
        e.g. ``tropt.widgets.GradientFlowPanel.attach``); it may raise :class:`tropt.errors.Cancelled` to stop.

    Per recorded step and parameter: gradient L2 norm (NaN when the parameter has no gradient), count of
    non-finite gradient entries, and on ``full_every`` rows the parameter L2 norm (after the step), update L2 norm
    and count of non-zero gradient entries. :attr:`passes` counts the passes over gradient- and parameter-sized
    memory made so far (a read or a write of every watched tensor once is one pass).
    """

    def __init__(self, model: nn.Module, every: int = 1, *, optimizer: torch.optim.Optimizer | None = None,
                 track_updates: bool = True, full_every: int = 10, detail: bool = False, capacity: int = 64,
                 callback: Any = None) -> None:
        if not isinstance(model, nn.Module):
            raise TroptError(f"GradientMonitor: model is a {type(model).__name__}, expected a torch.nn.Module",
                             "pass the model you train: GradientMonitor(model)")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise TroptError(f"GradientMonitor: every={every!r}; it must be an integer >= 1",
                             "use every=1 to record each step")
        if isinstance(full_every, bool) or not isinstance(full_every, int) or full_every < 1:
            raise TroptError(f"GradientMonitor: full_every={full_every!r}; it must be an integer >= 1",
                             "use full_every=1 to measure every statistic at every recorded step")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TroptError(f"GradientMonitor: optimizer is a {type(optimizer).__name__}, "
                             "expected a torch.optim.Optimizer",
                             "pass the optimizer, "
                             "or leave it out to watch any optimizer holding the model's parameters")
        self.model = model
        self.every = every
        self.optimizer = optimizer
        self.track_updates = track_updates
        self.full_every = full_every
        self.detail = detail
        self.callback = callback
        self._capacity = max(1, int(capacity))
        self._handles: list[Any] = []
        self._active = False
        self.names: list[str] = []
        self.frozen: list[str] = []
        self.module_order: list[str] = []  # modules owning watched parameters, in first-forward order
        self.steps_seen = 0  # optimizer steps observed (recorded or not)
        self.recorded_steps: list[int] = []  # the optimizer-step index of each recorded row
        self.grad_seen: np.ndarray = np.zeros(0, dtype=np.int64)  # per parameter: recorded steps with a .grad
        self.in_optimizer: np.ndarray = np.zeros(0, dtype=bool)
        self.lr_nonzero: np.ndarray = np.zeros(0, dtype=bool)  # per parameter: stepped with a non-zero lr at least once
        self._data: torch.Tensor | None = None
        self._prev: dict[int, torch.Tensor] = {}
        self._rows = 0
        self.passes: dict[str, float] = {"gradients": 0.0, "parameters": 0.0}
        self.logged_rows = 0  # recorded steps whose global gradient norm log_to has written

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> GradientMonitor:
        if self._active:
            raise TroptError("GradientMonitor is already active",
                             "enter it once: with GradientMonitor(model) as mon: ...")
        named = [(n, p) for n, p in self.model.named_parameters()]
        if not named:
            raise TroptError("GradientMonitor: the model has no parameters, so there are no gradients to watch",
                             "pass the module that holds the weights")
        self.frozen = [n for n, p in named if not p.requires_grad]
        # Frozen now, watched from the step they become trainable (gradual unfreezing): see _watch_unfrozen.
        self._late = [(n, p) for n, p in named if not p.requires_grad]
        watched = [(n, p) for n, p in named if p.requires_grad]
        self.names = [n for n, _ in watched]
        self._params: list[torch.Tensor] = [p for _, p in watched]
        self._pid = {id(p): i for i, p in enumerate(self._params)}
        self._numel = torch.tensor([p.numel() for p in self._params], dtype=torch.float64)
        self.grad_seen = np.zeros(len(self._params), dtype=np.int64)
        self.in_optimizer = np.zeros(len(self._params), dtype=bool)
        self.lr_nonzero = np.zeros(len(self._params), dtype=bool)
        self.steps_seen = 0
        self.recorded_steps = []
        self._rows = 0
        self.logged_rows = 0
        self.passes = {"gradients": 0.0, "parameters": 0.0}
        self._total_numel = max(1.0, float(self._numel.sum()))
        self._frac_cache: dict[tuple[int, ...], float] = {}
        self._index_cache: dict[tuple[int, ...], torch.Tensor] = {}
        self._devices = {p.device for p in self._params}
        device = self._params[0].device if self._params else torch.device("cpu")
        self._device = device if len(self._devices) == 1 else torch.device("cpu")
        self._data = torch.full((self._capacity, len(self._params), len(FIELDS)), float("nan"),
                                dtype=torch.float32, device=self._device)
        self._prev = {}  # parameter index -> its value before the step (update norms)
        self._pending: tuple[int, list[int], list, bool] | None = None
        self._layouts: dict[int, tuple] = {}
        self._depth: dict[int, int] = {}  # optimizer id -> step() calls in progress
        self._all_in_optimizer = False
        self._outside = list(range(len(self._params)))
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._pre_hook))
            self._handles.append(self.optimizer.register_step_post_hook(self._post_hook))
        else:
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            self._handles.append(register_optimizer_step_pre_hook(self._pre_hook))
            self._handles.append(register_optimizer_step_post_hook(self._post_hook))
        # Learn the forward order of the parameter-owning modules from the first forward, then stop listening.
        owners = {}
        for mname, module in self.model.named_modules():
            if any(True for p in module.parameters(recurse=False) if p.requires_grad):
                owners[module] = mname
        self.module_order = []
        self._order_handles = []
        for module, mname in owners.items():
            self._order_handles.append(module.register_forward_pre_hook(self._order_hook(mname)))
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Remove every hook (idempotent); the recorded statistics stay readable."""
        for h in self._handles + getattr(self, "_order_handles", []):
            h.remove()
        self._handles, self._order_handles = [], []
        self._prev = {}
        self._active = False

    def _order_hook(self, mname: str):
        def hook(module: nn.Module, args: Any) -> None:
            if mname not in self.module_order:
                self.module_order.append(mname)
            if len(self.module_order) == len(self._order_handles):
                for h in self._order_handles:
                    h.remove()
        return hook

    # ------------------------------------------------------------------ recording
    def _layout(self, optimizer: torch.optim.Optimizer) -> tuple[list[int], list[list[int]]]:
        """The watched parameters ``optimizer`` holds, overall and per group; cached until its groups change.

        The hooks run at every step of every optimizer, so this keeps their Python work independent of the model's
        parameter count.
        """
        groups = optimizer.param_groups
        key = tuple((id(g["params"]), len(g["params"])) for g in groups)
        hit = self._layouts.get(id(optimizer))
        if hit is not None and hit[0] == key:
            return hit[1], hit[2]
        per_group = [[self._pid[id(p)] for p in g["params"] if id(p) in self._pid] for g in groups]
        mine = [i for idx in per_group for i in idx]
        self._layouts[id(optimizer)] = (key, mine, per_group)
        return mine, per_group

    def _watch_unfrozen(self) -> None:
        """Start watching the parameters frozen at entry that are trainable now (see :func:`._monitor_unfreeze`)."""
        if self._late and any(p.requires_grad for _, p in self._late):
            watch_unfrozen(self)

    @owned_hook("gradient monitor (its optimizer-step pre-hook)")
    def _pre_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._watch_unfrozen()
        idx, per_group = self._layout(optimizer)
        if not idx:
            return
        # A subclass whose step() calls super().step() fires the global hooks twice, nested: one optimizer step. So
        # does a wrapper's step() stepping the optimizer it wraps (Lookahead): watching every optimizer, one depth.
        key = id(optimizer) if self.optimizer is not None else 0
        depth = self._depth.get(key, 0)
        self._depth[key] = depth + 1
        if depth:
            return
        step = self.steps_seen
        self.steps_seen += 1
        if not self._all_in_optimizer:
            self.in_optimizer[idx] = True
            self._all_in_optimizer = bool(self.in_optimizer.all())
            self._outside = [i for i in range(len(self._params)) if not self.in_optimizer[i]]
        for g, gidx in zip(optimizer.param_groups, per_group):  # a parameter whose group has lr 0 never moves
            # An lr tropt cannot read (NaN: a None the optimizer schedules itself) is not known to be 0.
            if gidx and group_lr(optimizer, g) != 0.0:
                self.lr_nonzero[gidx] = True
        if step % self.every:
            return
        self._record_grads(step, idx, optimizer)

    def _count(self, kind: str, idx: Sequence[int], times: int = 1) -> None:
        """Add ``times`` passes over the memory of parameters ``idx`` (a fraction of all watched ones) to
        :attr:`passes`."""
        key = tuple(idx)
        frac = self._frac_cache.get(key)
        if frac is None:
            frac = self._frac_cache[key] = float(self._numel[list(key)].sum()) / self._total_numel if key else 0.0
        self.passes[kind] += times * frac

    def _record_grads(self, step: int, opt_idx: list[int], optimizer: torch.optim.Optimizer | None = None) -> None:
        assert self._data is not None  # allocated by __enter__, which registers the hooks that call this
        if self._rows == self._data.shape[0]:
            grown = torch.full((2 * self._rows, *self._data.shape[1:]), float("nan"), dtype=self._data.dtype,
                               device=self._device)
            grown[: self._rows] = self._data
            self._data = grown
        row = self._data[self._rows]
        full = self._rows % self.full_every == 0
        have = [i for i, p in enumerate(self._params) if p.grad is not None]
        self.grad_seen[have] += 1
        if have:
            # `have`: only those with a .grad; a sparse one is read through its values (same norms and counts).
            grads = [norm_view(cast("torch.Tensor", self._params[i].grad)) for i in have]
            # With every parameter holding a gradient (the usual case) the row's columns are written directly.
            idx = None if len(have) == len(self._params) else self._index(tuple(have))

            def put(col: int, values: torch.Tensor) -> None:
                if idx is None:
                    row[:, col].copy_(values)
                else:
                    row[:, col].index_copy_(0, idx, values)

            # The one pass every recorded step makes: L2 norms, whose finiteness also flags NaN/inf entries.
            norms = self._stack(torch._foreach_norm(grads))
            put(0, norms)
            self._count("gradients", have)
            if self._device.type == "cpu":
                # On CPU reading a number is not a device sync, so the non-finite entries are counted (another pass)
                # only when the norms say there are some.
                if full:
                    put(3, torch.stack([_count_nonzero(g) for g in grads]).float())
                    self._count("gradients", have)
                if math.isfinite(float(norms.sum())):
                    put(4, torch.zeros(len(have)))
                else:
                    put(4, torch.stack([(~torch.isfinite(g)).sum() for g in grads]).float())
                    self._count("gradients", have)
            else:
                # On accelerators everything stays on the device, batched: no host sync per step.
                if full:
                    put(3, self._stack(torch._foreach_norm(grads, 0)))
                    self._count("gradients", have)
                # NaN * 0 and inf * 0 are NaN, finite * 0 is 0: the non-zero count of g * 0 counts non-finite entries.
                put(4, self._stack(torch._foreach_norm(torch._foreach_mul(grads, 0.0), 0)))
                self._count("gradients", have, 3)
            if self.detail:
                put(5, self._stack(torch._foreach_norm(grads, 1)))
                put(6, self._stack(torch._foreach_norm(grads, float("inf"))))
                self._count("gradients", have, 2)
        self.recorded_steps.append(step)
        measure = self.track_updates and full and bool(opt_idx)
        copy_idx, rules = [], []
        if measure:
            rules = sgd_update_rules(optimizer, opt_idx, self._pid, self._params) if optimizer is not None else []
            ruled = {i for _, members, _ in rules for i in members}
            copy_idx = [i for i in opt_idx if i not in ruled]
        if copy_idx:
            flat_copies(self._params, copy_idx, self._prev)
            with torch.no_grad():
                torch._foreach_copy_([self._prev[i] for i in copy_idx], [self._params[i] for i in copy_idx])
            self._count("parameters", copy_idx, 2)  # read the parameters, write the copy
        self._pending = (self._rows, copy_idx, rules, full)
        self._rows += 1

    @owned_hook("gradient monitor (its optimizer-step post-hook)")
    def _post_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._layout(optimizer)[0]:
            return
        key = id(optimizer) if self.optimizer is not None else 0
        depth = self._depth.get(key, 0) - 1
        self._depth[key] = max(depth, 0)
        if depth > 0 or self._pending is None:  # the inner call of a nested step, or a step not recorded
            return
        row_i, copy_idx, rules, full = self._pending
        self._pending = None
        assert self._data is not None  # a pending row was written by _record_grads
        row = self._data[row_i]
        with torch.no_grad():
            if full:
                row[:, 1].copy_(self._stack(torch._foreach_norm(self._params)))
                self._count("parameters", range(len(self._params)))
            if copy_idx:
                prev = [self._prev[i] for i in copy_idx]
                torch._foreach_sub_(prev, [self._params[i] for i in copy_idx])
                row[:, 2].index_copy_(0, self._index(tuple(copy_idx)), self._stack(torch._foreach_norm(prev)))
                self._count("parameters", copy_idx, 4)  # read both, write the difference, read it for its norm
            for rule, members, group in rules:
                self._rule_update(row, rule, members, group, optimizer)

        # Parameters outside every optimizer that stepped are not updated by it: their update is exactly 0
        # unless another optimizer steps them (then its own row fills it).
        if (copy_idx or rules) and self._outside:
            row[:, 2].index_fill_(0, self._index(tuple(self._outside)), 0.0)
        if self.callback is not None:
            self.callback({"step": self.steps_seen - 1, "monitor": self})

    def _rule_update(self, row: torch.Tensor, rule: str, members: list[int], group: dict,
                     optimizer: torch.optim.Optimizer) -> None:
        """Write ``lr * ||d||`` for one SGD group (see :func:`.update_norms.sgd_update_rules`); 0 for parameters
        the step skipped."""
        lr = float(group["lr"])
        stepped = [i for i in members if self._params[i].grad is not None]
        values = torch.zeros(len(members), device=self._device)
        if stepped:
            if rule == "gradient":  # the gradient norms this step already measured
                norms = row[:, 0].index_select(0, self._index(tuple(stepped)))
            else:
                bufs = [optimizer.state[self._params[i]].get("momentum_buffer") for i in stepped]
                if any(b is None for b in bufs):
                    return  # the optimizer did not keep its buffer: leave the update unmeasured (NaN)
                norms = self._stack(torch._foreach_norm(bufs))
                self._count("parameters", stepped)
            pos = self._index(tuple(members.index(i) for i in stepped))
            values.index_copy_(0, pos, norms.to(values.device) * lr)
        row[:, 2].index_copy_(0, self._index(tuple(members)), values)

    def record(self) -> None:
        """Record the current gradients by hand (for loops that update parameters without a torch optimizer).

        Gradient norms at each recorded step, parameter norms on ``full_every`` rows; the update is not measured.
        """
        if not self._active:
            raise TroptError("GradientMonitor.record() called outside the monitor",
                             "use it inside: with GradientMonitor(model) as mon: ...")
        self._watch_unfrozen()
        step = self.steps_seen
        self.steps_seen += 1
        if step % self.every:
            return
        self._record_grads(step, [])
        assert self._pending is not None and self._data is not None  # _record_grads always sets both
        row_i, _, _, full = self._pending
        self._pending = None
        if full:
            with torch.no_grad():
                self._data[row_i][:, 1].copy_(self._stack(torch._foreach_norm([p.detach() for p in self._params])))
            self._count("parameters", range(len(self._params)))
        if self.callback is not None:
            self.callback({"step": step, "monitor": self})

    def passes_per_step(self) -> dict[str, float]:
        """Mean passes over gradient- and parameter-sized memory per recorded step so far (see :attr:`passes`)."""
        n = max(1, self._rows)
        return {k: v / n for k, v in self.passes.items()}

    def _stack(self, tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
        out = torch.stack([t.to(self._device) for t in tensors]) if len(self._devices) > 1 else torch.stack(tensors)
        return out.float()

    def _index(self, idx: tuple[int, ...]) -> torch.Tensor:
        t = self._index_cache.get(idx)
        if t is None:
            t = self._index_cache[idx] = torch.tensor(idx, dtype=torch.long, device=self._device)
        return t

    # ------------------------------------------------------------------ reading (host sync happens here)
    @property
    def memory_bytes(self) -> int:
        """Device memory the monitor holds: the record tensor plus the copy of parameters for update norms."""
        total = 0 if self._data is None else self._data.numel() * self._data.element_size()
        total += sum(t.numel() * t.element_size() for t in self._prev.values())
        return total

    def array(self, start: int = 0) -> np.ndarray:
        """The recorded statistics as a numpy array of shape (recorded steps, parameters, fields), from row ``start``
        (a live reader copies only the rows it has not seen)."""
        if self._data is None:
            return np.zeros((0, 0, len(FIELDS)))
        return self._data[start: self._rows].detach().cpu().double().numpy()

    @property
    def rows(self) -> int:
        """Number of recorded steps so far."""
        return self._rows

    def log_to(self, target: Any, step: int | None = None, *, prefix: str = "tropt", figures: bool = True,
               **thresholds: Any) -> Any:
        """Write what the monitor saw to TensorBoard, MLflow or W&B: the ``model.gradient_flow`` verdict (text),
        the global gradient norm at each recorded step not logged before, per-layer gradient RMS, and the gradient
        flow figure.

        ``target``: a ``SummaryWriter``, ``"mlflow"`` (the active run) or an MLflow run, ``"wandb"`` or a W&B run, a
        Lightning logger, or a list of these (see :func:`tropt.sinks.as_sink`). ``step`` defaults to the
        optimizer steps seen. Returns the verdict (a :class:`tropt.CheckResult`).
        """
        from ..sinks import as_sink, log_monitor

        sink = as_sink(target)
        try:
            return log_monitor(self, sink, self.steps_seen if step is None else int(step), prefix=prefix,
                               figures=figures, **thresholds)
        finally:
            sink.close()

    def frame(self) -> pd.DataFrame:
        """One row per (recorded step, parameter): grad/param/update norms and ratios, zero fraction, non-finite.

        ``param_norm``, ``update_norm``, ``update_ratio`` and ``zero_fraction`` are NaN except on ``full_every`` rows.
        """
        data = self.array()
        steps, n, _ = data.shape
        numel = self._numel.numpy() if self.names else np.zeros(0)
        with np.errstate(divide="ignore", invalid="ignore"):
            df = pd.DataFrame({
                "step": np.repeat(np.asarray(self.recorded_steps[:steps], dtype=np.int64), n),
                "name": np.tile(np.asarray(self.names, dtype=object), steps),
                "numel": np.tile(numel, steps).astype(np.int64),
                "grad_norm": data[:, :, 0].ravel(),
                "grad_rms": (data[:, :, 0] / np.sqrt(numel)).ravel(),
                "param_norm": data[:, :, 1].ravel(),
                "update_norm": data[:, :, 2].ravel(),
                "update_ratio": (data[:, :, 2] / data[:, :, 1]).ravel(),
                "zero_fraction": (1.0 - data[:, :, 3] / numel).ravel(),
                "nonfinite": data[:, :, 4].ravel(),
            })
            if self.detail:
                df["grad_abs_mean"] = (data[:, :, 5] / numel).ravel()
                df["grad_abs_max"] = data[:, :, 6].ravel()
        return df

    def global_norms(self) -> np.ndarray:
        """Global gradient L2 norm (over all watched parameters with a gradient) at each recorded step."""
        data = self.array()
        if data.size == 0:
            return np.zeros(0)
        g = data[:, :, 0]
        has = ~np.isnan(g) | (data[:, :, 4] > 0)
        sq = np.where(has, g, 0.0) ** 2
        return np.sqrt(sq.sum(axis=1))

    def summary(self) -> pd.DataFrame:
        """One row per parameter over all recorded steps (what the gradient-flow check judges)."""
        return parameter_summary(self)

    def result(self, **thresholds: Any):
        """Judge the recorded steps with the ``model.gradient_flow`` rules; returns a :class:`tropt.CheckResult`."""
        return judge_gradient_flow(self, **thresholds)

    def __repr__(self) -> str:
        state = "active" if self._active else "closed"
        return (f"<GradientMonitor {state}: {len(self.names)} parameters, "
                f"{self._rows} recorded steps of {self.steps_seen}>")
