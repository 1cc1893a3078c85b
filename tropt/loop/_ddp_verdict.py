"""The verdict of ``loop.ddp`` from its runs: non-finite gradients, unused parameters, a gradient mismatch (with its
cause), BatchNorm's by-design difference and wasted all-reduces."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..result import CheckResult, Status
from ..setup import Setup
from ._verdicts import nonfinite_result


def rank0_grads(ranks: list[tuple], which: int = 0) -> dict:
    """Rank 0's gradients at its optimizer step (``which=0``) or the processes' averaged pre-clip gradients (1)."""
    return {name: (None if g is None else torch.from_numpy(g)) for name, g in ranks[0][2][which].items()}


def _rel_difference(a: np.ndarray | None, b: np.ndarray | None) -> float | None:
    """||a - b|| / max(||a||, ||b||), 0 for identical arrays (NaNs in the same places included), inf for a
    non-finite difference, 1 when only one side has a gradient; None when neither has one."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        return 1.0
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a64.shape == b64.shape and np.array_equal(a64, b64, equal_nan=True):
        return 0.0
    if a64.shape != b64.shape:
        return float("inf")
    diff = float(np.linalg.norm(a64 - b64))
    if not np.isfinite(diff):
        return float("inf")
    return diff / max(float(np.linalg.norm(a64)), float(np.linalg.norm(b64)), 1e-30)


def replica_table(ranks: list[tuple]) -> pd.DataFrame:
    """Every rank's gradients at ``optimizer.step()`` and parameters after the step against rank 0's: one row per
    (rank, parameter, what was compared), with the relative difference."""
    rows = []
    for what, which in (("gradient at optimizer.step", 0), ("parameter after the step", 2)):
        reference = ranks[0][2][which]
        for rank, _, payload, _, _ in ranks[1:]:
            for name, ref in reference.items():
                rel = _rel_difference(payload[which].get(name), ref)
                if rel is not None:
                    rows.append({"rank": rank, "parameter": name, "rel_difference": rel, "compared": what})
    return pd.DataFrame(rows, columns=["rank", "parameter", "rel_difference", "compared"])


BUFFER_MARK = " (a buffer its forward updates)"  # how loop.ddp lists such buffers among its batch-dependent layers


@dataclass
class DdpEvidence:
    """The single-process run, the DDP ranks, and the reruns that tell why they differ."""

    world_size: int
    tol: float
    k: int
    per_rank: int  # samples per process
    single: dict  # the single-process gradients at optimizer.step()
    ranks: list[tuple]
    where: str  # where the single-process update was observed
    table: pd.DataFrame  # the decisive comparison
    post: pd.DataFrame  # the comparison at optimizer.step()
    pre_clip: bool  # the decisive comparison is before clipping
    err: float
    unused: list[str]  # trainable parameters the single-process step gives no gradient
    utable: pd.DataFrame | None  # the comparison with find_unused_parameters=True
    bn_layers: list[str]
    ftable: pd.DataFrame | None  # the comparison with batch statistics frozen
    per_mean: str | None  # "process" or "micro-batch" when per-part means explain the difference
    replicas: pd.DataFrame  # every rank's gradients and parameters against rank 0's (replica_table)
    loss: str | None = None  # "batch_dependent", "coupled" or "sum": the difference tested against the loss itself
    view: int = 0  # the decisive view: 0 at optimizer.step, 3 at the clip call's entry, 1 the losses' own gradients


@dataclass
class _Report:
    """The result's metrics and tables, and the all-reduce counts the verdict reads."""

    metrics: dict
    tables: dict
    syncs_per_step: int
    wasted_syncs: int
    evaluations: int
    per: str  # what one optimizer step consists of ("4 micro-batches", ...)


def _ddp_report(setup: Setup, e: DdpEvidence) -> _Report:
    world_size, k, ranks, pre_clip = e.world_size, e.k, e.ranks, e.pre_clip
    allreduces, syncs_per_step, fresh_syncs, closure_evaluations = ranks[0][3]
    # A synchronised backward pass is needed when it starts from cleared gradients (each evaluation of an LBFGS
    # closure, SAM's second pass after first_step(zero_grad=True)); one that adds to gradients not yet used is wasted.
    evaluations = max(1, closure_evaluations)
    wasted_syncs = max(0, syncs_per_step - max(1, fresh_syncs))
    per = f"{k} micro-batches" + (f", {evaluations} closure evaluations" if evaluations > 1 else "")
    metrics = {"world_size": world_size, "samples_per_process": e.per_rank, "micro_batches": k, "max_rel_error": e.err,
               "optimizer_steps_per_call": max(int(np.max(c)) if c else 0 for *_, c in ranks), "observed_at": e.where,
               "tolerance": e.tol, "allreduce_buckets": allreduces, "synchronised_backward_passes": syncs_per_step,
               "closure_evaluations": closure_evaluations,
               "backward_passes_from_cleared_gradients": fresh_syncs, "batch_dependent_layers": len(e.bn_layers),
               "replica_max_rel_difference": float(e.replicas["rel_difference"].max()) if len(e.replicas) else 0.0}
    before = ("gradients at the entry of the step's clip call" if e.view == 3
              else "gradients before clipping, averaged over processes")
    metrics["compared"] = (f"{before} (at optimizer.step they differ by {float(e.post['rel_error'].max()):.1%})"
                           if pre_clip else "gradients at optimizer.step")
    at_step = {"parameters_at_step": e.post} if pre_clip and setup.grad_clip is not None else {}
    tables = {"parameters": e.table, **at_step,
              "ranks": pd.DataFrame([{"rank": r, "bucket_allreduces": s[0], "synchronised_backward_passes": s[1],
                                      "optimizer_steps": int(np.sum(c))} for r, _, _, s, c in ranks])}
    return _Report(metrics, tables, syncs_per_step, wasted_syncs, evaluations, per)


_ADVICE_STD = "Compare your step with tropt.standard_step, which skips the all-reduce of all but the last micro-batch."


def ddp_verdict(setup: Setup, e: DdpEvidence) -> CheckResult:
    r = _ddp_report(setup, e)
    metrics, tables, world_size, tol = r.metrics, r.tables, e.world_size, e.tol
    # A non-finite gradient in either run is the finding: no averaging or normalisation cause is guessed from it.
    bad = nonfinite_result("loop.ddp", {"1_process": (1, e.single), f"ddp_{world_size}": (1, rank0_grads(e.ranks))})
    if bad is not None:
        return CheckResult("loop.ddp", Status.FAIL, bad.summary, {**metrics, **bad.metrics}, {**tables, **bad.tables},
                           bad.advice)
    if e.unused:
        metrics["unused_parameters"] = len(e.unused)
        tables["unused_parameters"] = pd.DataFrame({"parameter": e.unused})
    if e.utable is not None:
        metrics["find_unused_max_rel_error"] = float(e.utable["rel_error"].max())
        tables["parameters_find_unused"] = e.utable
        if metrics["find_unused_max_rel_error"] <= tol:
            return _unused_result(setup, e, r)
    if metrics["allreduce_buckets"] == 0 and (e.err > tol or r.metrics["replica_max_rel_difference"] > tol):
        # DDP reduced nothing: the replicas differ because of that, and tropt's average of the ranks' gradients
        # would match "per-process means" by construction: no other cause is tested.
        return bypassed_result(metrics, r.tables, max(e.err, r.metrics["replica_max_rel_difference"]), world_size)
    if r.metrics["replica_max_rel_difference"] > tol:
        return _out_of_sync_result(e, r)
    if e.ftable is not None:
        metrics["frozen_max_rel_error"] = float(e.ftable["rel_error"].max())
        r.tables = tables = {"parameters_frozen_batch_stats": e.ftable, **tables,
                             "batch_dependent_layers": pd.DataFrame({"layer": e.bn_layers})}
    decisive, derr = (e.ftable, metrics["frozen_max_rel_error"]) if e.ftable is not None else (e.table, e.err)
    if derr > tol:
        return _mismatch_result(setup, e, r, decisive, derr)
    return _sync_result(setup, e, r, derr)


def _loss_result(setup: Setup, e: DdpEvidence, r: _Report, ratio: float, derr: float) -> CheckResult | None:
    """The loss itself explains the difference: a batch-dependent loss whose DDP gradient is the average of its
    per-process values (what a right step gives with it), or a sum-reduced loss that DDP's averaging scales by
    1/world_size. None when neither does."""
    world, metrics = e.world_size, r.metrics
    if e.loss in ("batch_dependent", "coupled") and e.per_mean is not None:
        metrics.update(cause="batch_dependent_loss", loss_batch_dependent=True)
        probe = ("loss_fn on the batch twice over differs from loss_fn on the batch: in-batch negatives, batch "
                 "statistics" if e.loss == "batch_dependent" else
                 "loss_fn's gradient on the whole batch is no item-weighted mean of its gradients on the processes' "
                 "shares: in-batch mining, a load-balancing loss over the batch")
        return CheckResult(
            "loop.ddp", Status.WARN,
            f"under DDP with {world} processes the gradients differ by {derr:.1%}: the loss is batch-dependent "
            f"({probe}), and each process computes it over its own {e.per_rank} samples; the step itself is right "
            f"(its gradient is the average of loss_fn per {e.per_mean})", metrics, r.tables,
            ["Each process sees only its own items as negatives. For the full-batch loss, gather the embeddings of "
             "every process with gradients before the loss (open_clip's gather_with_grad / SimCLR's GatherLayer: "
             "torch.distributed.nn.all_gather), or use a larger batch per process."])
    if e.loss == "sum" and abs(ratio * world - 1) < 0.05:
        return sum_loss_result(setup, world, ratio, metrics, r.tables)
    return None


def sum_loss_result(setup: Setup, world: int, ratio: float, metrics: dict, tables: dict) -> CheckResult:
    """A sum-reduced loss that DDP's averaging scales by 1/world_size: FAIL for a Setup meant for DDP, else latent."""
    metrics["cause"] = "sum_reduced_loss"
    return CheckResult(
        "loop.ddp", Status.FAIL if setup.distributed else Status.WARN,
        f"{'' if setup.distributed else 'latent (Setup(distributed=False)): '}under DDP with {world} processes "
        f"the gradients are {ratio:.3g}× the single-process ones: the loss is a sum over samples (loss_fn on the "
        f"batch twice over is 2× loss_fn on the batch), and DDP averages the processes' gradients, so each "
        f"process's sum counts 1/{world}", {**metrics, **({} if setup.distributed else {"latent": True})},
        tables,
        [f"Under DDP, multiply a sum-reduced loss by the world size ({world}) or use a mean loss (and rescale the "
         "learning rate), so the update matches one process on the whole batch."])


def _unused_result(setup: Setup, e: DdpEvidence, r: _Report) -> CheckResult:
    """Parameters without a gradient leave their bucket un-reduced; with find_unused_parameters=True they match. A
    FAIL for a Setup meant for DDP (``distributed=True``); on a single-process Setup nothing is wrong yet: a latent
    WARN ("if you wrap this in DDP, find_unused_parameters=True is needed")."""
    unused, metrics = e.unused, r.metrics
    named = ", ".join(unused[:5]) + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
    metrics["cause"] = "unused parameters"
    found = (f"{len(unused)} parameter(s) get no gradient from the loss ({named}): DDP without "
             f"find_unused_parameters=True waits for their gradients, so their bucket is never all-reduced and the "
             f"gradients under DDP with {e.world_size} processes {'' if setup.distributed else 'would '}differ by "
             f"{e.err:.1%} (real DDP training also raises \"Expected to have finished reduction in the prior "
             f"iteration\" at the next step); with find_unused_parameters=True they match (error "
             f"{metrics['find_unused_max_rel_error']:.1e})")
    advice = [f"Remove the unused branch from the forward pass (or detach / not compute it) when the loss does not "
              f"use it: {named}.",
              "Or wrap with DistributedDataParallel(model, find_unused_parameters=True) (an extra graph traversal "
              "per step)."]
    if setup.distributed:
        return CheckResult("loop.ddp", Status.FAIL, found, metrics, r.tables, advice)
    # A single-process loop trains these parameters' neighbours correctly: only a DDP wrap would break it.
    return CheckResult("loop.ddp", Status.WARN,
                       f"latent (Setup(distributed=False)): if you wrap this in DDP, find_unused_parameters=True is "
                       f"needed: {found}", {**metrics, "latent": True}, r.tables, advice)


def _mismatch_result(setup: Setup, e: DdpEvidence, r: _Report, decisive: pd.DataFrame, derr: float) -> CheckResult:
    """FAIL: the gradients differ under DDP (with batch statistics frozen, when the model has such layers)."""
    world_size, per_mean, metrics = e.world_size, e.per_mean, r.metrics
    ratio = float(decisive[f"norm_ddp_{world_size}"].sum() / max(decisive["norm_1_process"].sum(), 1e-30))
    if (loss := _loss_result(setup, e, r, ratio, derr)) is not None:
        return loss
    why = (f" (DDP gradients are {ratio:.3g}× the single-process ones: the averaging is applied twice)"
           if abs(ratio * world_size - 1) < 0.05
           else f" (DDP gradients are {ratio:.3g}× the single-process ones: they are summed, not averaged)"
           if abs(ratio - world_size) < 0.05
           else "")
    advice = ["DDP already averages gradients over processes: do not divide the loss by the world size or "
              "all-reduce gradients yourself.", "Give every process an equal share of each batch.", _ADVICE_STD]
    if not why and per_mean is not None:
        metrics["cause"] = f"per-{per_mean} mean"
        why = (f" (they equal the average of per-{per_mean} mean losses: each {per_mean} normalises its loss by its "
               "own item count, so items (tokens, non-padding positions) are weighted unequally)")
        advice = ["Normalise by the item count of the whole step over all processes: sum each micro-batch's per-item "
                  "losses (reduction='sum'), all-reduce this process's item count (torch.distributed.all_reduce on a "
                  "tensor holding it) and scale the loss by world_size / global_count (DDP averages the gradients "
                  "over processes, so the world size cancels).", _ADVICE_STD]
    if not why:  # no prediction matched: say so, with the evidence, rather than pick the nearest cause
        metrics["cause"] = "not_isolated"
        why = f"; cause not isolated (DDP gradients are {ratio:.3g}× the single-process ones, no cause predicts that)"
    frozen = " even with BatchNorm statistics frozen" if e.ftable is not None else ""
    # The batch composition (each process normalising by its own items) changes nothing on one process: for a
    # Setup not declared for DDP it is latent. A division by the world size or a sum of the processes' gradients is
    # written in the user's step: a FAIL either way.
    latent = metrics.get("cause") == f"per-{per_mean} mean" and not setup.distributed
    if latent:
        metrics["latent"] = True
    # No prediction explains the difference: say what differs, as a WARN (as loop.zero_grad and the in-expectation
    # path do): the evidence shows a difference, not a defect of a named kind, and a false FAIL on a healthy loop (a
    # batch dependence tropt did not find) costs more than a WARN on a real bug, which is still flagged.
    unexplained = metrics.get("cause") == "not_isolated"
    return CheckResult("loop.ddp", Status.WARN if latent or unexplained else Status.FAIL,
                       f"{'latent (Setup(distributed=False)): ' if latent else ''}"
                       f"under DDP with {world_size} processes the gradients {'would ' if latent else ''}differ by "
                       f"{derr:.1%}"
                       f"{' before clipping' if e.pre_clip and setup.grad_clip is not None else ''}{frozen}{why}",
                       metrics, r.tables, advice)


def _sync_result(setup: Setup, e: DdpEvidence, r: _Report, derr: float) -> CheckResult:
    """The gradients match: judge BatchNorm's by-design difference and the all-reduces per optimizer step."""
    world_size, err, metrics, tables = e.world_size, e.err, r.metrics, r.tables
    syncs_per_step, wasted_syncs, evaluations, per = r.syncs_per_step, r.wasted_syncs, r.evaluations, r.per
    # Advice that runs both under DDP and on a plain module (which has no no_sync()).
    no_sync = (f"Wrap the backward passes of the first {e.k - 1} micro-batches in `with (ctx.model.no_sync() if "
               "isinstance(ctx.model, torch.nn.parallel.DistributedDataParallel) else contextlib.nullcontext()):` "
               "(a plain module has no no_sync()).")
    buffers = [layer.removesuffix(BUFFER_MARK) for layer in e.bn_layers if layer.endswith(BUFFER_MARK)]
    if e.ftable is not None and buffers:
        names = ", ".join(buffers)
        return CheckResult("loop.ddp", Status.WARN,
                           f"gradients match under DDP once the buffers the forward updates ({names}) are frozen "
                           f"(error {derr:.1e}); live, each process updates them from its own {e.per_rank} samples "
                           f"and the gradients differ by {err:.1%}: batch-dependent state, not the loss's "
                           "normalisation", {**metrics, "forward_updated_buffers": names}, tables,
                           [f"The forward updates {names} from the batch it sees (a running statistic kept as a "
                            "buffer): under DDP each process sees its own share, so expect the gradients to differ "
                            "from one process on the whole batch; keep such statistics out of the gradient path, or "
                            "all-reduce them yourself if they must be global."])
    if e.ftable is not None:
        wasted = (f"; they are also all-reduced {syncs_per_step}× per optimizer step ({per})"
                  if wasted_syncs > 0 else "")
        return CheckResult("loop.ddp", Status.WARN,
                           "gradients match under DDP once BatchNorm's batch statistics are frozen "
                           f"(error {derr:.1e}); "
                           f"with live statistics each process normalises its {e.per_rank} samples by themselves and "
                           f"the gradients differ by {err:.1%}, as BatchNorm does by design{wasted}", metrics, tables,
                           [f"Expect {len(e.bn_layers)} BatchNorm layer(s) to see {e.per_rank} samples per process "
                            "under DDP, not the whole batch; if that is too few for stable statistics, convert them "
                            "with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (CUDA) or use "
                            "GroupNorm/LayerNorm."]
                           + ([no_sync] if wasted_syncs > 0 else []))
    if wasted_syncs > 0:
        wasted = (f"gradients match under DDP, but they are all-reduced {syncs_per_step}× per optimizer step "
                  f"({per}): {wasted_syncs} of those are wasted communication")
        if not setup.distributed:
            # Only communication, and only under DDP: a note for a Setup not declared as meant for DDP.
            return CheckResult("loop.ddp", Status.PASS,
                               f"{world_size} DDP processes reach the single-process gradients "
                               f"(max relative error {err:.1e}); latent (Setup(distributed=False)): {wasted}",
                               {**metrics, "latent": True}, tables, [no_sync, _ADVICE_STD])
        return CheckResult("loop.ddp", Status.WARN, wasted, metrics, tables, [no_sync, _ADVICE_STD])
    return CheckResult("loop.ddp", Status.PASS,
                       f"{world_size} DDP processes reach the single-process gradients (max relative error {err:.1e}) "
                       + ("with one all-reduce per optimizer step" if syncs_per_step <= 1 else
                          f"with one all-reduce per backward pass that starts from cleared gradients ({syncs_per_step} "
                          f"per optimizer step{f': {evaluations} closure evaluations' if evaluations > 1 else ''})"),
                       metrics, tables)


def _out_of_sync_result(e: DdpEvidence, r: _Report) -> CheckResult:
    """FAIL: some rank's gradients at optimizer.step() or parameters after the step differ from rank 0's. DDP keeps
    replicas identical only while every process applies the same update; the finding needs no single-process run."""
    table = e.replicas
    bad = table[table["rel_difference"] > e.tol].sort_values("rel_difference", ascending=False, kind="stable")
    steps = int(np.sum(e.ranks[0][4])) if e.ranks[0][4] else 1
    params, grads = (bad[bad["compared"] == "parameter after the step"],
                     bad[bad["compared"] == "gradient at optimizer.step"])
    worst = (params if len(params) else grads).iloc[0]
    what = "parameter" if len(params) else "the gradient at optimizer.step() of parameter"
    others = len(set((params if len(params) else grads)["parameter"])) - 1
    more = f" (and {others} more parameter(s))" if others > 0 else ""
    ranks_off = sorted(int(x) for x in set(bad["rank"]))
    on = ", ".join(str(x) for x in ranks_off)
    if len(grads):
        grad_ranks = ", ".join(str(x) for x in sorted({int(x) for x in grads["rank"]}))
        why = (f"the gradients reaching optimizer.step() already differ on rank(s) {grad_ranks} "
               f"({len(set(grads['parameter']))} parameter(s)), after DDP's all-reduce made them equal: the step "
               "changes gradients on some processes only (clipping, scaling, a norm from one process's values)")
    else:
        why = ("the gradients at optimizer.step() agree on every rank, so the parameters change outside the common "
               "update on some processes only (an in-place edit after optimizer.step(), an update from a rank-local "
               "value)")
    metrics = {**r.metrics, "cause": "replicas out of sync", "ranks_out_of_sync": on,
               "parameters_out_of_sync": len(set(bad["parameter"]))}
    tables = {"replicas": bad.reset_index(drop=True), **r.tables}
    return CheckResult(
        "loop.ddp", Status.FAIL,
        f"replicas out of sync after step {steps}: {what} {worst['parameter']} differs by "
        f"{worst['rel_difference']:.1%} on rank {int(worst['rank'])} from rank 0{more}; out of sync on rank(s) {on}: "
        f"{why}",
        metrics, tables,
        ["Apply every operation that changes gradients or parameters (clipping, scaling, an in-place edit, an extra "
         "update) on every process alike: a condition on dist.get_rank(), or a value only one process computed, makes "
         "the replicas drift apart while rank 0 looks right.",
         "Compute clipping norms from the all-reduced gradients after backward (torch.nn.utils.clip_grad_norm_ on "
         "ctx.model.parameters() on every rank), and broadcast any rank-local value before using it in the update.",
         _ADVICE_STD])


def bypassed_result(metrics: dict, tables: dict, err: float, world_size: int) -> CheckResult:
    """FAIL: the step's backward passes reached optimizer.step() without one all-reduce under DDP. Each process
    stepped with its own gradients; no normalisation cause is tested against an average DDP never computed."""
    metrics = {**metrics, "cause": "ddp_bypassed"}
    return CheckResult(
        "loop.ddp", Status.FAIL,
        f"under DDP with {world_size} processes the gradients differ by {err:.1%} and DDP all-reduced nothing (0 "
        "bucket all-reduces for a synchronised backward): the loss went through the bare module (the model kept "
        "from before wrapping, or ctx.model.module), or DDP's hooks were lost (parameters cast, moved or replaced "
        "after wrapping)",
        metrics, tables,
        ["Compute the loss with the DistributedDataParallel wrapper itself (ctx.model(...) / loss_fn(ctx.model, "
         "batch)), not with the module it wraps, so that backward() triggers DDP's all-reduce.",
         "Move and cast the model (.to(device), .half(), re-created parameters) before wrapping it in "
         "DistributedDataParallel, never after.", _ADVICE_STD])
