"""Snapshot and restore everything a check could disturb: the one guard behind "never mutate the user's objects".

:func:`preserved` is an exception-safe context manager covering parameters (values, identity, dtype, device),
gradients, buffers, ``requires_grad``, train/eval modes, module and optimizer hooks, optimizer / scheduler /
scaler state, global torch switches (grad mode, default dtype) and the torch / CUDA / numpy / python RNG states.
:meth:`Snapshot.diff` lists what changed, which the shared no-mutation test helper (:mod:`tropt.testing`) uses.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)

_MODULE_HOOK_ATTRS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
_OPTIMIZER_HOOK_ATTRS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone()


def _same(a: Any, b: Any) -> bool:
    """Deep equality that treats tensors by value (NaN == NaN), dtype and device."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        return bool(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
                                           and torch.equal(a.isnan(), b.isnan())))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


@dataclass
class _ModuleState:
    module: nn.Module
    params: dict[int, dict[str, Any]] = field(default_factory=dict)  # per submodule: name -> Parameter object
    buffers: dict[int, dict[str, Any]] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)  # id(tensor) -> cloned data
    grads: dict[int, torch.Tensor | None] = field(default_factory=dict)
    requires_grad: dict[int, bool] = field(default_factory=dict)
    training: dict[int, bool] = field(default_factory=dict)
    hooks: dict[int, dict[str, dict]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)

    @classmethod
    def take(cls, module: nn.Module) -> _ModuleState:
        s = cls(module)
        for prefix, m in module.named_modules(remove_duplicate=False):
            key = id(m)
            s.names[key] = prefix or type(module).__name__
            s.params[key] = dict(m._parameters)
            s.buffers[key] = dict(m._buffers)
            s.training[key] = m.training
            s.hooks[key] = {a: dict(getattr(m, a)) for a in _MODULE_HOOK_ATTRS if hasattr(m, a)}
            for name, t in list(m._parameters.items()) + list(m._buffers.items()):
                if t is None or id(t) in s.values:
                    continue
                s.names.setdefault(id(t), f"{prefix + '.' if prefix else ''}{name}")
                s.values[id(t)] = t.detach().clone()
                s.grads[id(t)] = _clone(t.grad)
                s.requires_grad[id(t)] = t.requires_grad
        return s

    def _modules(self) -> Iterator[nn.Module]:
        return (m for _, m in self.module.named_modules(remove_duplicate=False))

    def restore(self) -> None:
        # Structure first (put back replaced or removed Parameter/buffer objects), then values in place.
        seen: dict[int, nn.Module] = {}
        for m in self._modules():
            seen[id(m)] = m
        for key, m in seen.items():
            if key in self.params:
                m._parameters.clear()
                m._parameters.update(self.params[key])
                m._buffers.clear()
                m._buffers.update(self.buffers[key])
                m.training = self.training[key]
                for attr, hooks in self.hooks[key].items():
                    live = getattr(m, attr)
                    live.clear()
                    live.update(hooks)
        with torch.no_grad():
            for key in self.params:
                found = seen.get(key)
                if found is None:
                    continue
                for t in list(found._parameters.values()) + list(found._buffers.values()):
                    if t is None or id(t) not in self.values:
                        continue
                    saved = self.values[id(t)]
                    if t.shape == saved.shape and t.dtype == saved.dtype and t.device == saved.device:
                        t.copy_(saved)
                    else:
                        t.data = saved.clone()
                    grad = self.grads[id(t)]
                    t.grad = None if grad is None else grad.clone()
                    if t.requires_grad != self.requires_grad[id(t)] and (t.is_leaf or not self.requires_grad[id(t)]):
                        t.requires_grad_(self.requires_grad[id(t)])

    def diff(self, other: _ModuleState) -> list[str]:
        out = []
        for key in self.params:
            name = self.names[key]
            if key not in other.params:
                out.append(f"module {name}: no longer part of the model")
                continue
            if self.training[key] != other.training[key]:
                out.append(f"module {name}: training mode {self.training[key]} -> {other.training[key]}")
            for kind, mine, theirs in (("parameter", self.params, other.params),
                                       ("buffer", self.buffers, other.buffers)):
                if {k: id(v) for k, v in mine[key].items()} != {k: id(v) for k, v in theirs[key].items()}:
                    out.append(f"module {name}: {kind} objects replaced, added or removed")
            for attr, hooks in self.hooks[key].items():
                if hooks.keys() != other.hooks[key].get(attr, {}).keys():
                    out.append(f"module {name}: {attr} changed ({len(hooks)} -> {len(other.hooks[key].get(attr, {}))})")
        for tid, value in self.values.items():
            name = self.names.get(tid, "?")
            if tid not in other.values:
                continue
            if not _same(value, other.values[tid]):
                out.append(f"tensor {name}: values, dtype or device changed")
            if not _same(self.grads[tid], other.grads[tid]):
                out.append(f"tensor {name}: .grad changed")
            if self.requires_grad[tid] != other.requires_grad[tid]:
                out.append(f"tensor {name}: requires_grad {self.requires_grad[tid]} -> {other.requires_grad[tid]}")
        return out


def _state_dict(obj: Any) -> Any:
    return copy.deepcopy(obj.state_dict())


def copy_module(module: M) -> M:
    """A deep copy of ``module``, also when ``copy.deepcopy`` alone refuses it.

    A tensor kept as a plain module attribute that autograd computed cannot be deep-copied ("Only Tensors created
    explicitly by the user (graph leaves) support the deepcopy protocol"): the weight the hook-based
    ``torch.nn.utils.spectral_norm`` / ``weight_norm`` computed at the last forward pass, an activation a model
    caches. The copy gets such tensors detached; those hooks recompute the weight at the next forward. The
    original is untouched (it keeps its graph).
    """
    memo: dict[int, Any] = {}
    for m in module.modules():
        for value in vars(m).values():
            if isinstance(value, torch.Tensor) and not value.is_leaf:
                memo[id(value)] = value.detach().clone()
    return copy.deepcopy(module, memo)


@dataclass
class RngState:
    torch_cpu: torch.Tensor
    cuda: list | None
    numpy: Any  # numpy's legacy state: a tuple, typed as a dict by its stubs
    python: tuple

    @classmethod
    def take(cls) -> RngState:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return cls(torch.get_rng_state(), cuda, np.random.get_state(), random.getstate())

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        np.random.set_state(self.numpy)
        random.setstate(self.python)

    def diff(self, other: RngState) -> list[str]:
        out = []
        if not torch.equal(self.torch_cpu, other.torch_cpu):
            out.append("torch CPU RNG state advanced")
        if self.cuda is not None and other.cuda is not None and not all(map(torch.equal, self.cuda, other.cuda)):
            out.append("torch CUDA RNG state advanced")
        if not _same(list(self.numpy), list(other.numpy)):
            out.append("numpy global RNG state advanced")
        if self.python != other.python:
            out.append("python random state advanced")
        return out


@dataclass
class Snapshot:
    """A restorable copy of the state of modules, optimizers, schedulers, scalers, RNGs and torch switches."""

    modules: list[_ModuleState]
    stateful: list[tuple[Any, Any, dict]]  # (object, state_dict copy, hook dicts)
    rng: RngState | None
    grad_enabled: bool
    default_dtype: torch.dtype

    @classmethod
    def take(cls, objects: Iterable[Any] = (), rng: bool = True) -> Snapshot:
        """Snapshot ``objects``: modules, optimizers, LR schedulers, GradScalers (None entries are ignored)."""
        modules, stateful = [], []
        for obj in objects:
            if obj is None:
                continue
            if isinstance(obj, nn.Module):
                modules.append(_ModuleState.take(obj))
            elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
                hooks = {a: dict(getattr(obj, a)) for a in _OPTIMIZER_HOOK_ATTRS if hasattr(obj, a)}
                stateful.append((obj, _state_dict(obj), hooks))
            else:
                raise TypeError(f"cannot snapshot a {type(obj).__name__}: it is not a module and has no state_dict")
        return cls(modules, stateful, RngState.take() if rng else None, torch.is_grad_enabled(),
                   torch.get_default_dtype())

    def restore(self) -> None:
        """Put every captured object back as it was (in place: the user's references stay valid)."""
        for m in self.modules:
            m.restore()
        for obj, state, hooks in self.stateful:
            obj.load_state_dict(copy.deepcopy(state))
            for attr, saved in hooks.items():
                live = getattr(obj, attr)
                live.clear()
                live.update(saved)
        if self.rng is not None:
            self.rng.restore()
        torch.set_grad_enabled(self.grad_enabled)
        torch.set_default_dtype(self.default_dtype)

    def diff(self, other: Snapshot) -> list[str]:
        """Human-readable differences between this snapshot and a later one of the same objects."""
        out: list[str] = []
        for mine, theirs in zip(self.modules, other.modules):
            out += mine.diff(theirs)
        for (obj, mine, hooks), (_, theirs, hooks2) in zip(self.stateful, other.stateful):
            name = type(obj).__name__
            if not _same(mine, theirs):
                out.append(f"{name}: state_dict changed")
            for attr in hooks:
                if hooks[attr].keys() != hooks2.get(attr, {}).keys():
                    out.append(f"{name}: {attr} changed")
        if self.rng is not None and other.rng is not None:
            out += self.rng.diff(other.rng)
        if self.grad_enabled != other.grad_enabled:
            out.append(f"torch grad mode {self.grad_enabled} -> {other.grad_enabled}")
        if self.default_dtype != other.default_dtype:
            out.append(f"torch default dtype {self.default_dtype} -> {other.default_dtype}")
        return out


@contextmanager
def preserved(*objects: Any, rng: bool = True) -> Iterator[Snapshot]:
    """Context manager: snapshot ``objects`` (and the RNGs), run the block, restore them even on exceptions.

    Example
    -------
    >>> with preserved(model, optimizer, scheduler):
    ...     run_something_that_trains(model, optimizer)
    """
    snap = Snapshot.take(objects, rng=rng)
    try:
        yield snap
    finally:
        snap.restore()
