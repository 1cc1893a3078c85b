"""torch.compile'd models under diagnosis: fewer recompiles, and what the remaining ones cost (issue 28).

A diagnosis feeds a compiled model many shapes and states it would not meet in training: micro-batches of
unequal sizes (``loop.accumulation``), forwards under ``no_grad`` and in eval mode, under autocast, with tropt's
own hooks and ``TorchFunctionMode`` spies. Each new combination fails a dynamo guard and recompiles; with inductor
on a CPU each compile of a tiny MLP takes tens of seconds, and after ``torch._dynamo.config.cache_size_limit``
(8 by default) compiles of one frame dynamo gives up and runs it eagerly for the rest of the process.

Two things live here, both no-ops for a model with no compiled part:

- :func:`mark_batch_dynamic` marks the batch dimension of the micro-batches given to a compiled model as dynamic
  (``torch._dynamo.maybe_mark_dynamic``), so the first compile already serves every micro-batch size instead of a
  static compile followed by a dynamic one. It respects the user's compile settings: a module compiled with
  ``dynamic=False`` is never marked (marking would override that choice); the tensors marked are fresh aliases,
  never the user's own.
- :class:`CompileLog` counts the compiles a block of code caused and the seconds they took, and says which frames
  hit the recompile limit; :meth:`CompileLog.note` is the one line a report carries.

Nothing here changes the user's model, its compiled wrapper or dynamo's configuration.
"""

from __future__ import annotations

import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


def _dynamo_loaded() -> bool:
    # A model compiled by the user has imported torch._dynamo; without it nothing can be compiled, and importing it
    # here (seconds) would be pure cost on the hot path of every step.
    return "torch._dynamo" in sys.modules


def compiled_modules(model: Any) -> list[tuple[str, nn.Module]]:
    """The ``torch.compile`` wrappers (``OptimizedModule``) in ``model``, itself included, as (name, module)."""
    if not _dynamo_loaded() or not isinstance(model, nn.Module):
        return []
    from torch._dynamo.eval_frame import OptimizedModule

    return [(name, m) for name, m in model.named_modules() if isinstance(m, OptimizedModule)]


def compile_dynamic(module: nn.Module) -> bool | None:
    """The ``dynamic=`` a compiled module was given (None: dynamo's default, automatic dynamic shapes)."""
    ctx = getattr(module, "dynamo_ctx", None)
    value = getattr(ctx, "_dynamic", None)  # private in torch 2.x; unknown reads as the default
    return value if isinstance(value, bool) else None


_SHOULD_MARK: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def should_mark(model: Any) -> bool:
    """True when ``model`` has a compiled part and none of them was compiled with ``dynamic=False``."""
    if not _dynamo_loaded() or not isinstance(model, nn.Module):
        return False
    known = _SHOULD_MARK.get(model)
    if known is None:  # walked once per model copy: this runs at every loss call of a diagnosis
        found = compiled_modules(model)
        known = _SHOULD_MARK[model] = bool(found) and all(compile_dynamic(m) is not False for _, m in found)
    return known


def _marked(value: Any, batch_dim: int) -> Any:
    """``value`` with every tensor that has a batch dimension replaced by a marked alias (same storage)."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.dim() <= batch_dim or value.shape[batch_dim] < 2:
            return value  # dynamo specialises sizes 0 and 1 whatever the mark says
        alias = value.view_as(value)  # a new tensor object: the mark never lands on the user's tensor
        torch._dynamo.maybe_mark_dynamic(alias, batch_dim)
        return alias
    if isinstance(value, dict):
        return type(value)((k, _marked(v, batch_dim)) for k, v in value.items()) if type(value) is dict else value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_marked(v, batch_dim) for v in value)
    if isinstance(value, list):
        return [_marked(v, batch_dim) for v in value]
    return value  # namedtuples, dataclasses, HF BatchEncoding: left as they are (rebuilding them is not safe)


def mark_batch_dynamic(model: Any, micro_batches: list, batch_dim: Any = 0) -> list:
    """``micro_batches`` for ``model``: the same list when ``model`` has no compiled part (or ``batch_dim`` is not
    an int), else a list whose tensors' batch dimension is marked dynamic, so one compile serves every size."""
    if not isinstance(batch_dim, int) or isinstance(batch_dim, bool) or not should_mark(model):
        return micro_batches
    return [_marked(mb, batch_dim) for mb in micro_batches]


@dataclass
class CompileLog:
    """Compiles caused inside a ``with`` block: their count, seconds, reasons, and frames that hit the limit.

    Reads ``torch._dynamo.utils.get_compilation_metrics()`` (one entry per compile attempt); nothing is recorded
    when dynamo is not loaded, and recording never raises.
    """

    compiles: int = 0
    recompiles: int = 0
    seconds: float = 0.0
    limit_hits: int = 0
    reasons: list[str] = field(default_factory=list)
    _start: int = 0
    _t0: float = 0.0

    def __enter__(self) -> CompileLog:
        self._start = len(self._metrics())
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        new = self._metrics()[self._start:]
        for m in new:
            reason = getattr(m, "recompile_reason", None)
            if getattr(m, "frame_key", None) is None:  # dynamo gave up on the frame: the recompile limit
                self.limit_hits += 1
                continue
            self.compiles += 1
            self.seconds += float(getattr(m, "entire_frame_compile_time_s", None) or 0.0)
            if reason:
                self.recompiles += 1
                self.reasons.append(str(reason).strip().splitlines()[0][:160])

    @staticmethod
    def _metrics() -> list:
        if not _dynamo_loaded():
            return []
        try:
            from torch._dynamo.utils import get_compilation_metrics

            return list(get_compilation_metrics())
        except Exception:  # noqa: BLE001 - a private API that moves between releases: no record, never a crash
            return []

    def note(self) -> str | None:
        """One line for a report: what torch.compile cost during the block; None when nothing compiled."""
        if not self.compiles and not self.limit_hits:
            return None
        text = (f"torch.compile: {self.compiles} compile(s), {self.recompiles} of them recompiles, took "
                f"{self.seconds:.1f} s of this diagnosis")
        if self.limit_hits:
            text += (f"; {self.limit_hits} time(s) a frame hit torch._dynamo.config.cache_size_limit and ran "
                     "uncompiled for the rest of the process (later timings measure eager code)")
        return text



def untraced(fn: Any, model: Any = None) -> Any:
    """``fn`` (one of tropt's own hooks) kept out of dynamo's tracing; ``fn`` itself when ``model`` is given and has
    no compiled part (torch.optim loads dynamo in every process: its presence says nothing about the model).

    A hook registered on a submodule of a compiled model is inlined into the compiled graph: its Python state
    (``if st.kind == "linear"``, ``float(o.min())``) becomes guards, and each new value recompiles the user's frame
    until the recompile limit. Disabled, the hook is a graph break that runs eagerly and never recompiles.
    """
    if not _dynamo_loaded() or (model is not None and not compiled_modules(model)):
        return fn
    return torch._dynamo.disable(fn, recursive=True)
