"""What makes a step stochastic, and the state the step keeps on ctx: shared by ``loop.accumulation``,
``loop.ddp`` and ``loop.zero_grad`` for the noise floor (:mod:`tropt.core.noise_floor`).

Sources are named from one instrumented run: the global generators the step drew from (their state advanced),
functional dropout seen by a ``TorchFunctionMode`` (:class:`._eval_determinism.DropoutSpy`: ``F.dropout``, attention
dropout inside ``scaled_dot_product_attention``), and, when neither, nondeterministic kernels. The objects a step keeps
on ctx with a ``state_dict`` (an EMA model) are flattened after each run so two configurations can compare them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

from ..core.compare import flatten_state
from ..core.noise_floor import rng_advanced
from ._eval_determinism import DropoutSpy, active_dropout

T = TypeVar("T")


class QuietFunctionalDropout(TorchFunctionMode):
    """Functional dropout switched off while active: ``F.dropout(x, p, training=True)`` returns ``x`` and attention
    runs with ``dropout_p=0``, as :func:`tropt.core.modes.quiet_randomness` sets ``nn.Dropout(p=0)`` in a copy, so
    randomness not under test (HF models call ``nn.functional.dropout`` directly) cannot fake or mask a difference.
    ``calls`` counts what it switched off, by function."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        spec, _ = active_dropout(func, args, kwargs)
        if spec is not None:
            self.calls[spec.name] += 1
            if spec.training is None:  # attention: the same call without dropout
                if len(args) > 4:
                    args = (*args[:4], 0.0, *args[5:])
                else:
                    kwargs = {**kwargs, "dropout_p": 0.0}
            else:
                return args[0] if args else kwargs.get("input")
        return func(*args, **kwargs)


def spied(model: torch.nn.Module, run: Callable[[], T]) -> tuple[T, list[str]]:
    """``run()`` and what in it is random: the generators it advanced and the functional dropout calls it made
    (switched off by :class:`QuietFunctionalDropout`, named all the same)."""
    spy = DropoutSpy(model)
    try:
        with QuietFunctionalDropout(), spy:  # the spy on top: it sees each call before it is switched off
            out, advanced = rng_advanced(run)
    finally:
        spy.remove()
    found = [f"it draws from the global RNG ({', '.join(advanced)})"] if advanced else []
    table = spy.table()
    if len(table):
        calls = ", ".join(f"{r.function}(p={r.p:g}) in {r.module!r}" for r in table.itertuples())
        found.append(f"functional dropout (switched off for the comparison, as nn.Dropout is): {calls}")
    return out, found


def nondeterministic_kernels(sources: list[str]) -> list[str]:
    """The sources to report: those found, else nondeterministic kernels (no draw and no dropout was seen)."""
    return sources or ["no random draw was seen: nondeterministic kernels (GPU atomics) or state outside the RNGs"]


def ctx_objects(ctx: Any) -> dict[str, dict[str, torch.Tensor]]:
    """The flattened ``state_dict`` of each object with ``state_dict``/``load_state_dict`` the step keeps on ctx
    (an EMA model, a second model), by attribute name; copies, so later training cannot change them."""
    out = {}
    for name in ctx.user_state():
        obj: Any = getattr(ctx, name, None)
        stateful = callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
        if obj is not None and stateful:
            try:
                state = flatten_state(obj.state_dict())
            except Exception:  # noqa: BLE001 - an object whose state cannot be read is not compared
                continue
            out[name] = {k: v.detach().clone().float() if v.is_floating_point() else v.detach().clone().double()
                         for k, v in state.items()}
    return out


def object_differences(a: dict, b: dict, tol: float, steady: dict | None = None) -> list[dict]:
    """Rows (object, entry, value in a, value in b, relative difference) where ctx objects differ between two runs.

    ``steady`` (a second run of ``a``'s configuration on another stream) keeps only the entries that do not change
    with the step's randomness (a counter, a decay): for a stochastic step the rest is compared in expectation.
    """
    rows = []
    for name, state in a.items():
        other = b.get(name)
        if other is None:
            continue
        for key, x in state.items():
            y = other.get(key)
            if y is None or x.shape != y.shape:
                continue
            if steady is not None:
                s = steady.get(name, {}).get(key)
                if s is None or s.shape != x.shape or not torch.equal(s, x):
                    continue
            d = float((x.double() - y.double()).norm())
            rel = d / max(float(x.double().norm()), float(y.double().norm()), 1e-12)
            if rel > tol:
                rows.append({"object": name, "entry": key, "value_1x": _show(x), "value_kx": _show(y),
                             "rel_difference": rel})
    return rows


def _show(t: torch.Tensor) -> float | str:
    return float(t) if t.numel() == 1 else f"tensor of {t.numel()} (norm {float(t.double().norm()):.4g})"


def per_micro_batch_update(rows: list[dict], k: int) -> list[dict]:
    """The rows that are counters grown k-fold: the object was updated once per micro-batch, not once per step."""
    out = []
    for r in rows:
        x, y = r["value_1x"], r["value_kx"]
        if isinstance(x, float) and isinstance(y, float) and x >= 1 and float(x).is_integer() and y == k * x:
            out.append(r)
    return out
