"""Why K micro-batches and one batch differ: the cause analysis of ``loop.accumulation`` (also used by ``loop.ddp``).

A mismatch is explained from the gradients before any clipping. Which run is wrong is decided against an independent
reference, the Setup's ``loss_fn`` over the whole batch; then hypotheses built from ``loss_fn`` per micro-batch
(summed losses, a constant divisor, per-micro-batch means, only the last or first micro-batch, zero_grad inside the
loop) are tested and the closest exact one is named.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

from ..core.compare import global_rel_error
from ..core.modes import quiet_randomness
from ..core.noise_floor import reseed
from ..core.own_hooks import dense
from ..setup import Setup
from ._invariance_common import cosine, norm_of


def loss_grads(setup: Setup, micro_batches: list, weights: list[float], freeze: bool | tuple[str, ...], *,
               autocast: bool = True, stream: int = 0) -> dict:
    """Gradient of ``sum_i w_i * loss_fn(model, mb_i)`` on a fresh seeded copy: a hypothesis about the user's step.

    ``autocast=False`` computes it in full precision, free of the half-precision noise the tolerance allows for.
    ``stream`` is the RNG stream the loss draws from (:func:`tropt.core.noise_floor.reseed`); ``freeze`` as
    :func:`._batch_dependence.freeze_batch_dependence` (True: BatchNorm; a tuple: also those modules).
    """
    from ._batch_dependence import freeze_batch_dependence
    from ._stochastic import QuietFunctionalDropout

    ctx = setup.build()
    reseed(setup.seed, stream)
    quiet_randomness(ctx.model)
    freeze_batch_dependence(ctx.model, freeze)
    ctx.model.train()
    with QuietFunctionalDropout():  # as in the runs it predicts
        for mb, w in zip(micro_batches, weights, strict=False):
            with ctx.autocast() if autocast else contextlib.nullcontext():
                loss = ctx.loss_fn(ctx.model, mb)
            (loss.float() * w).backward()
    # A sparse gradient (nn.Embedding(sparse=True)) is made dense: the predictions are compared entry by entry.
    return {n: (None if p.grad is None else dense(p.grad.detach()).float().clone())
            for n, p in ctx.model.named_parameters()}


@dataclass
class Run:
    """One observed call of the step: gradients at ``optimizer.step()`` (``post``), what the losses gave before any
    clipping (``pre``, summed over the backward passes), the last backward pass's share, the optimizer steps, and the
    flattened ``state_dict`` of each stateful object the step keeps on ctx (``objects``: an EMA model)."""

    post: dict
    pre: dict
    last: dict
    calls: int
    where: str = "optimizer.step"
    objects: dict = field(default_factory=dict)  # the state of stateful objects the step keeps on ctx (an EMA model)
    inner_loop: bool = False  # its repeated optimizer steps each follow a fresh backward (n_critic, PPO epochs)


def join_changes_losses(setup: Setup, micro: list, whole: object, freeze: bool | tuple[str, ...]) -> float:
    """How much the per-micro-batch hypothesis moves when its micro-batches are cut back out of the joined batch
    ``whole`` (the same samples, padded to the joined width) instead of taken as the loader gave them: the relative
    error between the two gradients of ``sum_i loss_fn(mb_i) / K``. 0.0 when the join re-padded nothing. A loss that
    ignores padding gives the same gradient either way, whatever the micro-batches' item counts."""
    from ..core.batch import leaves

    sizes = [setup.size(mb) for mb in micro]
    if sum(sizes) != setup.size(whole):
        return 0.0
    pieces = setup.split(whole, sizes=sizes)

    def shapes(batch: object) -> list:
        return sorted(tuple(t.shape) for _, t in leaves(batch))

    if all(shapes(p) == shapes(m) for p, m in zip(pieces, micro, strict=True)):
        return 0.0
    w = [1 / len(micro)] * len(micro)
    return global_rel_error(loss_grads(setup, list(pieces), w, freeze), loss_grads(setup, micro, w, freeze))


def _scaled(g: dict, c: float) -> dict:
    return {n: (None if v is None else v * c) for n, v in g.items()}


def scalar_fit(g: dict, ref: dict) -> tuple[float, float]:
    """(c, residual): the c that makes ``g ≈ c·ref`` best (least squares) and the relative error left at that c."""
    rr = sum(float(r.double().pow(2).sum()) for r in ref.values() if r is not None)
    if rr == 0:
        return float("nan"), 1.0
    c = sum(float((g[n].double() * r.double()).sum())
            for n, r in ref.items() if r is not None and g.get(n) is not None) / rr
    return c, global_rel_error(g, _scaled(ref, c))


def near(x: float, y: float, rel: float = 0.02) -> bool:
    return math.isfinite(x) and math.isfinite(y) and abs(x - y) <= rel * max(abs(y), 1e-12)


PER_MICRO_MEAN = "per_micro_mean"
_PER_MICRO_MEAN_SUMMED = "per_micro_mean_summed"
CONSTANT_DIVISOR = "constant_divisor"
ZERO_INSIDE = "last_only"
_DIVIDE_ADVICE = "divide each micro-batch loss by len(micro_batches) (or weight it by its share of the step's samples)"


def _summed(k: int) -> tuple[str, list[str]]:
    return (f"the accumulated gradient is {k}× the full-batch one: micro-batch losses are summed, not averaged",
            [f"Divide each micro-batch loss by K={k} before backward() (or weight it by its share of the step's "
             "samples)."])


def _divided_twice(k: int) -> tuple[str, list[str]]:
    return (f"the accumulated gradient is 1/{k} of the full-batch one: the loss is divided by K twice",
            ["Divide the loss by K once (either per micro-batch or after accumulating, not both)."])


def loss_side_cause(setup: Setup, micro: list, whole: object, a: Run, b: Run, k: int, close: float,
                    freeze: bool | tuple[str, ...], facts: dict) -> tuple[str, list[str], str | None]:
    """Name what the K-micro-batch losses did wrong, from the gradients before any clipping.

    First decide which run is wrong against an independent reference, the Setup's ``loss_fn`` over the whole batch:
    each run's pre-clip gradient is fitted as ``c·reference``. When both runs are exact multiples, the two factors
    name the cause (a constant divisor, a sum, a double division); otherwise the K run is tested against the
    hypotheses built from ``loss_fn`` per micro-batch (per-micro-batch means, only the last micro-batch).
    """
    ref = loss_grads(setup, [whole], [1.0], freeze)
    ca, ra = scalar_fit(a.pre, ref)
    cb, rb = scalar_fit(b.pre, ref)
    facts.update(reference_factor_1x=ca, reference_factor_kx=cb, reference_residual_1x=ra, reference_residual_kx=rb)
    if ra <= close and rb <= close:
        return from_factors(ca, cb, k, facts)
    hypotheses = _hypotheses(setup, micro, a, b, k, close, freeze, ref, ca, ra)
    tag, (err, cause, advice) = min(hypotheses.items(), key=lambda kv: kv[1][0])
    facts["closest_hypothesis"], facts["closest_hypothesis_error"] = tag, err
    if err <= close and tag in (PER_MICRO_MEAN, _PER_MICRO_MEAN_SUMMED):
        # "loss_fn per micro-batch" also reproduces a K run whose micro-batches lose nothing by their own
        # normalisation but change when joined: batches padded to their own longest and joined (join_fn) are padded
        # wider, and a loss that reads the padding (no attention mask, padding averaged into a pooled embedding,
        # padded labels not ignored) then differs. Tell the two apart before naming the item count.
        moved = join_changes_losses(setup, micro, whole, freeze)
        facts["join_loss_change"] = moved
        if moved > close:
            return (f"the loss reads the padding: the micro-batches' gradient changes (relative error {moved:.2g}) "
                    "when they are cut back out of the step's joined batch (the same samples, padded to the joined "
                    "batch's width), so batches padded to different lengths are not interchangeable",
                    ["Make the loss ignore padding: pass the attention mask to the model, weight pooled embeddings "
                     "by it, and set padded labels to -100 (ignore_index)."], "padding_dependent")
    if err <= close:
        return cause, advice, tag
    ratio = norm_of(b.pre) / norm_of(a.pre) if norm_of(a.pre) else float("nan")
    return (f"before clipping: norm ratio {ratio:.3f}, cosine {cosine(a.pre, b.pre):.4f}",
            ["Make each micro-batch contribute its share of the full-batch loss: weight it by its share of the step's "
             "items (samples or tokens) and call backward() on every micro-batch before one optimizer step."], None)


def from_factors(ca: float, cb: float, k: int, facts: dict) -> tuple[str, list[str], str | None]:
    """Both runs are exact multiples of the reference (``ca``, ``cb``): the two factors name the cause."""
    if near(cb / ca, k):  # the K run grows with K: every micro-batch loss is divided by the same constant D
        d = 1 / ca
        if near(d, 1.0):
            return (*_summed(k), "summed")
        facts["constant_divisor"] = round(d, 6)
        return (f"your step divides the loss by a constant {d:g} whatever the number of micro-batches: correct at "
                f"K={d:g}, wrong for any other K (here 1 micro-batch gives {ca:.3g}× the whole-batch gradient, {k} "
                f"give {cb:.3g}×)",
                [f"Use the number of micro-batches actually passed: {_DIVIDE_ADVICE}, not a constant {d:g}."],
                CONSTANT_DIVISOR)
    if near(ca, 1.0) and near(cb * k, 1.0):
        return (*_divided_twice(k), "divided_twice")
    return (f"the {k}-micro-batch gradient is {cb:.3g}× the whole-batch gradient of loss_fn (1 micro-batch: "
            f"{ca:.3g}×)",
            [f"Make each micro-batch contribute its share of the full-batch loss: {_DIVIDE_ADVICE}."], "scaled")


def _hypotheses(setup: Setup, micro: list, a: Run, b: Run, k: int, close: float, freeze: bool | tuple[str, ...],
                ref: dict, ca: float, ra: float) -> dict[str, tuple[float, str, list[str]]]:
    """Per hypothesis about the K run: (its error against the K run's pre-clip gradient, cause, advice)."""
    base = a.pre if ra > close else _scaled(ref, ca)  # when the 1x run is not the reference, compare with it directly
    fit = ca if ra <= close else 1.0
    _, r_last = scalar_fit(b.pre, loss_grads(setup, micro[-1:], [1.0], freeze))
    _, r_first = scalar_fit(b.pre, loss_grads(setup, micro[:1], [1.0], freeze))
    return {
        "summed": (global_rel_error(b.pre, _scaled(base, k)), *_summed(k)),
        "divided_twice": (global_rel_error(b.pre, _scaled(base, 1 / k)), *_divided_twice(k)),
        "only_last_loss": (r_last, "only the last micro-batch's loss is backpropagated",
                           ["Call backward() on every micro-batch's loss, then step once."]),
        # A step written for one batch reads micro_batches[0] (an LBFGS closure step, a port of a loop that never
        # accumulated): the other micro-batches are silently dropped.
        "only_first_micro_batch": (r_first, "only the first micro-batch is used: the step reads micro_batches[0] and "
                                   "ignores the others",
                                   ["Loop over every micro-batch the step receives (backward on each, then one "
                                    "optimizer step); a step that never accumulates may keep reading "
                                    "micro_batches[0], but then keep accumulation_steps=1."]),
        PER_MICRO_MEAN: (
            global_rel_error(b.pre, _scaled(loss_grads(setup, micro, [1 / k] * k, freeze), fit)),
            "it equals the average of per-micro-batch mean losses: each micro-batch's loss is normalised by its own "
            "item count",
            ["Each micro-batch loss is a mean over its own items (tokens, pixels, non-padding positions); averaging "
             "those means weights items unequally. Sum the per-item losses and divide by the total item count of the "
             "whole optimizer step (the 2024 transformers gradient-accumulation bug)."]),
        _PER_MICRO_MEAN_SUMMED: (
            global_rel_error(b.pre, _scaled(loss_grads(setup, micro, [1.0] * k, freeze), fit)),
            f"it equals the sum of the {k} per-micro-batch mean losses: each micro-batch's loss is normalised by its "
            "own item count and none is divided by K",
            ["Each micro-batch loss is a mean over its own items (tokens, non-padding positions) and the K of them are "
             "summed. Sum the per-item losses and divide by the total item count of the whole optimizer step (a "
             "transformers Trainer passes it to compute_loss as num_items_in_batch; a compute_loss that ignores it "
             "must set loss_is_scaled_for_ga = False)."]),
    }


def update_side_cause(setup: Setup, b: Run, k: int, close: float) -> tuple[str, list[str], str | None]:
    """Name what happened between the K backward passes and ``optimizer.step()`` when the losses were right."""
    _, r = scalar_fit(b.post, b.last)
    if r <= close and norm_of(b.last) > 0 and global_rel_error(b.pre, b.last) > close:
        return ("only the last micro-batch reaches the step: the gradients are cleared inside the micro-batch loop",
                ["Do not call zero_grad() inside the micro-batch loop; call it once per optimizer step."], ZERO_INSIDE)
    return ("the micro-batch losses give the right gradient, but what reaches optimizer.step() depends on the number "
            "of micro-batches: something between backward() and step() (clipping per micro-batch, rescaling, "
            "zeroing) runs per micro-batch",
            ["Run backward() on every micro-batch first, then unscale, clip once and step once."],
            "between_backward_and_step")
