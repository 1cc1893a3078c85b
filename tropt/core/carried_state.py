"""State a step carries from one call to the next outside the model's parameters, buffers and ``ctx``'s own fields.

A recurrent language model keeps its hidden state somewhere: on the context (``ctx.hidden``, which
:meth:`tropt.training.StepContext.user_state` already copies), on the model (``self.hidden = h.detach()`` in a
module's ``forward``: a tensor attribute that is neither a parameter nor a buffer), on an object the step keeps on
``ctx`` (``ctx.state = Carrier()``), or in the step function's closure (``nonlocal hidden``, a ``state = {}`` dict
the step closes over, a bound method's object). Step t then depends on step t-1 through that state, and a check
that reruns step t "from the same state" must put it back too, or it compares two different steps.

:class:`CarriedState` finds those tensors (and lists, tuples and dicts of them), snapshots them as detached
clones, restores them, and tells which ones a call of the step changed, by name: ``model.rnn.hidden``,
``ctx.carrier.h``, ``step.hidden`` (a closure variable), ``step.state['h']``.

What is never carried state: parameters and buffers (``state_dict`` holds them), tensors identical to one of them
(``nn.RNN``'s ``_flat_weights``), the attributes ``nn.Module`` itself keeps, and anything that is no tensor.
Module-level globals the step reads are not found: keep such state on ``ctx`` or the model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # _parameters, _buffers, _modules, hook dicts, training, ...
# Objects of these libraries are never scanned for carried state (an Accelerator, an optimizer, a logger): their
# attributes are the library's own, and putting them back could cut links to live training objects.
_LIBRARIES = ("torch", "accelerate", "transformers", "lightning", "pytorch_lightning", "numpy", "logging", "wandb",
              "tropt")


def _library_object(obj: Any) -> bool:
    """A library's object, or data the step reads but never carries (a Dataset, DataLoader or Sampler of the
    user's own: its tensors are the data, not state)."""
    data = (torch.utils.data.Dataset, torch.utils.data.DataLoader, torch.utils.data.Sampler)
    return type(obj).__module__.split(".")[0] in _LIBRARIES or isinstance(obj, data)


def _carried(value: Any) -> bool:
    """What a slot may hold: a tensor tree, or None (a hidden state not set yet: ``self.hidden = None``)."""
    return value is None or _is_tensor_tree(value)


def _is_tensor_tree(value: Any) -> bool:
    """A tensor (not a Parameter), or a non-empty list/tuple/dict whose leaves are such tensors or None."""
    if isinstance(value, nn.Parameter):
        return False
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return bool(value) and any(isinstance(v, torch.Tensor) for v in value) and all(
            v is None or _is_tensor_tree(v) for v in value)
    if isinstance(value, dict):
        return bool(value) and any(isinstance(v, torch.Tensor) for v in value.values()) and all(
            v is None or _is_tensor_tree(v) for v in value.values())
    return False


def _leaves(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)


def _copy(value: Any) -> Any:
    """A detached copy of a tensor tree (a leaf that required grad keeps ``requires_grad``)."""
    if isinstance(value, torch.Tensor):
        out = value.detach().clone()
        return out.requires_grad_(True) if value.requires_grad and value.is_leaf and out.is_floating_point() else out
    if isinstance(value, (list, tuple)):
        items = [_copy(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal tensor trees (values, shapes, dtypes; NaN equals NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        return bool(torch.equal(a.detach(), b.detach()) or (
            a.is_floating_point() and torch.equal(a.detach().isnan(), b.detach().isnan())
            and torch.equal(a.detach().nan_to_num(0.0), b.detach().nan_to_num(0.0))))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a is b or (a is None and b is None)


@dataclass
class _Slot:
    """Where one piece of carried state lives: read and written through ``get``/``put``."""

    name: str
    get: Callable[[], Any]
    put: Callable[[Any], None]
    drop: Callable[[], None]  # remove what the slot holds (an attribute or key that appeared after the snapshot)


def _attr_slot(name: str, obj: Any, attr: str) -> _Slot:
    def put(value: Any) -> None:
        if isinstance(obj, nn.Module):
            obj.__dict__[attr] = value  # a plain attribute: bypass nn.Module's parameter/buffer routing
        else:
            setattr(obj, attr, value)

    def drop() -> None:
        if attr in vars(obj):
            delattr(obj, attr)
    return _Slot(name, lambda: getattr(obj, attr, None), put, drop)


def _cell_slot(name: str, cell: Any) -> _Slot:
    def get() -> Any:
        try:
            return cell.cell_contents
        except ValueError:  # an empty cell (a nonlocal not yet assigned)
            return None

    def put(value: Any) -> None:
        cell.cell_contents = value
    return _Slot(name, get, put, lambda: put(None))


def _item_slot(name: str, container: dict, key: Any) -> _Slot:
    return _Slot(name, lambda: container.get(key), lambda value: container.__setitem__(key, value),
                 lambda: container.pop(key, None) and None)


def _module_slots(prefix: str, module: nn.Module, owned: set[int]) -> Iterator[_Slot]:
    """Tensor attributes of ``module``'s submodules that are neither parameters nor buffers (nor identical to one)."""
    for sub_name, m in module.named_modules():
        where = f"{prefix}.{sub_name}" if sub_name else prefix
        for attr, value in list(vars(m).items()):
            if attr in _MODULE_INTERNALS or not _carried(value) or _recomputed(m, attr):
                continue
            if any(id(t) in owned for t in _leaves(value)):
                continue
            yield _attr_slot(f"{where}.{attr}", m, attr)


def _recomputed(module: nn.Module, attr: str) -> bool:
    """A weight a hook recomputes from parameters at every forward (``spectral_norm``'s ``weight`` from
    ``weight_orig``, ``weight_norm``'s from ``weight_g``/``weight_v``): derived, not carried."""
    return any(f"{attr}{suffix}" in module._parameters for suffix in ("_orig", "_g", "_v"))


def _object_slots(prefix: str, obj: Any, owned: set[int]) -> Iterator[_Slot]:
    """Carried state held by a plain object (one level of its attributes), or by a module."""
    if isinstance(obj, nn.Module):
        yield from _module_slots(prefix, obj, owned | _owned(obj))
        return
    if _library_object(obj) and not isinstance(obj, dict):
        return
    if isinstance(obj, dict):
        for key, value in list(obj.items()):
            if _carried(value) and not any(id(t) in owned for t in _leaves(value)):
                yield _item_slot(f"{prefix}[{key!r}]", obj, key)
        return
    try:
        attrs = vars(obj)
    except TypeError:
        return
    for attr, value in list(attrs.items()):
        if isinstance(value, nn.Module):
            yield from _module_slots(f"{prefix}.{attr}", value, owned | _owned(value))
        elif _carried(value) and not any(id(t) in owned for t in _leaves(value)):
            yield _attr_slot(f"{prefix}.{attr}", obj, attr)


def _owned(module: nn.Module) -> set[int]:
    return {id(t) for t in (*module.parameters(), *module.buffers())}


def _step_slots(step: Any, owned: set[int]) -> Iterator[_Slot]:
    """Carried state in the step function: closure variables, a bound method's object, a partial's arguments."""
    seen: set[int] = set()
    todo: list[tuple[str, Any]] = [("step", step)]
    while todo:
        prefix, fn = todo.pop(0)
        if fn is None or id(fn) in seen or isinstance(fn, type):
            continue
        seen.add(id(fn))
        if isinstance(fn, functools.partial):
            todo.append((prefix, fn.func))
            for i, arg in enumerate(fn.args):
                if not callable(arg) or isinstance(arg, nn.Module):
                    yield from _object_slots(f"{prefix}.args[{i}]", arg, owned)
            continue
        if not hasattr(fn, "__code__") and not hasattr(fn, "__func__") and hasattr(fn, "__dict__"):
            yield from _object_slots(prefix, fn, owned)  # a callable object: class Step: def __call__(self, ...)
            continue
        owner = getattr(fn, "__self__", None)
        if owner is not None and not isinstance(owner, type):
            yield from _object_slots(f"{prefix}.self", owner, owned)
            fn = getattr(fn, "__func__", fn)
        code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is None or not cells:
            continue
        for var, cell in zip(code.co_freevars, cells):
            try:
                value = cell.cell_contents
            except ValueError:  # a nonlocal not assigned yet: it may be the hidden state to come
                value = None
            name = f"{prefix}.{var}"
            if isinstance(value, dict):
                yield from _object_slots(name, value, owned)  # a state dict the step fills: item by item, in place
            elif (value is None or _is_tensor_tree(value)) and not any(id(t) in owned for t in _leaves(value)):
                yield _cell_slot(name, cell)
            elif callable(getattr(value, "__code__", None)):
                todo.append((name, value))  # a helper the step calls: its closure too
            elif isinstance(value, nn.Module) or (hasattr(value, "__dict__") and not callable(value)):
                yield from _object_slots(name, value, owned)


def find_slots(ctx: Any, step: Any = None) -> list[_Slot]:
    """Every place carried state can live for ``ctx`` (a StepContext) and the step function ``step`` (or None)."""
    model = ctx.model
    owned = _owned(model)
    slots = list(_module_slots("model", model, owned))
    user = ctx._user_attrs() if hasattr(ctx, "_user_attrs") else {}
    for name, value in user.items():
        if value is model or isinstance(value, torch.Tensor) or _is_tensor_tree(value):
            continue  # plain data on ctx: StepContext.user_state copies it
        if isinstance(value, (int, float, str, bytes, bool)) or value is None:
            continue
        slots += _object_slots(f"ctx.{name}", value, owned)
    if step is not None:
        slots += _step_slots(step, owned)
    unique: dict[str, _Slot] = {}
    for s in slots:
        unique.setdefault(s.name, s)
    return list(unique.values())


@dataclass
class CarriedState:
    """A snapshot of the carried state of ``ctx`` (and of ``step``, when given), restorable in place.

    ``take`` finds every tensor attribute and closure variable (see the module's docstring; one holding None is
    kept too: a hidden state not set yet), ``restore`` puts each back as a detached copy of what was there and
    removes what appeared since (an attribute the step set first after the snapshot), and ``changed`` names those
    whose value differs now from the snapshot.
    """

    ctx: Any
    step: Any = None
    values: dict[str, Any] = field(default_factory=dict)
    attached: list[str] = field(default_factory=list)  # held a tensor with a grad_fn: an earlier step's graph

    @classmethod
    def take(cls, ctx: Any, step: Any = None) -> CarriedState:
        slots = find_slots(ctx, step)
        attached = [s.name for s in slots if any(t.grad_fn is not None for t in _leaves(s.get()))]
        return cls(ctx, step, {s.name: _copy(s.get()) for s in slots}, attached)

    @property
    def names(self) -> list[str]:
        """The carried state that held a tensor at the snapshot."""
        return [n for n, v in self.values.items() if v is not None]

    def restore(self, prefix: str = "") -> None:
        """Put the snapshot back (only the names starting with ``prefix``, when given: ``"step."``)."""
        for s in find_slots(self.ctx, self.step):
            if not s.name.startswith(prefix):
                continue
            if s.name not in self.values:
                s.drop()
            elif _carried(s.get()):
                s.put(_copy(self.values[s.name]))

    def changed(self) -> list[str]:
        """Names of the carried state whose value now differs from the snapshot (or appeared since)."""
        out = []
        for s in find_slots(self.ctx, self.step):
            now = s.get()
            if s.name in self.values:
                if not _same(now, self.values[s.name]):
                    out.append(s.name)
            elif now is not None:
                out.append(s.name)
        return out


def carried_state_names(ctx: Any, step: Any = None) -> list[str]:
    """The names of every piece of carried state holding a tensor now (see :class:`CarriedState`)."""
    return [s.name for s in find_slots(ctx, step) if s.get() is not None]
