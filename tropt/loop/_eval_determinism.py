"""Eval-mode determinism, for ``loop.train_mode``: two evaluations of the model in eval mode on one batch must agree.

Dropout written as a call (``F.dropout(x, p)``, whose ``training`` flag defaults to True, or
``scaled_dot_product_attention(..., dropout_p=p)`` without ``if self.training``) is no ``nn.Dropout`` module, so
``model.eval()`` never reaches it. A ``TorchFunctionMode`` sees every such call made while the model evaluates, with
its probability and training flag, and forward hooks name the module whose ``forward`` made it. When the two
evaluations differ and no such call explains it, a rerun from one RNG state tells random draws (the loss's own noise,
as in diffusion objectives: a note, not a finding) from nondeterministic kernels.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from ..core.grad_mode import grad_mode, loss_needs_grad
from ..errors import TroptError
from ..snapshot import RngState, preserved
from ._verdicts import tolerance_for

if TYPE_CHECKING:
    from ..setup import Setup


@dataclass(frozen=True)
class _Spec:
    """Where a dropout function takes its probability and training flag (position, keyword, default)."""

    name: str
    p: tuple[int, str, float]
    training: tuple[int, str, bool] | None  # None: applies whenever p > 0 (attention's dropout_p)

    def read(self, args: tuple, kwargs: dict) -> tuple[float, bool]:
        def arg(at: int, key: str, default: Any) -> Any:
            return kwargs[key] if key in kwargs else args[at] if len(args) > at else default

        p = float(arg(*self.p))
        return p, True if self.training is None else bool(arg(*self.training))


def _specs() -> dict[Callable, _Spec]:
    specs: dict[Callable, _Spec] = {}
    for name, default in (("dropout", True), ("dropout1d", True), ("dropout2d", True), ("dropout3d", True),
                          ("alpha_dropout", False), ("feature_alpha_dropout", False)):
        fn = getattr(F, name, None)
        if fn is not None:
            specs[fn] = _Spec(f"F.{name}", (1, "p", 0.5), (2, "training", default))
    for name in ("dropout", "alpha_dropout", "feature_dropout", "feature_alpha_dropout"):
        fn = getattr(torch, name, None)
        if fn is not None:
            specs[fn] = _Spec(f"torch.{name}", (1, "p", 0.5), (2, "train", False))
    specs[F.scaled_dot_product_attention] = _Spec("F.scaled_dot_product_attention", (4, "dropout_p", 0.0), None)
    return specs


_SPECS = _specs()


def active_dropout(func: Any, args: tuple, kwargs: dict) -> tuple[Any, float]:
    """The functional dropout spec of ``func`` and its rate when this call drops (p > 0, training); else (None, 0)."""
    try:
        spec = _SPECS.get(func)
    except TypeError:  # an unhashable callable
        return None, 0.0
    if spec is None:
        return None, 0.0
    try:
        p, training = spec.read(args, kwargs)
    except (TypeError, ValueError):  # an unusual call: not ours to judge
        return None, 0.0
    return (spec, p) if p > 0 and training else (None, 0.0)


class DropoutSpy(TorchFunctionMode):
    """Counts the dropout calls that apply (p > 0 and training) while it is active, by the module making them."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.calls: Counter[tuple[str, str, float]] = Counter()
        self._stack: list[str] = []
        self._handles = []
        for name, m in model.named_modules():
            try:
                pre = m.register_forward_pre_hook(self._push(name or "(model)"))
            except RuntimeError:  # a scripted module takes no hooks: its calls count for its parent
                continue
            self._handles += [pre, m.register_forward_hook(self._pop, always_call=True)]

    def _push(self, name: str) -> Callable:
        def hook(module: nn.Module, args: Any) -> None:
            self._stack.append(name)
        return hook

    def _pop(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        spec, p = active_dropout(func, args, kwargs)
        if spec is not None:
            self.calls[(self._stack[-1] if self._stack else "(outside the model)", spec.name, p)] += 1
        return func(*args, **kwargs)

    def table(self) -> pd.DataFrame:
        rows = [{"module": m, "function": f, "p": p, "training": True, "calls": n}
                for (m, f, p), n in self.calls.items()]
        return pd.DataFrame(rows, columns=["module", "function", "p", "training", "calls"])


class RngDrawSpy:
    """Names the leaf modules whose forward draws from torch's global CPU RNG while they are in eval mode (a
    stochastic-depth ``DropPath`` or noise layer that ignores ``self.training``: ``x.new_empty(...).bernoulli_(keep)``).
    Such a draw is found whatever its effect on the loss: a branch scaled to almost nothing at initialisation
    (LayerScale's ``gamma = 1e-5``, zero-initialised residual branches) hides the difference it makes in eval mode
    until the branch has learned."""

    def __init__(self, model: nn.Module) -> None:
        self.drawing: Counter[str] = Counter()
        self._before: dict[int, torch.Tensor] = {}
        self._handles = []
        for name, m in model.named_modules():
            if next(m.children(), None) is not None:
                continue  # leaves only: a parent's draws are its children's (or its own code, the loss's business)
            try:
                self._handles += [m.register_forward_pre_hook(self._pre),
                                  m.register_forward_hook(self._post(name or "(model)"), always_call=True)]
            except RuntimeError:
                continue

    def _pre(self, module: nn.Module, args: Any) -> None:
        if not module.training:
            self._before[id(module)] = torch.get_rng_state()

    def _post(self, name: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            before = self._before.pop(id(module), None)
            if before is not None and not torch.equal(before, torch.get_rng_state()):
                self.drawing[name] += 1
        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@dataclass
class EvalProbe:
    """Two evaluations of a fresh copy in eval mode on one batch, and what makes them differ."""

    losses: tuple[float, float] = (math.nan, math.nan)
    rel_diff: float = math.nan
    tolerance: float = math.nan
    dropout: pd.DataFrame = field(default_factory=pd.DataFrame)
    same_seed_agree: bool | None = None  # when they differ without dropout: do two evaluations from one RNG state agree
    error: str = ""
    drawing: tuple[str, ...] = ()  # leaf modules that drew random numbers in eval mode (RngDrawSpy)
    buffers_changed: tuple[str, ...] = ()  # buffers the eval-mode forward changed (an EMA codebook updated in eval)

    @property
    def differ(self) -> bool:
        return not self.error and not self.rel_diff <= self.tolerance

    @property
    def warns(self) -> bool:
        """Functional dropout that ignores the mode, and evaluations that differ: the finding."""
        return (self.differ and len(self.dropout) > 0) or bool(self.drawing) or bool(self.buffers_changed)

    def metrics(self) -> dict[str, Any]:
        if self.error:
            return {"eval_probe": "not evaluated"}
        out: dict[str, Any] = {"eval_loss_first": self.losses[0], "eval_loss_second": self.losses[1],
                               "eval_rel_diff": self.rel_diff, "eval_tolerance": self.tolerance,
                               "functional_dropout_calls": int(self.dropout["calls"].sum()) if len(self.dropout) else 0}
        if self.same_seed_agree is not None:
            out["eval_same_seed_agree"] = self.same_seed_agree
        if self.drawing:
            out["eval_random_draw_modules"] = ", ".join(self.drawing)
        if self.buffers_changed:
            out["eval_buffers_changed"] = ", ".join(self.buffers_changed)
        return out

    def finding(self) -> str:
        """The sentence of the WARN (``warns``), naming each functional dropout call found."""
        calls = "; ".join(f"{r.function}({'dropout_p' if 'attention' in r.function else 'p'}={r.p:g}"
                          f"{'' if 'attention' in r.function else ', training=True'}) in {r.module!r} "
                          f"({r.calls} call{'s' if r.calls != 1 else ''})"
                          for r in self.dropout.itertuples())
        if self.buffers_changed and not (self.differ and len(self.dropout) > 0):
            shown = ", ".join(repr(n) for n in self.buffers_changed[:5]) + (
                f" and {len(self.buffers_changed) - 5} more" if len(self.buffers_changed) > 5 else "")
            return (f"the eval-mode forward changes the model's buffers ({shown}): evaluating updates its state (an "
                    "EMA codebook or statistics updated whatever the mode), so every evaluation moves the model"
                    + (f" and two evaluations differ by {self.rel_diff:.1e}" if self.differ else ""))
        if not (self.differ and len(self.dropout) > 0):  # found by the draws alone
            return (f"module(s) {', '.join(repr(n) for n in self.drawing)} draw random numbers in eval mode (their "
                    f"forward ignores self.training: stochastic depth or noise left on at evaluation); two "
                    f"evaluations differ by {self.rel_diff:.1e} now, which grows as those branches learn")
        return (f"two evaluations of the model in eval mode on the same batch differ ({self.losses[0]:.6g} vs "
                f"{self.losses[1]:.6g}): functional dropout runs whatever the mode: {calls}")

    def note(self) -> str:
        """What the probe found when it is no finding (empty when the evaluations agree)."""
        if self.error:
            return f"eval-mode determinism not checked: {self.error}"
        if not self.differ or self.drawing:
            return ""
        if self.dropout.empty and self.same_seed_agree:
            return (f"two evaluations in eval mode differ ({self.losses[0]:.6g} vs {self.losses[1]:.6g}) by random "
                    "draws in the loss or the model (from the same RNG state they agree): no dropout call found")
        if self.dropout.empty:
            return (f"two evaluations in eval mode differ by {self.rel_diff:.1e} even from the same RNG state: "
                    "nondeterministic kernels (GPU atomics)?")
        return ""

    ADVICE = ("Make functional dropout follow the module's mode: F.dropout(x, p, training=self.training) (F.dropout's "
              "training flag defaults to True), or use an nn.Dropout module; for attention pass "
              "dropout_p=self.dropout if self.training else 0.0; a stochastic-depth or noise layer must pass "
              "self.training (timm's drop_path(x, self.drop_prob, self.training)); a buffer updated in forward (an EMA "
              "codebook) must be updated only when self.training.")


def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def probe_eval_mode(setup: Setup, batch: Any) -> EvalProbe:
    """Evaluate a fresh copy twice in eval mode (no gradients, the Setup's precision) on ``batch``."""
    tol = tolerance_for(setup)
    with preserved():
        ctx = setup.build()
        model = ctx.model
        model.eval()
        needs_grad = loss_needs_grad(setup, model, batch, ctx)  # a gradient penalty inside the loss needs autograd

        def loss() -> float:
            with grad_mode(needs_grad), ctx.autocast():
                return float(setup.loss(model, batch).detach().float())

        spy, draws = DropoutSpy(model), RngDrawSpy(model)
        buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        try:
            with spy:
                first, second = loss(), loss()  # no reseed between them: dropout left on must be allowed to differ
        except TroptError as exc:  # e.g. a model whose eval-mode forward returns predictions, not a loss
            return EvalProbe(error=exc.message)
        finally:
            spy.remove()
            draws.remove()
        if not (math.isfinite(first) and math.isfinite(second)):
            return EvalProbe((first, second), error="the loss in eval mode is not finite")
        changed = tuple(n for n, b in model.named_buffers()
                        if n in buffers and (b.shape != buffers[n].shape or not torch.equal(b, buffers[n])))
        probe = EvalProbe((first, second), _rel(first, second), tol, spy.table(), drawing=tuple(draws.drawing),
                          buffers_changed=changed)
        if probe.differ and probe.dropout.empty:
            again = []
            torch.manual_seed(setup.seed)
            start = RngState.take()  # every global RNG the loss may draw from: torch, numpy, python's random
            for _ in range(2):
                start.restore()
                again.append(loss())
            probe.same_seed_agree = _rel(*again) <= tol
    return probe
