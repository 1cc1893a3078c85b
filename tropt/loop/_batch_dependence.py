"""Is the loss itself batch-dependent? The alternative ``loop.accumulation`` tests before blaming the step.

A loss that is a mean over per-item terms gives the same value on a batch and on that batch concatenated with
itself. A contrastive loss with in-batch negatives (InfoNCE, CLIP) or a batch-statistics loss does not: each item's
term depends on the other items, so K micro-batches can never give the full batch's gradient, whatever the step
does. Then the right K-micro-batch gradient is the one ``loss_fn`` gives per micro-batch averaged over the K, and the
step is judged against that prediction: a match is a WARN naming the loss; K times or 1/K of it is still the step's
normalisation bug.

Batch-dependent *state* is the other alternative: a buffer the forward updates from the batch it sees (a running input
mean, not BatchNorm), which makes micro-batch 2 depend on micro-batch 1. :func:`forward_updated_buffers` finds such
buffers with one training forward on a copy; :func:`freeze_batch_dependence` keeps their modules (and BatchNorm) in
eval mode for the isolating rerun.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.batch import is_plain_sequence, rebuild
from ..core.compare import weighted_mean_fit
from ..core.modes import freeze_batch_stats, quiet_randomness
from ..setup import Setup
from ._invariance_common import cosine, norm_of
from .accumulation_causes import Run, from_factors, loss_grads, near, scalar_fit

BATCH_DEPENDENT_LOSS = "batch_dependent_loss"
NOT_ISOLATED = "not_isolated"
_SCALE_TAGS = frozenset({"summed", "divided_twice", "constant_divisor", "scaled"})
_LOSS_ADVICE = [
    "The loss couples the items of a batch (in-batch negatives, batch statistics), so K micro-batches of n/K items "
    "see fewer negatives than one batch of n: accumulation cannot reproduce the full-batch gradient.",
    "For the full-batch loss under accumulation, use gradient caching (GradCache: embed every micro-batch without "
    "gradients, compute the loss over all embeddings, then backpropagate per micro-batch), or use a larger "
    "micro-batch (fewer accumulation steps) so each sees enough negatives.",
]


Freeze = bool | tuple[str, ...]  # False; True (BatchNorm); or BatchNorm and these modules (they update buffers)


def freeze_batch_dependence(model: torch.nn.Module, freeze: Freeze) -> None:
    """BatchNorm on its running statistics and, for a tuple, those modules kept in eval mode whatever the step sets
    (their forward stops updating its buffers when it checks ``self.training``)."""
    if not freeze:
        return
    freeze_batch_stats(model)
    for name in freeze if isinstance(freeze, tuple) else ():
        m = model.get_submodule(name)
        m.eval()
        m.train = (lambda self_: (lambda mode=True: self_))(m)  # type: ignore[method-assign,assignment]


def forward_updated_buffers(setup: Setup, batch: Any) -> list[tuple[str, str]]:
    """(module, buffer) for every floating-point buffer one training forward of ``loss_fn`` changes, outside
    BatchNorm-style layers (their own rerun freezes them): batch-dependent state such as a running input mean."""
    from ..core.modes import batch_dependent_layers

    ctx = setup.build()
    quiet_randomness(ctx.model)
    ctx.model.train()
    skip = set(batch_dependent_layers(ctx.model))
    owners = [(mname, bname, buf) for mname, m in ctx.model.named_modules() if mname not in skip
              for bname, buf in m.named_buffers(recurse=False) if buf is not None and buf.is_floating_point()]
    before = [buf.detach().clone() for _, _, buf in owners]
    try:
        with torch.no_grad(), ctx.autocast():
            ctx.loss_fn(ctx.model, batch)
    except Exception:  # noqa: BLE001 - the step's own runs report a loss that fails
        return []
    return [(mname, bname) for (mname, bname, buf), old in zip(owners, before, strict=True)
            if buf.shape != old.shape or not torch.equal(buf.detach(), old)]


def buffer_names(found: Sequence[tuple[str, str]]) -> str:
    """"norm.mean, norm.count": the buffers, by their dotted names."""
    return ", ".join(f"{m}.{b}" if m else b for m, b in found)


def _doubled(x: Any, n: int, dim: int) -> Any:
    """``x`` with every batch-sized part repeated: each tensor leaf ``torch.cat([t, t], dim)``, like the split."""
    if isinstance(x, torch.Tensor):
        if x.ndim > dim and x.shape[dim] == n:
            return torch.cat([x, x], dim=dim)
        return torch.cat([x, x]) if dim and x.ndim >= 1 and x.shape[0] == n else x  # per-sample values
    if isinstance(x, Mapping):
        return rebuild(x, {key: _doubled(v, n, dim) for key, v in x.items()})
    if is_plain_sequence(x):
        return rebuild(x, list(x) * 2) if len(x) == n else x
    if isinstance(x, (list, tuple)):
        return rebuild(x, [_doubled(v, n, dim) for v in x])
    return x


def _loss_value(ctx: Any, batch: Any, *, autocast: bool, seed: int | None = None) -> float:
    from ._stochastic import QuietFunctionalDropout

    with torch.random.fork_rng() if seed is not None else contextlib.nullcontext():
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad(), QuietFunctionalDropout(), ctx.autocast() if autocast else contextlib.nullcontext():
            return float(ctx.loss_fn(ctx.model, batch).float())


DOUBLING_REPEATS = 16  # seeded draws of a loss that draws noise (timesteps, masks, a VAE's reparameterisation)


def _doubling(ctx: Any, batch: Any, twice: Any, *, autocast: bool) -> tuple[float, float, float]:
    """(loss_fn(batch), loss_fn(batch twice over), the standard error of their ratio).

    A loss that draws from the RNG inside itself (diffusion noise and timesteps, ``randn_like`` in a VAE's forward)
    gives another value on every call, so one call on each batch compares two random draws: a sum-reduced loss then
    looks batch-dependent. Such a loss is compared by the means of seeded draws (the same seeds for both batches), with
    the ratio's standard error; a loss that draws nothing gives the exact values and an error of 0."""
    one, two = (_loss_value(ctx, b, autocast=autocast, seed=0) for b in (batch, twice))
    if _loss_value(ctx, batch, autocast=autocast, seed=1) == one:
        return one, two, 0.0
    ones = np.array([_loss_value(ctx, batch, autocast=autocast, seed=s) for s in range(DOUBLING_REPEATS)])
    twos = np.array([_loss_value(ctx, twice, autocast=autocast, seed=s) for s in range(DOUBLING_REPEATS)])
    one, two = float(ones.mean()), float(twos.mean())
    if not (math.isfinite(one) and math.isfinite(two)) or one == 0:
        return one, two, 0.0
    n = len(ones)
    rel = math.sqrt((ones.std(ddof=1) / one) ** 2 / n + (twos.std(ddof=1) / two) ** 2 / n)
    return one, two, abs(two / one) * rel


def _doubles(one: float, two: float, se: float) -> bool:
    """The loss doubles on the batch twice over: a sum over items (within 3 standard errors for a random loss)."""
    if se > 0:
        return one != 0 and abs(two / one - 2) <= 3 * se < 0.5
    return near(two, 2 * one, 1e-4)


def loss_kind(setup: Setup, batch: Any, *, freeze: Freeze, close: float) -> str | None:
    """"batch_dependent" (loss_fn on the batch twice over differs from loss_fn on the batch), "sum" (it doubles: a
    sum over items), or None (a per-item mean, or it cannot be told)."""
    dep = loss_batch_dependence(setup, batch, freeze=freeze)
    if dep > close:
        return "batch_dependent"
    if math.isnan(dep) and setup.split_fn is None:
        ctx = setup.build()
        quiet_randomness(ctx.model)
        freeze_batch_dependence(ctx.model, freeze)
        ctx.model.train()
        try:
            one, two, se = _doubling(ctx, batch, _doubled(batch, setup.size(batch), setup.batch_dim), autocast=False)
        except Exception:  # noqa: BLE001 - a loss that cannot take the doubled batch: unknown
            return None
        if math.isfinite(one) and one != 0 and _doubles(one, two, se):
            return "sum"
    return None


def loss_batch_dependence(setup: Setup, batch: Any, *, freeze: Freeze) -> float:
    """|loss_fn(batch twice over) - loss_fn(batch)| / |loss_fn(batch)|: 0 for a per-item mean loss.

    NaN when it cannot be told: a custom ``split_fn`` layout (tropt cannot concatenate it), a loss that fails on the
    doubled batch, or a loss that is a sum over items (exactly 2× on the doubled batch: per-item, not coupled).
    """
    if setup.split_fn is not None:
        return float("nan")
    ctx = setup.build()
    quiet_randomness(ctx.model)
    freeze_batch_dependence(ctx.model, freeze)
    ctx.model.train()
    twice = _doubled(batch, setup.size(batch), setup.batch_dim)
    try:  # full precision first, free of half-precision noise; under autocast for a loss that only runs there
        one, two, se = _doubling(ctx, batch, twice, autocast=False)
    except Exception:  # noqa: BLE001 - retried under autocast
        try:
            one, two, se = _doubling(ctx, batch, twice, autocast=True)
        except Exception:  # noqa: BLE001 - a loss that cannot take the doubled batch: the probe says nothing
            return float("nan")
    if not (math.isfinite(one) and math.isfinite(two)) or _doubles(one, two, se):
        return float("nan")
    dep = abs(two - one) / max(abs(one), 1e-12)
    # A random loss is batch-dependent only when its mean moves beyond the spread of its draws.
    return dep if se == 0 or dep > 3 * se else 0.0


def loss_coupling(setup: Setup, whole: Any, parts: list, *, freeze: Freeze) -> float:
    """How far ``loss_fn``'s gradient on the whole batch is from every item-weighted mean of its gradients on the
    parts: the relative residual of the least-squares fit ``g(whole) ~ sum_p w_p g(part_p)`` with ``sum_p w_p = 1``.

    Any loss that is a mean of per-sample terms, whatever it normalises by (samples, tokens, non-padding positions),
    gives 0 up to rounding: the whole batch's mean is the item-weighted mean of the parts' means (``w_p`` their item
    shares). A loss that couples the samples of its batch does not, even where the twice-over probe sees nothing
    because duplicates change nothing: batch-hard triplet mining (a max and a min over the batch), a load-balancing
    loss over the batch's routing fractions (a product of batch means), an expert capacity that scales with the
    batch. NaN when the parts' gradients cannot be computed (a loss that fails on a part) or the fit is degenerate.
    """
    try:
        ref = loss_grads(setup, [whole], [1.0], freeze, autocast=False)
        per = [loss_grads(setup, [p], [1.0], freeze, autocast=False) for p in parts]
    except Exception:  # noqa: BLE001 - a loss that cannot run on a part: the probe says nothing
        return float("nan")
    return weighted_mean_fit(ref, per)[0]



def batch_dependent_cause(setup: Setup, micro: list, whole: Any, a: Run, b: Run, k: int, close: float,
                          freeze: Freeze, facts: dict, tag: str | None) -> tuple[str, list[str], str] | None:
    """The cause of a mismatch when the loss is batch-dependent, or None when it is not (or a scale cause stands).

    The 1-micro-batch run is fitted against ``loss_fn`` over the whole batch and the K run against ``loss_fn`` per
    micro-batch averaged over the K (what a right step gives with this loss): both factors 1 is the loss's own
    inexactness (a WARN); K or 1/K is the step's normalisation, named as for any loss.
    """
    if tag in _SCALE_TAGS or tag in ("only_last_loss", "only_first_micro_batch"):
        return None  # already an exact prediction about the step
    dep = loss_batch_dependence(setup, whole, freeze=freeze)
    if dep > close:
        facts["loss_batch_dependence"] = dep
        what = (f"the loss is batch-dependent: loss_fn on the batch twice over differs from loss_fn on the batch by "
                f"{dep:.1%}: in-batch negatives / batch statistics cannot accumulate exactly")
        per_micro = (f"judged against loss_fn per micro-batch: the loss is batch-dependent ({dep:.1%} apart on the "
                     "batch twice over), which does not excuse a scale")
    elif tag not in (None, "per_micro_mean", "per_micro_mean_summed"):
        return None  # a more specific cause stands (the padding read, ...): nothing to tell apart
    else:
        # Duplicates change nothing for a loss built on a max/min or on means over the batch: ask whether the whole
        # batch's gradient is any item-weighted mean of the micro-batches' (what every per-item loss gives), the
        # one thing that tells such a loss from per-micro-batch item-count means.
        coupled = loss_coupling(setup, whole, micro, freeze=freeze)
        if not coupled > close:
            return None
        facts["loss_coupling_residual"] = coupled
        what = (f"the loss is batch-dependent: loss_fn's gradient on the whole batch is no item-weighted mean of its "
                f"gradients on the micro-batches (best fit residual {coupled:.1%}), so the loss couples the samples "
                "of a batch (in-batch mining, a load-balancing loss over the batch, a capacity that scales with it) "
                "and cannot accumulate exactly")
        per_micro = (f"judged against loss_fn per micro-batch: the loss is batch-dependent (no item weighting of the "
                     f"micro-batches reproduces the whole batch: residual {coupled:.1%}), which does not excuse a "
                     "scale")
    ca, ra = facts.get("reference_factor_1x", float("nan")), facts.get("reference_residual_1x", 1.0)
    cb, rb = scalar_fit(b.pre, loss_grads(setup, micro, [1 / k] * k, freeze))
    facts.update(batch_dependent_factor_kx=cb, batch_dependent_residual_kx=rb)
    if ra <= close and rb <= close:
        if near(ca, 1.0) and near(cb, 1.0):
            return (f"{what}; the step itself is right (its {k}-micro-batch gradient is loss_fn per micro-batch "
                    f"averaged over the {k}, residual {rb:.1e})", list(_LOSS_ADVICE), BATCH_DEPENDENT_LOSS)
        cause, advice, scale_tag = from_factors(ca, cb, k, facts)
        return f"{cause} ({per_micro})", advice, scale_tag or "scaled"
    ratio = norm_of(b.pre) / norm_of(a.pre) if norm_of(a.pre) else float("nan")
    for factor, scale_tag in ((k, "summed"), (1 / k, "divided_twice")):  # a scale bug whatever the loss
        if near(ratio, factor, 0.05) and cosine(a.pre, b.pre) > 0.9:
            cause, advice, _ = from_factors(1.0, factor, k, facts)
            return f"{cause} (norm ratio {ratio:.3f}; {per_micro})", advice, scale_tag
    return (f"cause not isolated: {what}, but the step's {k}-micro-batch gradient is not even loss_fn per "
            f"micro-batch averaged over the {k} (residual {rb:.1%}; norm ratio {ratio:.3f})",
            [f"Backpropagate loss_fn on every micro-batch divided by K={k}, then step once: with this loss that is "
             "the closest accumulation comes to the full batch.", *_LOSS_ADVICE], NOT_ISOLATED)


def batch_dependence_table(facts: dict) -> pd.DataFrame:
    """The evidence: the probe's value and how each run fits its prediction."""
    rows = [("loss_fn(batch twice over) vs loss_fn(batch)", facts.get("loss_batch_dependence")),
            ("loss_fn(whole batch) vs best item-weighted mean of loss_fn per micro-batch: residual",
             facts.get("loss_coupling_residual")),
            ("1 micro-batch / loss_fn(whole batch): factor", facts.get("reference_factor_1x")),
            ("1 micro-batch / loss_fn(whole batch): residual", facts.get("reference_residual_1x")),
            ("K micro-batches / mean of loss_fn per micro-batch: factor", facts.get("batch_dependent_factor_kx")),
            ("K micro-batches / mean of loss_fn per micro-batch: residual", facts.get("batch_dependent_residual_kx"))]
    return pd.DataFrame(rows, columns=["quantity", "value"])
