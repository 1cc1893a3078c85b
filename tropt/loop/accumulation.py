"""``loop.accumulation``: does one batch as K micro-batches give the gradient of the batch as one?

Runs the user's step on fresh seeded copies with the batch as 1 micro-batch, as K equal and as K unequal ones, and
compares the gradients at ``optimizer.step()`` and before clipping. Unequal sizes are judged on the micro-batches the
Setup's data really produces (a short batch split into K, :mod:`._micro_sizes`); the artificial split that tries a
loop hardest is a latent note when the data never gives unequal micro-batches. Why they differ is named by
:mod:`.accumulation_causes`. This check owns the finding "``optimizer.step()`` ran more than once per call"; the other
loop checks defer to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from ..core.batch import split_sizes
from ..core.compare import global_rel_error
from ..errors import StepError
from ..registry import register
from ..result import CheckResult, Status
from ..setup import Setup
from ..snapshot import preserved
from ._accumulation_expectation import floor_of, in_expectation_result, objects_result, with_floor
from ._accumulation_runs import Pair, Plan, steps_per_call_result, two_steps
from ._batch_dependence import (
    BATCH_DEPENDENT_LOSS,
    NOT_ISOLATED,
    batch_dependence_table,
    batch_dependent_cause,
    buffer_names,
)
from ._confirm import confirm_accumulation
from ._invariance_common import STANDARD_STEP_ADVICE, cosine, norm_of
from ._micro_sizes import most_unequal, train_batch_sizes, unequal_sizes
from ._verdicts import TOLERANCE, latent_when_unused
from .accumulation_causes import (
    CONSTANT_DIVISOR,
    PER_MICRO_MEAN,
    ZERO_INSIDE,
    loss_grads,
    loss_side_cause,
    near,
    update_side_cause,
)

# Causes that are predictions about the step itself (a scale, lost micro-batches, extra updates): they stand even when
# the model keeps batch-dependent state.
_STEP_TAGS = frozenset({"summed", "divided_twice", CONSTANT_DIVISOR, "scaled", ZERO_INSIDE, "only_last_loss",
                        "only_first_micro_batch", "step_per_micro_batch"})
_BUFFER_ADVICE = ("The forward updates {names} from the micro-batch it sees (a running input mean or a statistic "
                  "kept as a buffer), so micro-batch 2 is normalised with micro-batch 1's values: expect "
                  "accumulation to differ from one big batch. Update such buffers only in training and once per "
                  "optimizer step (or from the whole step's data) if the difference matters; keep them out of the "
                  "gradient path (normalise with a frozen statistic).")
# Relative gap above which an fp32 hypothesis is not exact (fp32 summation order alone gives about 1e-7).
_HIDDEN_EXACT = 1e-4


@register(
    "loop.accumulation",
    title="Gradient accumulation equivalence",
    description="one batch as 1 micro-batch vs as K micro-batches (even and uneven) gives the same gradient",
    plot="tropt.plots.loop",
)
def check_accumulation(setup: Setup, *, k: int | None = None, tol: float | None = None,
                       progress: bool = True) -> CheckResult:
    """FAIL when feeding one batch as K micro-batches changes the gradient that reaches ``optimizer.step()``.

    K is ``setup.accumulation_steps`` when > 1, else 4. Two things are compared: the gradients before any clipping
    (summed over the step's backward passes), which clipping cannot hide and from which the cause is named against
    the Setup's own ``loss_fn`` over the whole batch; and the gradients at ``optimizer.step()``, for what happens
    between backward and step (``zero_grad`` or clipping per micro-batch). Unequal micro-batch sizes are tried first,
    on an artificial split (one large micro-batch, K-1 small): a match there is a PASS; on a mismatch the equal split
    decides between FAIL and "exact only for equal sizes" (e.g. ``loss / K``), which is judged on the micro-batches the
    Setup's data really produces: a latent PASS when it never gives unequal ones (accumulation_steps=1, every batch a
    multiple of K: ``drop_last=True``, equal batches), a WARN measured on its own short batch split into K when it
    does, and a WARN on the artificial split only when the batch sizes cannot be known. ``metrics["uneven_split"]``
    says which split the verdict used ("data" or "artificial"). A step that divides by a
    constant is right only at that K: a latent WARN when it is the configured K. With batch-dependent layers
    (BatchNorm) the comparison is rerun with their batch statistics frozen: WARN when that isolated rerun matches,
    FAIL when it does not. Non-finite gradients are their own FAIL, never a match. A step that cannot run with K
    micro-batches is a latent WARN while the Setup does not accumulate. A named cause is confirmed by applying its fix
    to the captured gradients (:mod:`._confirm`): "confirmed: with X the invariance holds", else "cause not isolated"
    with the closest explanation (``metrics["confirmed"]``, ``metrics["closest_cause"]``).
    """
    try:
        return _check_accumulation(setup, k=k, tol=tol)
    except StepError as exc:
        if setup.accumulation_steps > 1 or not getattr(exc, "in_k_run", False):
            raise
        # A step that cannot take smaller micro-batches (e.g. a recurrent state sized for the full batch) is not
        # wrong while the Setup does not accumulate: a latent note, not an ERROR.
        return CheckResult("loop.accumulation", Status.WARN,
                           f"latent (this Setup does not accumulate gradients): the step cannot run with "
                           f"{k or 4} micro-batches: {exc.message}",
                           {"latent": True, "k": k or 4, "error_type": type(exc.__cause__ or exc).__name__},
                           advice=["Nothing to fix while accumulation_steps=1. Before turning accumulation on, make "
                                   "the step accept micro-batches of any size (size per-batch state such as a "
                                   "recurrent hidden state from the micro-batch, e.g. init_hidden(len(mb))).",
                                   *([exc.fix] if exc.fix else [])])


def _check_accumulation(setup: Setup, *, k: int | None = None, tol: float | None = None) -> CheckResult:
    plan = Plan.make(setup, k, tol)
    with preserved(setup.model):  # the verdict may run the data's own unequal split too
        floor = floor_of(plan)
        if floor > plan.tol:  # a stochastic step: judged in expectation over repeats
            return with_floor(in_expectation_result(plan, floor), floor)
        found = _measure(plan)
        return with_floor(found if isinstance(found, CheckResult) else _verdict(plan, found), floor, plan.sources)


@dataclass
class _Evidence:
    """What the runs measured, for the verdict once every run is done."""

    metrics: dict
    tables: dict
    even_micro: list
    err: float  # the equal split, at optimizer.step()
    pre_err: float  # the equal split, before clipping
    frozen: bool = False  # the equal split matched only with batch statistics frozen
    frozen_pair: Pair | None = None  # that frozen rerun (ctx objects are compared on the runs that matched)
    uerr: float = 0.0  # the unequal split: the worse of at optimizer.step() and before clipping
    ucause: tuple[str, list[str], str | None] | None = None  # the unequal split's cause, when it differs


def _measure(plan: Plan) -> CheckResult | _Evidence:
    """The runs in order, each on a fresh seeded copy; a result as soon as one decides."""
    uneven = _uneven_first(plan) if plan.fast else None
    if isinstance(uneven, CheckResult):
        return uneven
    even = _even_split(plan, uneven)
    if isinstance(even, CheckResult):
        return even
    pair, ev = even
    matched, freeze = (ev.frozen_pair, plan.freeze) if ev.frozen_pair is not None else (pair, False)
    again = lambda: two_steps(plan, ev.even_micro, freeze)  # noqa: E731
    if (objects := objects_result(plan, matched.a, matched.b, ev.metrics, ev.tables, again=again)) is not None:
        return objects
    hidden = _uneven_split(plan, pair, ev, uneven)
    return hidden if hidden is not None else ev


def _uneven_first(plan: Plan) -> CheckResult | Pair:
    """Fast path: a loop exact for unequal micro-batches is exact for equal ones, so one uneven run decides a PASS
    (2 runs); the even split only runs to tell a WARN (uneven-only) from a FAIL."""
    k, n, tol = plan.k, plan.n, plan.tol
    a, ub = plan.one(plan.batch, False), plan.many(plan.uneven_micro, False)
    u = plan.compare(a, ub)
    metrics = {"k": k, "batch_size": n, "uneven_sizes": "+".join(map(str, plan.uneven_sizes)), "max_rel_error": u.err,
               "uneven_split": "artificial", "uneven_max_rel_error": u.err, "pre_clip_max_rel_error": u.pre_err,
               "global_rel_error": global_rel_error(a.post, ub.post), "tolerance": tol,
               "optimizer_steps_in_k_run": ub.calls, "batch_dependent_layers": 0,
               "observed_at": f"{a.where} (and before clipping)"}
    if (bad := plan.broken(a, ub, metrics, {"parameters": u.table})) is not None:
        return bad
    if u.err <= tol and u.pre_err <= tol and ub.calls == 1:
        again = lambda: two_steps(plan, plan.setup.split(plan.even_batch, k), False)  # noqa: E731
        if (objects := objects_result(plan, a, ub, metrics, {"parameters": u.table}, again=again)) is not None:
            return objects
        return CheckResult("loop.accumulation", Status.PASS,
                           f"{k} micro-batches of unequal sizes ({metrics['uneven_sizes']}, an artificial split) give "
                           "the full-batch "
                           f"gradient (max relative error {max(u.err, u.pre_err):.1e} ≤ {tol:.0e}, before and after "
                           "clipping); "
                           "equal sizes follow",
                           metrics, {"parameters": u.table})
    if a.calls > 1:
        return steps_per_call_result(a.calls, metrics, {"parameters": u.table}, a.inner_loop)
    return u


def _even_split(plan: Plan, uneven: Pair | None) -> CheckResult | tuple[Pair, _Evidence]:
    """The equal split into K; on a mismatch with batch-dependent layers, again with their statistics frozen."""
    setup, k, n, tol, bn_layers = plan.setup, plan.k, plan.n, plan.tol, plan.bn_layers
    even_micro = setup.split(plan.even_batch, k)
    a = uneven.a if uneven is not None else plan.one(plan.even_batch, False)
    b = plan.many(even_micro, False)
    p = plan.compare(a, b)
    metrics = {"k": k, "batch_size": n, "micro_batch_sizes": "+".join(map(str, split_sizes(plan.n_even, k))),
               "max_rel_error": p.err, "pre_clip_max_rel_error": p.pre_err,
               "global_rel_error": global_rel_error(a.post, b.post),
               "tolerance": tol, "optimizer_steps_in_k_run": b.calls,
               "grad_norm_ratio": norm_of(b.post) / norm_of(a.post) if norm_of(a.post) else float("nan"),
               "pre_clip_norm_ratio": norm_of(b.pre) / norm_of(a.pre) if norm_of(a.pre) else float("nan"),
               "grad_cosine": cosine(a.post, b.post), "batch_dependent_layers": len(bn_layers),
               "observed_at": f"{a.where} (and before clipping)"}
    ev = _Evidence(metrics, {"parameters": p.table}, even_micro, p.err, p.pre_err)
    if a.calls > 1:
        return steps_per_call_result(a.calls, metrics, ev.tables, a.inner_loop)
    if (bad := plan.broken(a, b, metrics, ev.tables)) is not None:
        return bad
    mismatch = p.err > tol or p.pre_err > tol or b.calls > 1
    if mismatch and b.calls == 1 and (plan.buffers or bn_layers):  # batch-dependent layers or state: isolate them
        f = plan.compare(plan.one(plan.even_batch, plan.freeze), plan.many(even_micro, plan.freeze))
        metrics.update(frozen_max_rel_error=f.err, frozen_pre_clip_max_rel_error=f.pre_err)
        if plan.buffers:
            metrics["forward_updated_buffers"] = buffer_names(plan.buffers)
        ev.tables = {"parameters_frozen_batch_stats": f.table, "parameters": p.table,
                     "batch_dependent_layers": _dependent_table(plan)}
        if f.err > tol or f.pre_err > tol:
            return _mismatch(plan, f, even_micro, plan.freeze, metrics, ev.tables,
                             f"{k} micro-batches change the gradient by {max(f.err, f.pre_err):.1%} even with "
                             f"{_frozen_what(plan)} frozen")
        ev.frozen, ev.frozen_pair = True, f
    elif mismatch:
        return _mismatch(plan, p, even_micro, False, metrics, ev.tables,
                         f"{k} micro-batches change the gradient by {max(p.err, p.pre_err):.1%} (max over parameters"
                         + (", before clipping" if p.pre_err > p.err else "") + ")")
    return p, ev


def _dependent_table(plan: Plan) -> pd.DataFrame:
    rows = [{"layer": n, "why": "BatchNorm: normalises by the batch's statistics"} for n in plan.bn_layers]
    rows += [{"layer": m or "(model)", "why": f"its forward updates the buffer {buffer_names([(m, b)])}"}
             for m, b in plan.buffers]
    return pd.DataFrame(rows, columns=["layer", "why"])


def _frozen_what(plan: Plan) -> str:
    """"BatchNorm statistics", "the buffers the forward updates (norm.mean)", or both."""
    parts = (["BatchNorm statistics"] if plan.bn_layers else []) + (
        [f"the buffers the forward updates ({buffer_names(plan.buffers)})"] if plan.buffers else [])
    return " and ".join(parts)


def _mismatch(plan: Plan, p: Pair, micro: list, freeze: bool | tuple[str, ...], metrics: dict, tables: dict,
              prefix: str) -> CheckResult:
    """The FAIL (or latent WARN) for a mismatch of the equal split, with the cause decided from the evidence."""
    setup, k, tol, close, a, b = plan.setup, plan.k, plan.tol, plan.close, p.a, p.b
    tag: str | None
    loss_tag: str | None = None  # the loss-side cause, when one was tested (its fix is confirmed on the pre-clip sums)
    per_micro = None  # a batch-dependent loss: what a right step gives with it (loss_fn per micro-batch / K)
    if b.calls > 1:
        cause, advice, tag = (f"optimizer.step() ran {b.calls} times for one step of {k} micro-batches",
                              [f"Call optimizer.step() once per {k} micro-batches, after the last backward.",
                               "Clear gradients only after that step, not per micro-batch."], "step_per_micro_batch")
        metrics["optimizer_steps_per_call"] = b.calls
    elif p.pre_err > tol:
        cause, advice, tag = loss_side_cause(setup, micro, plan.even_batch, a, b, k, close, freeze, metrics)
        loss_tag = tag
        if dependent := batch_dependent_cause(setup, micro, plan.even_batch, a, b, k, close, freeze, metrics, tag):
            (cause, advice, tag), tables = dependent, {**tables, "batch_dependence": batch_dependence_table(metrics)}
            loss_tag, per_micro = tag, lambda: loss_grads(setup, micro, [1 / k] * k, freeze)
        if tag not in (ZERO_INSIDE, "only_last_loss") and norm_of(b.last) > 0:
            extra, extra_advice, extra_tag = update_side_cause(setup, b, k, close)
            if extra_tag == ZERO_INSIDE:  # the bigger defect first: K-1 micro-batches are lost
                cause, advice, tag = f"{extra}; also {cause}", extra_advice + advice, extra_tag
    else:
        cause, advice, tag = update_side_cause(setup, b, k, close)
    cause, tag = _confirmed(plan, p, tag, loss_tag, cause, metrics, per_micro)
    metrics["cause"] = tag or "unnamed"
    if tag is None:
        cause = f"cause not isolated ({cause})"
    if plan.buffers and tag not in _STEP_TAGS:  # batch-dependent state the forward keeps: not the step's normalisation
        metrics["cause"] = "forward_updated_buffers"
        return latent_when_unused(setup, CheckResult(
            "loop.accumulation", Status.WARN,
            f"{prefix}: cause not isolated: the forward updates {buffer_names(plan.buffers)} from each micro-batch it "
            "sees, batch-dependent state (like BatchNorm's batch statistics) that K micro-batches cannot reproduce",
            metrics, tables, [_BUFFER_ADVICE.format(names=buffer_names(plan.buffers)), STANDARD_STEP_ADVICE]))
    if tag == BATCH_DEPENDENT_LOSS:  # the loss's own inexactness with a right step: never a FAIL of the step
        latent = "latent (this Setup does not accumulate gradients): " if setup.accumulation_steps == 1 else ""
        return CheckResult("loop.accumulation", Status.WARN, f"{latent}{prefix}: {cause}",
                           {**metrics, **({"latent": True} if latent else {})}, tables, advice)
    # A difference no tested cause explains is a WARN: a FAIL names a cause only when the evidence isolates it, as
    # in loop.zero_grad and loop.ddp (issue 27).
    status = Status.WARN if tag in (None, NOT_ISOLATED) else Status.FAIL
    result = CheckResult("loop.accumulation", status, f"{prefix}: {cause}", metrics, tables,
                         [*advice, STANDARD_STEP_ADVICE])
    if tag == CONSTANT_DIVISOR:
        d = metrics["constant_divisor"]
        if setup.accumulation_steps > 1 and near(d, setup.accumulation_steps):
            return dataclasses.replace(
                result, status=Status.WARN, metrics={**metrics, "latent": True},
                summary=f"latent (correct at the configured K={setup.accumulation_steps}): {cause}")
        return result  # wrong at the configured K itself: a real defect whether or not the Setup accumulates
    return latent_when_unused(setup, result)


def _confirmed(plan: Plan, p: Pair, tag: str | None, loss_tag: str | None, cause: str, metrics: dict,
               per_micro: Callable[[], dict] | None) -> tuple[str, str | None]:
    """The cause with its fix applied to the observed gradients (:mod:`._confirm`): "confirmed: ..." appended when
    the fixed gradients satisfy the invariance; else the cause is only the closest explanation (tag None, the closest
    in ``metrics["closest_cause"]``). A cause whose fix tropt cannot apply is left as it is."""
    both = tag == ZERO_INSIDE and loss_tag not in (None, ZERO_INSIDE)  # zero_grad inside and a loss-side cause
    which = loss_tag if both else tag
    conf = confirm_accumulation(which, p.a.pre, p.b.pre, p.a.post, plan.k, plan.tol, metrics, per_micro)
    if conf is None:
        return cause, tag
    if both:
        conf = dataclasses.replace(conf, fix=f"zero_grad once per optimizer step and {conf.fix}")
    metrics.update(conf.metrics())
    if conf.confirmed:
        return f"{cause}; {conf.sentence()}", tag
    metrics["closest_cause"] = tag
    return f"closest explanation: {cause}; {conf.sentence()}", None


def _uneven_split(plan: Plan, even: Pair, ev: _Evidence, uneven: Pair | None) -> CheckResult | None:
    """The even split is exact (possibly with frozen batch statistics): now unequal micro-batch sizes."""
    if uneven is None:  # not measured on the fast path
        freeze = plan.freeze if ev.frozen else False
        ua = even.a if plan.n_even == plan.n and not ev.frozen else plan.one(plan.batch, freeze)
        uneven = plan.compare(ua, plan.many(plan.uneven_micro, freeze))
    ev.uerr = max(uneven.err, uneven.pre_err)
    ev.metrics.update(uneven_sizes="+".join(map(str, plan.uneven_sizes)), uneven_split="artificial",
                      uneven_max_rel_error=ev.uerr)
    ev.tables["parameters_uneven"] = uneven.table
    if ev.uerr > plan.tol and not ev.frozen:
        ev.ucause = loss_side_cause(plan.setup, plan.uneven_micro, plan.batch, uneven.a, uneven.b, plan.k, plan.close,
                                    False, {})
    return _hidden_under_tolerance(plan, ev)


def _hidden_under_tolerance(plan: Plan, ev: _Evidence) -> CheckResult | None:
    """A FAIL when per-micro-batch means, named from the unequal split, also bias the equal split in fp32.

    In half precision the equal split's error can hide under the tolerance. Per-micro-batch means are exact for
    equal-sized micro-batches only when the loss is a mean over samples, not over tokens or positions: ask the loss
    function itself, in full precision, on the equal split.
    """
    setup, k, tol, ucause = plan.setup, plan.k, plan.tol, ev.ucause
    if ucause is None or ucause[2] != PER_MICRO_MEAN or tol <= TOLERANCE["fp32"]:
        return None
    try:
        still = bool(plan.bn_layers)  # BatchNorm's per-micro-batch statistics are not what this asks about
        hidden = global_rel_error(loss_grads(setup, [plan.even_batch], [1.0], still, autocast=False),
                                  loss_grads(setup, ev.even_micro, [1 / k] * k, still, autocast=False))
    except Exception:  # noqa: BLE001 - a loss that only runs under autocast: keep the WARN below
        hidden = float("nan")
    ev.metrics["equal_split_error_of_cause_fp32"] = hidden
    if not hidden > _HIDDEN_EXACT:
        return None
    metrics = ev.metrics
    return latent_when_unused(setup, CheckResult(
        "loop.accumulation", Status.FAIL,
        f"{k} micro-batches change the gradient ({ev.uerr:.1%} with unequal sizes {metrics['uneven_sizes']}): "
        f"{ucause[0]}; equal-sized micro-batches are off too ({hidden:.1%} in fp32), hidden here under the "
        f"{setup.precision} tolerance ({ev.err:.1%} ≤ {tol:.0e})",
        {**metrics, "cause": PER_MICRO_MEAN}, ev.tables, ucause[1] + [STANDARD_STEP_ADVICE]))


def _verdict(plan: Plan, ev: _Evidence) -> CheckResult:
    """The equal split matched (maybe only with frozen batch statistics): judge the unequal one."""
    k, tol, metrics, tables, uerr = plan.k, plan.tol, ev.metrics, ev.tables, ev.uerr
    if ev.frozen and plan.buffers:
        names = buffer_names(plan.buffers)
        summary = (f"accumulation is exact once {_frozen_what(plan)} are frozen (error "
                   f"{metrics['frozen_max_rel_error']:.1e}); live, {k} micro-batches differ by {ev.err:.1%}: the "
                   f"forward updates {names} from each micro-batch, batch-dependent state")
        advice = [_BUFFER_ADVICE.format(names=names)]
    elif ev.frozen:
        summary = (f"accumulation is exact once BatchNorm's batch statistics are frozen (error "
                   f"{metrics['frozen_max_rel_error']:.1e}); with live batch statistics {k} micro-batches differ by "
                   f"{ev.err:.1%}, as BatchNorm does by design")
        advice = [f"Expect accumulation over {k} micro-batches to differ from one big batch: {len(plan.bn_layers)} "
                  "BatchNorm layer(s) normalise each micro-batch by its own statistics.",
                  "If that matters, use GroupNorm/LayerNorm, or larger micro-batches."]
    if ev.frozen:
        if uerr > tol:
            advice.append(f"Also: unequal micro-batch sizes (an artificial {metrics['uneven_sizes']} split) change the "
                          f"gradient by {uerr:.1%}; weight each micro-batch loss by its share of the samples.")
        return CheckResult("loop.accumulation", Status.WARN, summary, metrics, tables, advice)
    if uerr <= tol:
        return CheckResult("loop.accumulation", Status.PASS,
                           f"{k} micro-batches give the full-batch gradient (max relative error "
                           f"{max(ev.err, ev.pre_err, uerr):.1e} ≤ {tol:.0e}, even and uneven: an artificial "
                           f"{metrics['uneven_sizes']} split)", metrics, tables)
    return _unequal_only(plan, ev)


def _unequal_only(plan: Plan, ev: _Evidence) -> CheckResult:
    """Exact for equal micro-batches only, on the artificial split: judged on the micro-batches this Setup's data
    really produces. A latent PASS when it never gives unequal ones (no accumulation, every batch a multiple of K);
    the data's own unequal split decides when it has one; the artificial split only when its sizes are unknown."""
    setup, metrics, tables, ucause = plan.setup, ev.metrics, ev.tables, ev.ucause
    what, advice = _unequal_finding(f"on an artificial split ({metrics['uneven_sizes']})", ev.uerr, ucause)
    acc = setup.accumulation_steps
    sizes = train_batch_sizes(setup)
    if sizes is not None:
        metrics["train_batch_sizes"] = ", ".join(map(str, sorted(set(sizes))))
    if acc == 1 or (sizes is not None and not unequal_sizes(sizes, acc)):
        # This Setup's data cannot give unequal micro-batches: a note for a future change, not a wrong update now.
        why = ("it does not accumulate (accumulation_steps=1)" if acc == 1 else
               f"every batch ({metrics['train_batch_sizes']} samples) splits into {acc} equal micro-batches")
        metrics["latent"] = True
        return CheckResult("loop.accumulation", Status.PASS,
                           f"exact for the micro-batches this Setup produces ({why}); latent: {what}", metrics, tables,
                           ["Nothing to fix for this data. Before feeding batches whose size is not a multiple of K (a "
                            "short last batch, variable-length samples):", *advice])
    short = most_unequal(sizes, acc, plan.n) if sizes is not None else None
    if short is None:
        why = ("the batch sizes this Setup's data gives are not known (an iterable dataset or a custom batch sampler)"
               if sizes is None else f"its unequal batches ({', '.join(map(str, unequal_sizes(sizes, acc)))} "
               f"samples) are larger than the sampled batch of {plan.n}")
        return CheckResult("loop.accumulation", Status.WARN, f"{what}; judged there because {why}", metrics, tables,
                           advice)
    return _data_split(plan, ev, short)


def _unequal_finding(where: str, err: float, cause: tuple[str, list[str], str | None] | None) -> tuple[str, list[str]]:
    """The sentence and advice for unequal micro-batches that change the gradient, naming a cause that explains it."""
    named = cause if cause is not None and cause[2] not in (None, PER_MICRO_MEAN, "scaled") else None
    what = f"exact for equal micro-batches, but unequal sizes change the gradient by {err:.1%} {where}"
    if named is not None:
        what += f": {named[0]}"
    advice = [*(named[1] if named is not None else
                ["Weight each micro-batch loss by its share of the step's samples (n_i / n) instead of dividing by K, "
                 "or make every micro-batch the same size (drop_last=True)."]), STANDARD_STEP_ADVICE]
    return what, advice


def _data_split(plan: Plan, ev: _Evidence, short: int) -> CheckResult:
    """The unequal micro-batches the data really produces: a batch of ``short`` samples split into the Setup's K,
    run on the first ``short`` samples of the sampled batch, against that batch as 1 micro-batch."""
    setup, metrics, tables, acc, tol = plan.setup, ev.metrics, ev.tables, plan.setup.accumulation_steps, plan.tol
    batch = setup.split(plan.batch, sizes=[short, plan.n - short])[0] if short < plan.n else plan.batch
    sizes = split_sizes(short, acc)
    micro = setup.split(batch, sizes=sizes)
    p = plan.compare(plan.one(batch, False), plan.many(micro, False, k=acc))
    err = max(p.err, p.pre_err)
    label = "+".join(map(str, sizes))
    metrics.update(uneven_split="data", data_uneven_batch_size=short, data_uneven_sizes=label,
                   data_uneven_max_rel_error=err)
    tables["parameters_data_uneven"] = p.table
    if (bad := plan.broken(p.a, p.b, metrics, tables)) is not None:
        return bad
    where = f"on the unequal micro-batches this Setup's data produces (the {short}-sample batch as {label})"
    if err <= tol:
        what, advice = _unequal_finding(f"on an artificial split ({metrics['uneven_sizes']})", ev.uerr, ev.ucause)
        metrics["latent"] = True
        return CheckResult("loop.accumulation", Status.PASS,
                           f"exact for the micro-batches this Setup produces (max relative error {err:.1e} ≤ {tol:.0e} "
                           f"{where}); latent: {what}", metrics, tables,
                           ["Nothing to fix for this data. Before feeding batches that split more unequally:", *advice])
    cause = None
    if p.pre_err > tol and p.b.calls == 1:
        cause = loss_side_cause(setup, micro, batch, p.a, p.b, acc, plan.close, False, {})
    what, advice = _unequal_finding(where, err, cause)
    return CheckResult("loop.accumulation", Status.WARN,
                       f"{what}; an artificial {metrics['uneven_sizes']} split: {ev.uerr:.1%}", metrics, tables, advice)
