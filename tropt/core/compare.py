"""Tensor comparison, defined once: relative errors between two named sets of tensors (gradients, updates, states).

Norms are Frobenius norms over finite entries; non-finite entries (inf, NaN) are compared by exact equality, so an
infinite value never makes a difference vanish relative to it. A tensor present on one side only is a full mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch

Tensors = Mapping[str, torch.Tensor | None]  # named tensors (gradients, updates, states); None: absent on this side


def _as_float(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_floating_point() and t.dtype in (torch.float32, torch.float64) else t.float()


def _nonfinite_pair(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float | None]:
    """(|x|, |y|, |x - y|) over finite entries only; the diff is None when a non-finite entry differs.

    Non-finite entries are compared by exact equality (inf == inf, NaN == NaN): a norm of inf would make any
    difference vanish relative to it, e.g. ReduceLROnPlateau's ``best`` = inf before its first step vs 1.0 after.
    """
    x, y = x.detach().double().cpu(), y.detach().double().cpu()
    if x.shape != y.shape:
        return float(x.nan_to_num(0.0, 0.0, 0.0).norm()), float(y.nan_to_num(0.0, 0.0, 0.0).norm()), None
    fx, fy = torch.isfinite(x), torch.isfinite(y)
    bad = ~(fx & fy)
    same = (x[bad] == y[bad]) | (x[bad].isnan() & y[bad].isnan())
    nx, ny = float(x.where(fx, 0.0).norm()), float(y.where(fy, 0.0).norm())
    return nx, ny, (float((x - y).where(~bad, 0.0).norm()) if bool(same.all()) else None)


def _pair_norms(a: Tensors, b: Tensors) -> dict[str, tuple[float, float, float | None]]:
    """Per name: (|a|, |b|, |a - b|) with batched foreach norms (one host read).

    The diff is None for a full mismatch: a tensor present on one side only, or non-finite entries that differ.
    Norms cover finite entries only (see :func:`_nonfinite_pair`), so they are always finite.
    """
    names = list(a) + [n for n in b if n not in a]
    in_a = {n: t for n, t in a.items() if t is not None}
    in_b = {n: t for n, t in b.items() if t is not None}
    both = [n for n in names if n in in_a and n in in_b]
    xs, ys = [_as_float(in_a[n]) for n in both], [_as_float(in_b[n]) for n in both]
    lone = [(n, in_a[n] if n in in_a else in_b[n]) for n in names if (n in in_a) != (n in in_b)]
    norms: list[torch.Tensor] = []
    if both:
        norms += torch._foreach_norm(xs) + torch._foreach_norm(ys) + torch._foreach_norm(torch._foreach_sub(xs, ys))
    norms += [_as_float(t).nan_to_num(0.0, 0.0, 0.0).norm() for _, t in lone]
    values = torch.stack([v.double().cpu() for v in norms]).tolist() if norms else []
    k = len(both)
    out = {}
    for i, n in enumerate(both):
        triple = (values[i], values[k + i], values[2 * k + i])
        # A non-finite norm means a non-finite entry (or an overflow): redo that pair exactly, in float64.
        out[n] = triple if all(math.isfinite(v) for v in triple) else _nonfinite_pair(in_a[n], in_b[n])
    for j, (n, _) in enumerate(lone):
        v = values[3 * k + j]
        out[n] = (v, 0.0, None) if a.get(n) is not None else (0.0, v, None)
    for n in names:
        out.setdefault(n, (0.0, 0.0, 0.0))
    return {n: out[n] for n in names}


def _rel(nx: float, ny: float, d: float | None, scale: float) -> float:
    """Relative error of one pair; a full mismatch (d None) is 1."""
    return 1.0 if d is None else d / max(nx, ny, 1e-6 * scale)


def max_rel_error(a: Tensors, b: Tensors) -> float:
    """The worst per-tensor relative error of :func:`compare_tensors`, without building its table."""
    norms = _pair_norms(a, b)
    scale = max([max(nx, ny) for nx, ny, _ in norms.values()] + [1e-30])
    return max([_rel(nx, ny, d, scale) for nx, ny, d in norms.values()] + [0.0])


def compare_tensors(a: Tensors, b: Tensors, *, labels: tuple[str, str] = ("a", "b")) -> pd.DataFrame:
    """Per-tensor relative error ``|a - b| / max(|a|, |b|)`` (Frobenius norms), worst first.

    A tensor present on one side only (e.g. a gradient that is None in one run) counts as error 1. The
    denominator is floored at 1e-6 of the largest norm so tensors that are zero in both runs compare as equal.
    Non-finite entries (inf, NaN) stay out of the norms and are compared exactly: any difference there is error 1.
    """
    la, lb = labels
    norms = _pair_norms(a, b)
    scale = max([max(nx, ny) for nx, ny, _ in norms.values()] + [1e-30])
    rows = []
    for name, (nx, ny, diff) in norms.items():
        rows.append({"tensor": name, f"norm_{la}": nx, f"norm_{lb}": ny,
                     "abs_diff": max(nx, ny) if diff is None else diff,
                     "rel_error": _rel(nx, ny, diff, scale)})
    df = pd.DataFrame(rows, columns=["tensor", f"norm_{la}", f"norm_{lb}", "abs_diff", "rel_error"])
    return df.sort_values("rel_error", ascending=False, kind="stable").reset_index(drop=True)


def global_rel_error(a: Tensors, b: Tensors) -> float:
    """Relative error of all tensors together: ``|a - b| / max(|a|, |b|)`` over the concatenation."""
    norms = _pair_norms(a, b)
    diff2 = sum((max(nx, ny) if d is None else d) ** 2 for nx, ny, d in norms.values())
    denom = math.sqrt(max(sum(nx**2 for nx, _, _ in norms.values()), sum(ny**2 for _, ny, _ in norms.values())))
    return math.sqrt(diff2) / denom if denom > 0 else 0.0


def flatten_state(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor (and number, as a 0-d float64 tensor) in a nested state, by dotted path — for comparing states.

    Tensors are views of the live ones (no copy): compare before training goes on.
    """
    out: dict[str, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach() if obj.is_floating_point() else obj.detach().double()
    elif isinstance(obj, bool):
        out[prefix] = torch.tensor(float(obj))
    elif isinstance(obj, (int, float)):
        out[prefix] = torch.tensor(float(obj), dtype=torch.float64)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten_state(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten_state(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def nonfinite_tensors(grads: Tensors) -> dict[str, int]:
    """Per tensor name, how many entries are inf or NaN (only names that have some)."""
    out = {}
    for name, g in grads.items():
        if g is not None and g.is_floating_point():
            bad = int((~torch.isfinite(g)).sum())
            if bad:
                out[name] = bad
    return out


def weighted_mean_fit(whole: Tensors, parts: Sequence[Tensors]) -> tuple[float, torch.Tensor | None]:
    """The least-squares fit ``whole ~ sum_p w_p parts[p]`` with ``sum_p w_p = 1``, over the tensors every one of them
    has: (relative residual, weights). A per-item mean over a batch is the item-weighted mean of its means over the
    batch's parts (``w_p`` their item shares), so a gradient that comes from one fits with residual ~0. NaN and None
    when fewer than two parts, no common tensor, a non-finite value or a zero ``whole`` leave nothing to fit."""
    names = [n for n, g in whole.items() if g is not None and all(q.get(n) is not None for q in parts)]
    if not names or len(parts) < 2:
        return math.nan, None

    def flat(g: Tensors) -> torch.Tensor:
        return torch.cat([g[n].detach().double().flatten() for n in names])  # type: ignore[union-attr]

    g, gs = flat(whole), [flat(q) for q in parts]
    if not (torch.isfinite(g).all() and all(torch.isfinite(x).all() for x in gs)) or float(g.norm()) == 0.0:
        return math.nan, None
    last = gs[-1]
    a = torch.stack([x - last for x in gs[:-1]], 1)  # sum w = 1: w_last = 1 - sum of the others
    w = torch.linalg.pinv(a) @ (g - last)  # SVD: parts that repeat one sample set are rank-deficient
    weights = torch.cat([w, (1 - w.sum()).reshape(1)])
    return float((g - last - a @ w).norm() / g.norm()), weights
