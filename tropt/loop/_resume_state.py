"""The parts of a run's state beyond the Setup's model, optimizer, scheduler and scaler that ``loop.resume`` saves
(in tropt's own checkpoint) and compares: the Setup's second and later optimizers and schedulers, objects the step
keeps on ``ctx`` that have a ``state_dict`` (an EMA model, an optimizer it built, a momentum encoder), and the
state it carries outside ``ctx``'s fields (:mod:`tropt.core.carried_state`: ``model.hidden``, a closure variable).

Each becomes a component of its own, named as the user would write it: ``optimizers[1]``, ``ctx.ema``,
``model.hidden``, ``step.hidden``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.carried_state import CarriedState, find_slots
from ..core.compare import flatten_state
from ..snapshot import copy_module
from ..training import StepContext, user_state_is_plain


def _stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def _setup_objects(ctx: StepContext) -> list[Any]:
    optimizers = list(getattr(ctx, "optimizers", None) or ([ctx.optimizer] if ctx.optimizer is not None else []))
    schedulers = list(getattr(ctx, "schedulers", None) or [ctx.scheduler])
    return [ctx.model, *optimizers, *schedulers, ctx.scaler]


def ctx_objects(ctx: StepContext) -> dict[str, Any]:
    """The step's own attributes on ctx that have a state_dict (not the Setup's objects, not plain data), by
    ``ctx.<name>``."""
    own = _setup_objects(ctx)
    return {f"ctx.{name}": value for name, value in ctx._user_attrs().items()
            if _stateful(value) and not user_state_is_plain(value) and all(value is not o for o in own)}


def more_optimizers(ctx: StepContext) -> dict[str, tuple[Any, Any]]:
    """The Setup's second and later optimizers with their schedulers, by name (``optimizers[1]``)."""
    optimizers = tuple(getattr(ctx, "optimizers", None) or ())
    schedulers = tuple(getattr(ctx, "schedulers", None) or ())
    name = getattr(ctx, "optimizer_name", lambda i: f"optimizers[{i}]")
    return {name(i): (o, schedulers[i] if i < len(schedulers) else None) for i, o in enumerate(optimizers) if i > 0}


def _state_dict(obj: Any) -> Any:
    try:
        return obj.state_dict()
    except (TypeError, ValueError, AttributeError, RuntimeError):  # needs more than itself: nothing to compare
        return {}


def extra_components(ctx: StepContext, carried: CarriedState) -> dict[str, dict[str, torch.Tensor]]:
    """Every extra component of a run as flat tensors (copies), for comparison."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, (opt, sched) in more_optimizers(ctx).items():
        out[name] = {k: v.clone() for k, v in flatten_state(
            {"optimizer": _state_dict(opt), "scheduler": _state_dict(sched) if sched is not None else {}}).items()}
    for name, obj in ctx_objects(ctx).items():
        out[name] = {k: v.clone() for k, v in flatten_state(_state_dict(obj)).items()}
    for name, value in carried.values.items():
        if value is not None:
            out[name] = {k: v.clone() for k, v in flatten_state(value).items()}
    return out


def save_extra(ctx: StepContext, step: Any, templates: dict[str, nn.Module] | None = None) -> dict[str, Any]:
    """What tropt's full checkpoint holds beyond its fixed parts: the state dicts of the stateful objects the step
    keeps on ctx and of the Setup's later optimizers, and the carried state. ``templates`` receives a copy of each
    module kept on ctx that shares no parameter with the model (an EMA model): what a resuming script rebuilds
    before it loads the state dict."""
    objects = ctx_objects(ctx)
    if templates is not None:
        templates.update({name: _template(ctx, obj) for name, obj in objects.items() if _rebuildable(ctx, obj)})
    return {
        "more_optimizers": {name: (_state_dict(o), _state_dict(s) if s is not None else None)
                            for name, (o, s) in more_optimizers(ctx).items()},
        "ctx_objects": {name: _state_dict(obj) for name, obj in objects.items()},
        "carried": {n: v for n, v in CarriedState.take(ctx, step).values.items() if v is not None},
    }


def _rebuildable(ctx: StepContext, obj: Any) -> bool:
    """Whether a copy of ``obj`` can stand for what a resuming script rebuilds before it loads the state dict: a
    module that shares no parameter with the model (an EMA model), or an object of the user's own whose attributes
    hold no model, optimizer or parameter (a native-scaler wrapper holding its GradScaler). A wrapper of the live
    training objects (accelerate's AcceleratedOptimizer) is not: its copy would train copies."""
    if isinstance(obj, nn.Module):
        own = {id(p) for p in ctx.model.parameters()}
        return not any(id(p) in own for p in obj.parameters())
    if isinstance(obj, torch.optim.Optimizer):  # an optimizer the step built over the model's (or ctx's) tensors
        names = _param_names(ctx)
        return all(id(p) in names for g in obj.param_groups for p in g["params"])
    if type(obj).__module__.split(".")[0] in ("torch", "accelerate", "transformers", "lightning", "pytorch_lightning"):
        return False
    try:
        attrs = list(vars(obj).values())
    except TypeError:
        return False
    return not any(isinstance(v, (nn.Module, torch.optim.Optimizer, torch.Tensor)) for v in attrs)


@dataclass(frozen=True)
class _OptimizerRecipe:
    """How to build again an optimizer the step built on ctx: its class, its groups' parameters by name, its
    defaults (its state comes from the checkpoint). ``frozen``: a copy of it taken at the save point that shares the
    saved run's parameters, for a constructor that takes other arguments (a config): it is copied again onto the
    fresh model's parameters, by name."""

    cls: type
    groups: list[dict[str, Any]]
    defaults: dict[str, Any]
    frozen: Any = None

    def build(self, ctx: StepContext) -> Any:
        params = _params_by_name(ctx)
        groups = [{**g, "params": [params[n] for n in g["params"]]} for g in self.groups]
        try:
            return self.cls(groups, **self.defaults)
        except (TypeError, ValueError, KeyError):  # a constructor that takes other arguments
            pass
        if self.frozen is None:
            return None
        old = [p for g in self.frozen.param_groups for p in g["params"]]
        new = [params[n] for g in self.groups for n in g["params"]]
        try:
            return copy.deepcopy(self.frozen, {id(o): n for o, n in zip(old, new)})
        except (TypeError, RuntimeError, copy.Error):  # holds something that cannot be copied: not rebuilt
            return None


def _params_by_name(ctx: StepContext) -> dict[str, torch.Tensor]:
    """The tensors an optimizer the step builds may hold: the model's parameters by name, and the trainable tensors
    the step keeps on ctx (a learnable temperature) as ``ctx.<name>``."""
    out: dict[str, torch.Tensor] = dict(ctx.model.named_parameters())
    out.update({f"ctx.{k}": v for k, v in ctx._user_attrs().items()
                if isinstance(v, torch.Tensor) and v.is_leaf and v.requires_grad})
    return out


def _param_names(ctx: StepContext) -> dict[int, str]:
    return {id(p): n for n, p in _params_by_name(ctx).items()}


def _template(ctx: StepContext, obj: Any) -> Any:
    if isinstance(obj, nn.Module):
        return copy_module(obj)
    if isinstance(obj, torch.optim.Optimizer):
        names = _param_names(ctx)
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in g["params"]]}
                  for g in obj.param_groups]
        return _OptimizerRecipe(type(obj), groups, dict(obj.defaults), _frozen(ctx, obj))
    return copy.deepcopy(obj)


def _frozen(ctx: StepContext, opt: torch.optim.Optimizer) -> Any:
    """A copy of ``opt`` that shares the tensors it optimises (and copies everything else), or None."""
    try:
        return copy.deepcopy(opt, {id(p): p for p in _params_by_name(ctx).values()})
    except (TypeError, RuntimeError, copy.Error):
        return None


def _rebuild(ctx: StepContext, template: Any) -> Any:
    if isinstance(template, _OptimizerRecipe):
        return template.build(ctx)
    return copy_module(template) if isinstance(template, nn.Module) else copy.deepcopy(template)


def load_extra(ctx: StepContext, state: dict[str, Any], step: Any,
               templates: dict[str, nn.Module] | None = None) -> None:
    """Load what :func:`save_extra` wrote into fresh objects. A module the step kept on ctx is rebuilt from its
    template when the fresh context has none yet (the step builds it lazily); any other object is loaded only into
    one that exists."""
    for name, (o_state, s_state) in state.get("more_optimizers", {}).items():
        found = more_optimizers(ctx).get(name)
        if found is not None:
            found[0].load_state_dict(o_state)
            if found[1] is not None and s_state is not None:
                found[1].load_state_dict(s_state)
    for name, saved in state.get("ctx_objects", {}).items():
        attr = name.removeprefix("ctx.")
        live = getattr(ctx, attr, None)
        if live is None and templates and name in templates:
            live = _rebuild(ctx, templates[name])
            if live is not None:
                setattr(ctx, attr, live)
        if live is not None and _stateful(live):
            live.load_state_dict(saved)
    slots = {s.name: s for s in find_slots(ctx, step)}
    for name, value in state.get("carried", {}).items():
        if name in slots:
            slots[name].put(copy.deepcopy(value))
        else:
            _set_path(ctx, name, copy.deepcopy(value))


def _set_path(ctx: StepContext, name: str, value: Any) -> None:
    """Set ``model.rnn.hidden`` (or ``ctx.carrier.h``) on a context where it does not exist yet."""
    root, *path = name.split(".")
    if root not in ("model", "ctx") or not path or any("[" in p for p in path):
        return
    obj: Any = ctx.model if root == "model" else ctx
    for part in path[:-1]:
        obj = getattr(obj, part, None)
        if obj is None:
            return
    if isinstance(obj, nn.Module):
        obj.__dict__[path[-1]] = value
    else:
        setattr(obj, path[-1], value)


def extra_advice(name: str) -> str:
    """What to save for an extra component that a resume did not restore."""
    if name.startswith("ctx."):
        return (f"Save {name}.state_dict() in save_state and load it in load_state (an EMA model, an optimizer or "
                "encoder the step keeps on ctx): without it the resumed run rebuilds it from the loaded weights and "
                "its state diverges from the run that never stopped.")
    if name.startswith(("model.", "step.")):
        return (f"Save the state the run carries in {name} (a recurrent hidden state the step keeps outside "
                "state_dict()) in save_state and set it again in load_state, or the resumed run restarts it.")
    return f"Save and load {name}.state_dict() (and its scheduler's) in save_state/load_state too."
