"""``loop.train_mode``: do dropout and batch-norm run in training mode while the user's step trains, and in eval
mode while the metric evaluates? (Karpathy: "forgot to toggle train/eval mode".)

The user's own step runs on a fresh copy (``setup.build()`` keeps the mode the model was handed over in, and tropt
switches no mode itself); forward pre-hooks on every mode-dependent module (dropout with p > 0, attention dropout,
batch norms that track running statistics) record the mode each forward ran in, and an
``Optimizer.register_step_pre_hook`` attributes those forwards to the update they fed (every call counts as an
update when there is no optimizer). FAIL, naming the modules, when any ran in eval mode during a training step.
Modules frozen on purpose (their parameters, or their parent's when they have none, all ``requires_grad=False``,
e.g. a frozen backbone's BatchNorm) are listed, not failed. So are modules held in eval mode on purpose with trainable
affine weights: those the model's own ``train()`` leaves in eval mode (mmdetection's ``norm_eval=True``: the
backbone's ``train()`` override puts every BatchNorm back in eval on every call; tropt calls ``train()`` on its copy
after the steps and reads which modules stay in eval), and those the user declares (``held_in_eval=[...]``: module
names or prefixes, for a step that calls ``model.apply(set_bn_eval)`` itself).

With ``Setup(metric=...)`` and ``val_data`` the reverse is checked too: the metric runs twice on one copy in eval mode
(as tropt calls it); WARN when a mode-dependent module runs in training mode during it (the metric switches the model
to train: dropout makes two evaluations differ, batch norm updates its running statistics).

Eval mode must be deterministic, with or without dropout modules: the Setup's loss is evaluated twice on one copy in
eval mode on the same batch. WARN when they differ and functional dropout that ignores the mode is found
(``F.dropout(x, p)``, whose training flag defaults to True; ``scaled_dot_product_attention(dropout_p=p)`` without
``if self.training``), naming each call and its module. A difference from random draws in the loss (diffusion noise:
from one RNG state the evaluations agree) is a note, not a finding.

Cost: ``steps`` (2) calls of the user's step, two (four when they differ) eval-mode losses and two evaluations of the
metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from ..core.capture import on_update, stepping_optimizers
from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from ._eval_determinism import EvalProbe, probe_eval_mode
from ._verdicts import require_steps

if TYPE_CHECKING:
    from ..setup import Setup

CHECK = "loop.train_mode"


def mode_dependent(model: nn.Module) -> dict[str, nn.Module]:
    """Modules whose output depends on train/eval mode: dropout (p > 0), attention dropout, tracking batch norms."""
    out = {}
    for name, m in model.named_modules():
        dropout = isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
        attention = isinstance(m, nn.MultiheadAttention) and m.dropout
        norm = isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats and m.running_mean is not None
        if dropout or attention or norm:
            out[name or "(model)"] = m
    return out


def reads_training_flag(model: nn.Module) -> dict[str, nn.Module]:
    """Modules of no known mode-dependent type whose own ``forward`` reads ``self.training`` (functional dropout
    ``F.dropout(x, p, training=self.training)`` as in pygcn and pyg's examples, stochastic depth or noise written
    with ``if self.training:``): candidates, confirmed by :func:`mode_changes_loss`."""
    import inspect

    out = {}
    for name, m in model.named_modules():
        forward = type(m).forward
        if getattr(forward, "__module__", "").startswith("torch.nn."):
            continue  # torch's own modules: the known types above cover those that depend on the mode
        try:
            source = inspect.getsource(forward)
        except (OSError, TypeError):
            continue
        if "self.training" in source:
            out[name or "(model)"] = m
    return out


def mode_changes_loss(setup: Setup, batch: Any, seed: int = 0) -> bool:
    """Whether ``loss_fn`` on one batch differs between train and eval mode from the same RNG state (a fresh copy,
    under no_grad): the model depends on the mode even without a dropout or batch-norm module."""
    ctx = setup.build()
    values = []
    for train in (True, False):
        ctx.model.train(train)
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(seed)
            try:
                values.append(float(setup.loss(ctx.model, batch).detach().float()))
            except Exception:  # noqa: BLE001 - a loss that cannot run in one mode: no evidence either way
                return False
    return values[0] != values[1] and all(v == v for v in values)


def _frozen(model: nn.Module, name: str, module: nn.Module) -> bool:
    """Frozen on purpose: its own parameters all ``requires_grad=False``; for a module without parameters (dropout,
    non-affine norms), those of its parent (the root model does not count as a parent)."""
    own = list(module.parameters(recurse=False))
    if own:
        return not any(p.requires_grad for p in own)
    if "." not in name:
        return False
    parent = model.get_submodule(name.rsplit(".", 1)[0])
    params = list(parent.parameters())
    return bool(params) and not any(p.requires_grad for p in params)


def held_by_train(model: nn.Module, watched: dict[str, nn.Module]) -> set[str]:
    """The watched modules the model's own ``train()`` leaves in eval mode: held in eval by design (mmdet's
    ``norm_eval``). Calls ``model.train()`` on tropt's copy, so only after its steps ran."""
    try:
        model.train()
    except Exception:  # noqa: BLE001 - a train() override that fails on a copy holds nothing by design
        return set()
    return {n for n, m in watched.items() if not m.training}


def _declared(model: nn.Module, watched: dict[str, nn.Module], held_in_eval: Sequence[str]) -> set[str]:
    """The watched modules named (or under a name) in ``held_in_eval``; a TroptError for a name the model lacks."""
    names = {n for n, _ in model.named_modules()}
    unknown = [h for h in held_in_eval if h not in names]
    if unknown:
        raise TroptError(f"loop.train_mode: held_in_eval names {', '.join(map(repr, unknown))}, not a module of the "
                         "model", "pass module names as model.named_modules() gives them (a name covers the modules "
                         "under it), e.g. held_in_eval=['backbone']")
    return {n for n in watched if any(n == h or n.startswith(h + ".") for h in held_in_eval)}


def _mode(flag: bool | None) -> str:
    return "not run" if flag is None else ("train" if flag else "eval")


class ModeRecorder:
    """Context manager: forward pre-hooks recording the mode each watched module ran in, grouped by update.

    ``optimizer`` is one optimizer or a sequence of them (a GAN's D and G: every optimizer's step closes an update).
    With ``params`` (the model's parameters), an optimizer not given that holds one of them (one the step builds
    during the call) closes an update too."""

    def __init__(self, modules: dict[str, nn.Module], optimizer: Any = None, params: Sequence[Any] = (),
                 grad_only: Sequence[str] = ()) -> None:
        self.modules = modules
        # grad_only: names of trainable modules whose forwards count only with gradients enabled. Such a forward
        # under torch.no_grad() cannot feed an update (a validation pass the step runs after optimizer.step(), as
        # pygcn's train() does in eval mode); without this it is filed under the next update and reads as "ran in
        # eval while training". A frozen teacher's forward under no_grad does feed it (its outputs are targets):
        # still recorded.
        self.grad_only = set(grad_only)
        self.optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else (
            [] if optimizer is None else [optimizer])
        self.optimizer = self.optimizers[0] if self.optimizers else None
        self.params = {id(p) for p in params}
        self.pending: dict[str, set[bool]] = {}
        self.updates: list[dict[str, set[bool]]] = []
        self.at_step: dict[str, bool] = {}
        self._known: set[int] = set()
        self._depth = 0

    def _pre(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if name in self.grad_only and not torch.is_grad_enabled():
                return
            self.pending.setdefault(name, set()).add(bool(module.training))
        return hook

    def _step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.at_step = {n: bool(m.training) for n, m in self.modules.items()}
        self.flush()

    def flush(self) -> None:
        """Close the current update (called at optimizer.step(), or after each call without an optimizer)."""
        if self.pending:
            self.updates.append(self.pending)
        self.pending = {}

    def _foreign_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer not hooked by name that holds a model parameter (built by the step): its update counts."""
        if id(optimizer) in self._known or not any(id(p) in self.params for g in optimizer.param_groups
                                                   for p in g["params"]):
            return
        self._depth += 1
        if self._depth == 1:  # a step nested in it (a wrapper's) is the same update
            self._step(optimizer, args, kwargs)

    def _foreign_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if id(optimizer) not in self._known and self._depth:
            self._depth -= 1

    def __enter__(self) -> ModeRecorder:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.handles = [m.register_forward_pre_hook(self._pre(n)) for n, m in self.modules.items()]
        for opt in self.optimizers:
            reach = {id(o) for o in stepping_optimizers(opt)}
            if not reach & self._known:  # one wrapping an optimizer already hooked makes the same updates
                self.handles += on_update(opt, self._step)
            self._known |= reach
        if self.params:
            self.handles += [register_optimizer_step_pre_hook(self._foreign_pre),
                             register_optimizer_step_post_hook(self._foreign_post)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()

    def modes(self, updates: list[dict[str, set[bool]]] | None = None) -> dict[str, bool | None]:
        """Per module: True when it always ran in train mode, False when it ran in eval at least once, None if never
        run."""
        seen: dict[str, set[bool]] = {}
        for u in self.updates if updates is None else updates:
            for n, s in u.items():
                seen.setdefault(n, set()).update(s)
        return {n: (None if n not in seen else all(seen[n])) for n in self.modules}


def _names(names: list[str], limit: int = 5) -> str:
    return ", ".join(repr(n) for n in names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


@register(CHECK, title="Train mode in the step, eval mode in the metric",
          description="dropout/batch-norm modules run in train mode during the user's step (and in eval mode during "
                      "the metric)",
          plot="tropt.plots.contract")
def check_train_mode(setup: Setup, *, steps: int = 2, held_in_eval: Sequence[str] = (),
                     progress: bool = True) -> CheckResult:
    """Run the user's step ``steps`` times and the metric twice, recording the mode of every mode-dependent module.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`.
    steps
        Calls of the user's step (each one optimizer step of ``accumulation_steps`` micro-batches).
    held_in_eval
        Names of modules (from ``model.named_modules()``; a name covers the modules under it) the step keeps in eval
        mode on purpose, e.g. a step that calls ``model.apply(set_bn_eval)``: listed, not failed. Modules the model's
        own ``train()`` keeps in eval (mmdet's ``norm_eval``) are recognised without it.
    progress
        Unused (the check is quick); accepted for uniformity.
    """
    if steps < 1:
        raise TroptError(f"check_train_mode needs steps >= 1 (got {steps})", "use steps=2")
    if isinstance(held_in_eval, str):
        held_in_eval = [held_in_eval]
    setup.validate()
    with preserved(setup.model):
        observed = _observe_modes(setup, steps, tuple(held_in_eval))
    return observed if isinstance(observed, CheckResult) else _train_mode_verdict(observed, steps)


@dataclass
class _Observed:
    """The modes the mode-dependent modules ran in: handed over, during the step, during the metric."""

    watched: dict[str, nn.Module]
    handed: dict[str, bool]
    stepped: bool  # the context has an optimizer: forwards are grouped by optimizer.step()
    calls: list[int]
    during: dict[str, bool | None]
    at_step: dict[str, bool]
    frozen: dict[str, bool]
    held: dict[str, str]  # module -> "train()" (held in eval by the model's own train()) or "declared"
    metric_modes: dict[str, bool | None] | None
    scores: tuple[float, float] | None
    metric_note: str
    probe: EvalProbe


def _observe_modes(setup: Setup, steps: int, held_in_eval: tuple[str, ...] = ()) -> CheckResult | _Observed:
    """Run the user's step ``steps`` times on a fresh copy and the metric twice, recording every module's mode."""
    k = setup.accumulation_steps
    batches = list(setup.batches(steps))  # one read of the data: the eval-mode probe evaluates on the first batch
    probe = probe_eval_mode(setup, batches[0])
    ctx = setup.build()
    watched = mode_dependent(ctx.model)
    declared = _declared(ctx.model, watched, held_in_eval)
    if not watched:
        # No dropout or batch-norm module, but a forward that reads self.training (functional dropout): watch those
        # modules when the mode does change the loss, so a step left in eval mode is still seen.
        readers = reads_training_flag(ctx.model)
        if readers and mode_changes_loss(setup, batches[0], setup.seed):
            watched = readers
            declared = _declared(ctx.model, watched, held_in_eval)
    if not watched:
        return _without_modules(probe)
    handed = {n: bool(m.training) for n, m in watched.items()}
    # Every optimizer's step closes an update: the Setup's (a GAN's D and G), those the step keeps on ctx, and one
    # it builds during a call (it holds the model's parameters).
    optimizers = [o for _, o in ctx.all_optimizers()] if hasattr(ctx, "all_optimizers") else []
    optimizer = optimizers[0] if optimizers else None
    calls = []
    trainable = [n for n, m in watched.items() if not _frozen(ctx.model, n, m)]
    with ModeRecorder(watched, optimizers, list(ctx.model.parameters()), grad_only=trainable) as rec:
        for batch in batches:
            before = len(rec.updates)
            setup.run_step(ctx, setup.split(batch, k))
            if optimizer is None:
                rec.flush()
            calls.append(len(rec.updates) - before)
    if optimizer is not None:
        require_steps(setup, calls, f"{steps} step(s)")
    during = rec.modes()
    frozen = {n: _frozen(ctx.model, n, m) for n, m in watched.items()}
    by_train = held_by_train(ctx.model, watched)
    held = {n: "train()" if n in by_train else "declared" for n in watched if n in by_train or n in declared}
    metric_modes, scores, metric_note = _metric_modes(setup)
    return _Observed(watched, handed, optimizer is not None, calls, during, rec.at_step, frozen, held, metric_modes,
                     scores, metric_note, probe)


def _without_modules(probe: EvalProbe) -> CheckResult:
    """A model without dropout or batch-norm modules: a WARN when functional dropout makes eval mode random, else
    SKIP (the mode does not change its step), saying what the eval-mode probe found."""
    metrics = {"mode_dependent_modules": 0, **probe.metrics()}
    if probe.warns:
        return CheckResult(CHECK, Status.WARN, f"{probe.finding()}; the model has no dropout module for model.eval() "
                           "to switch off", metrics, {"functional_dropout": probe.dropout}, [probe.ADVICE])
    seen = probe.note() or ("" if probe.error else "two evaluations in eval mode agree")
    return CheckResult(CHECK, Status.SKIP, "the model has no dropout or batch-norm module: train/eval mode does not "
                       "change its step" + (f" ({seen})" if seen else ""), metrics)


_HELD = {"train()": "held in eval by train(): listed", "declared": "declared held in eval: listed"}
DRIFTING = "frozen, statistics still updating"


def _verdict(o: _Observed, n: str) -> str:
    """One module's verdict: not run, ok (train mode), frozen or held in eval on purpose (listed), or a finding."""
    if o.during[n] is None:
        return "not run"
    if o.during[n]:
        return DRIFTING if o.frozen[n] and isinstance(o.watched[n], nn.modules.batchnorm._NormBase) else "ok"
    if o.frozen[n]:
        return "frozen: listed"
    return _HELD[o.held[n]] if n in o.held else "eval while training"


def _listed_notes(rows: list[dict[str, Any]]) -> list[str]:
    """The notes naming the modules in eval mode on purpose: frozen, held by the model's train(), declared."""
    notes = []
    for verdict, what in (("frozen: listed", "frozen module(s) in eval mode on purpose"),
                          (_HELD["train()"], "module(s) with trainable weights held in eval mode by the model's own "
                                             "train() (frozen BatchNorm statistics, as mmdet's norm_eval=True)"),
                          (_HELD["declared"], "module(s) declared held in eval (held_in_eval)")):
        names = [r["module"] for r in rows if r["verdict"] == verdict]
        if names:
            notes.append(f"{len(names)} {what}: {_names(names)}")
    return notes


def _train_mode_verdict(o: _Observed, steps: int) -> CheckResult:
    rows: list[dict[str, Any]] = []
    for n, m in o.watched.items():
        row = {"module": n, "type": type(m).__name__, "handed_over": _mode(o.handed[n]), "in_step": _mode(o.during[n]),
               "at_optimizer_step": _mode(o.at_step.get(n)) if o.at_step else "n/a", "frozen": o.frozen[n],
               "held_in_eval": o.held.get(n, ""), "verdict": _verdict(o, n)}
        if o.metric_modes is not None:
            row["in_metric"] = _mode(o.metric_modes.get(n))
        rows.append(row)
    bad = [r["module"] for r in rows if r["verdict"] == "eval while training"]
    listed = [r["module"] for r in rows if r["verdict"].endswith(": listed")]
    metrics: dict[str, Any] = {"mode_dependent_modules": len(o.watched), "eval_in_training": len(bad),
                               "frozen_in_eval": sum(r["verdict"] == "frozen: listed" for r in rows),
                               "held_in_eval": sum(r["verdict"] in _HELD.values() for r in rows), "steps": steps,
                               "updates_observed": sum(o.calls),
                               "grouped_by": "optimizer.step()" if o.stepped else "call of the step (no optimizer)"}
    notes = _listed_notes(rows)
    advice: list[str] = []
    if bad:
        left_on = [n for n in bad if not o.handed[n]]
        if left_on and len(left_on) == len(bad):
            why = "the model was handed over in eval mode and your step never switches it back (a model.eval() left on)"
        else:
            why = "your step switches them to eval mode (model.eval() inside the step)"
        status = Status.FAIL
        summary = (f"{len(bad)} dropout/batch-norm module(s) run in eval mode while your step trains: "
                   f"{_names(bad)}; {why}")
        advice.append("Call model.train() before the training steps (after every validation pass that called "
                      "model.eval()); tropt.standard_step does not switch modes. To freeze a part on purpose, set "
                      "requires_grad=False on it too, and it is listed instead; to keep BatchNorm statistics frozen "
                      "while its weights train, do it in the module's train() (as mmdet's norm_eval) or pass "
                      "options={'loop.train_mode': {'held_in_eval': [...]}}.")
    else:
        ran = sum(v is not None for v in o.during.values()) - len(listed)
        status = Status.PASS
        summary = f"the {ran} trainable dropout/batch-norm module(s) run in train mode during your step"
    status, summary = _drift_finding(rows, status, summary, metrics, advice)
    status, summary = _metric_finding(o, status, summary, metrics, notes, advice)
    tables = {"modules": pd.DataFrame(rows)}
    status, summary = _probe_finding(o.probe, status, summary, metrics, tables, notes, advice)
    if o.metric_note:
        notes.append(o.metric_note)
    if notes:
        summary += " (" + "; ".join(notes) + ")"
    return CheckResult(CHECK, status, summary, metrics, tables, advice)


def _drift_finding(rows: list[dict[str, Any]], status: Status, summary: str, metrics: dict,
                   advice: list[str]) -> tuple[Status, str]:
    """A WARN for batch norms frozen by intent (requires_grad=False) that run in train mode: their running
    statistics keep moving with every batch, so the "frozen" part changes after all."""
    drifting = [r["module"] for r in rows if r["verdict"] == DRIFTING]
    metrics["frozen_in_train"] = len(drifting)
    if not drifting:
        return status, summary
    sentence = (f"{len(drifting)} batch-norm module(s) frozen by intent (requires_grad=False) run in train mode: "
                f"{_names(drifting)}; their running statistics still update with every batch, so the frozen part "
                "changes after all")
    advice.append("Keep frozen batch norms in eval mode: put the frozen stages back in eval after every "
                  "model.train() (override train(), as mmdet's frozen_stages does) or replace them with "
                  "FrozenBatchNorm2d (torchvision's detection backbones).")
    if status is Status.PASS:
        return Status.WARN, sentence
    return status, f"{summary}; {sentence}"


def _probe_finding(probe: EvalProbe, status: Status, summary: str, metrics: dict, tables: dict, notes: list[str],
                   advice: list[str]) -> tuple[Status, str]:
    """Add what two eval-mode evaluations showed: functional dropout left on (a WARN), or a note."""
    metrics.update(probe.metrics())
    if not probe.warns:
        if probe.note():
            notes.append(probe.note())
        return status, summary
    tables["functional_dropout"] = probe.dropout
    advice.append(probe.ADVICE)
    if status is Status.PASS:
        return Status.WARN, probe.finding()
    return status, f"{summary}; {probe.finding()}"


def _metric_finding(o: _Observed, status: Status, summary: str, metrics: dict, notes: list[str],
                    advice: list[str]) -> tuple[Status, str]:
    """Add what the metric's evaluations showed: modules in train mode there (a WARN), or scores that differ."""
    scores, metric_modes = o.scores, o.metric_modes
    if scores is not None:
        metrics.update(metric_first=scores[0], metric_second=scores[1])
    if metric_modes is None:
        return status, summary
    in_train = [n for n, v in metric_modes.items() if v]
    metrics["train_in_metric"] = len(in_train)
    differ = scores is not None and abs(scores[0] - scores[1]) > 1e-12 * max(1.0, abs(scores[0]))
    if in_train:
        effect = (f"two evaluations of the same model differ ({scores[0]:.6g} vs {scores[1]:.6g})"
                  if differ and scores is not None
                  else "batch norm updates its running statistics and uses batch statistics")
        sentence = (f"the metric runs {_names(in_train)} in train mode: {effect}; the metric switches the model to "
                    "train mode")
        if status is Status.PASS:
            status, summary = Status.WARN, sentence
        else:
            summary += f"; {sentence}"
        advice.append("Evaluate in eval mode: call model.eval() (and torch.no_grad()) in the metric, and never "
                      "model.train() inside it.")
    elif differ and scores is not None:
        why = ("the functional dropout named here" if o.probe.warns
               else "randomness in the validation data (see data.eval_transforms) or in the model")
        notes.append(f"two evaluations of the metric differ ({scores[0]:.6g} vs {scores[1]:.6g}) with every module in "
                     f"eval mode: {why}")
    return status, summary


def _metric_modes(setup: Setup) -> tuple[dict[str, bool | None] | None, tuple[float, float] | None, str]:
    """Two evaluations of the metric on one fresh copy in eval mode: the modules' modes during them and the scores."""
    if setup.metric is None or setup.val_data is None:
        return None, None, ""
    ctx = setup.build()
    watched = mode_dependent(ctx.model)
    ctx.model.eval()
    scores = []
    try:
        with ModeRecorder(watched) as rec, torch.no_grad():
            for _ in range(2):  # no reseed between them: dropout left on must be allowed to differ
                scores.append(setup.metric(ctx.model, setup.val_data))
                rec.flush()
    except TroptError as exc:
        return None, None, f"metric not evaluated: {exc.message} (see model.eval_metric)"
    # A module counts as "train in the metric" when it ever ran in train mode there.
    seen: dict[str, set[bool]] = {}
    for u in rec.updates:
        for n, s in u.items():
            seen.setdefault(n, set()).update(s)
    return {n: (None if n not in seen else any(seen[n])) for n in watched}, (scores[0], scores[1]), ""
