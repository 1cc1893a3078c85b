"""``loop.ddp`` for a stochastic step: judged in expectation over repeats (the noise floor, issue 27 §1).

The single-process run is repeated on R RNG streams, and one set of DDP processes runs R fresh wrapped copies, each
rank on its own stream. Rank 0's gradients (at ``optimizer.step()`` and before clipping, averaged over the processes)
are compared by their means with the single-process means, against the spread between repeats. A scale that matches
``1/world_size`` or ``world_size`` within its uncertainty is named; anything else outside the spread is "cause not
isolated". Every rank's gradients at ``optimizer.step()`` are still compared with rank 0's exactly (DDP's all-reduce
makes them equal whatever the noise), and 0 all-reduces is a bypassed DDP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from ..core.compare import compare_tensors
from ..core.modes import batch_dependent_layers
from ..core.noise_floor import (
    FIX_ADVICE,
    MORE_REPEATS,
    REPEATS,
    Expectation,
    Repeats,
    floor_note,
    in_expectation,
)
from ..result import CheckResult, Status
from ..setup import Setup
from ._ddp_verdict import bypassed_result, replica_table, sum_loss_result

_S, _D = 1000, 2000  # stream blocks of the single-process and the DDP repeats


def _mean(runs: list[dict]) -> dict:
    import torch

    return {n: None if any(r.get(n) is None for r in runs) else
            torch.stack([torch.as_tensor(r[n]).float() for r in runs]).mean(0) for n in runs[0]}


def _repeats(setup: Setup, full: Any, shares: list[list], world: int, run_ddp: Callable,
             single_run: Callable) -> tuple[int, int, list, list, Expectation]:
    """R single-process repeats and R DDP repeats (each rank on its own stream), compared in expectation; 24 when
    the first 8 leave it near the limit. Returns (R, which view: 1 before clipping / 0 at optimizer.step, the
    single-process runs, rank 0's repeats, the comparison)."""
    from ..errors import StepError

    r = REPEATS
    while True:
        singles = [single_run(setup, full, freeze=False, stream=_S + s)[0] for s in range(r)]
        ranks = run_ddp(setup, shares, world, streams=[[_D + s * world + rk for s in range(r)] for rk in range(world)])
        if any(x[1] != "ok" for x in ranks):
            bad_rank = next(x for x in ranks if x[1] != "ok")
            raise StepError(f"under DDP, rank {bad_rank[0]} failed: {bad_rank[2]}",
                            "the step runs with ctx.model wrapped in DistributedDataParallel: reach the module as "
                            "ctx.model.module")
        reps = ranks[0][2][4]  # each (at optimizer.step, before clipping, at the clip's entry)
        # What reaches optimizer.step() is judged; the gradients at the entry of the step's clip call when every
        # run made one (what the clip may hide, after any rescaling the step does between backward and the clip).
        which = 2 if all(rep[2] for rep in reps) and all(sp[2] for sp in singles) else 0
        e = in_expectation(Repeats.of([sp[which] for sp in singles]), Repeats.of([rep[which] for rep in reps]))
        if not e.ambiguous or r >= MORE_REPEATS:
            return r, which, singles, reps, e
        r = MORE_REPEATS


def ddp_in_expectation(setup: Setup, full: Any, shares: list[list], world: int, tol: float, floor: float,
                       first: list[tuple], run_ddp: Callable, single_run: Callable,
                       sources: list[str]) -> CheckResult:
    """The verdict of loop.ddp for a step whose noise floor is not zero."""
    from ._stochastic import nondeterministic_kernels

    allreduces, syncs = first[0][3][0], first[0][3][1]
    metrics: dict[str, Any] = {"world_size": world, "samples_per_process": setup.size(full) // world,
                               "micro_batches": setup.accumulation_steps, "tolerance": tol, "noise_floor": floor,
                               "judged": "in expectation", "allreduce_buckets": allreduces,
                               "synchronised_backward_passes": syncs,
                               "optimizer_steps_per_call": max(int(max(c)) if c else 0 for *_, c in first)}
    replicas = replica_table(first)
    if allreduces == 0:  # DDP reduced nothing: no replica or normalisation cause is tested against it
        diff = float(replicas["rel_difference"].max()) if len(replicas) else 0.0
        if diff > tol:
            return bypassed_result(metrics, {"replicas": replicas}, diff, world)
    if len(replicas) and float(replicas["rel_difference"].max()) > tol:
        bad = replicas[replicas["rel_difference"] > tol].sort_values("rel_difference", ascending=False)
        w = bad.iloc[0]
        return CheckResult("loop.ddp", Status.FAIL,
                           f"replicas out of sync after step 1: {w['compared']} of {w['parameter']} differs by "
                           f"{w['rel_difference']:.1%} on rank {int(w['rank'])} from rank 0 (DDP's all-reduce makes "
                           "them equal whatever the step's randomness)",
                           {**metrics, "cause": "replicas out of sync"}, {"replicas": bad.reset_index(drop=True)},
                           ["Apply every operation that changes gradients or parameters on every process alike."])
    r, which, singles, reps, e = _repeats(setup, full, shares, world, run_ddp, single_run)
    sources = nondeterministic_kernels(sources)
    metrics.update(repeats=r, expectation_rel_diff=e.rel_diff, expectation_z=e.z, expectation_scale=e.scale,
                   expectation_scale_z=e.scale_z, max_rel_error=e.rel_diff,
                   compared="gradients at the entry of the step's clip call" if which else
                   "gradients at optimizer.step")
    tables = {"parameters": compare_tensors(_mean([sp[which] for sp in singles]), _mean([rep[which] for rep in reps]),
                                            labels=("1_process_mean", f"ddp_{world}_mean")),
              "ranks": pd.DataFrame([{"rank": x[0], "bucket_allreduces": x[3][0],
                                      "synchronised_backward_passes": x[3][1]} for x in first])}
    if e.inside:
        return CheckResult("loop.ddp", Status.PASS,
                           f"{world} DDP processes reach the single-process gradients in expectation: "
                           f"{floor_note(floor, e, sources)}", metrics, tables)
    if allreduces == 0:
        return bypassed_result(metrics, tables, e.rel_diff, world)
    if batch_dependent_layers(setup.model):
        return CheckResult("loop.ddp", Status.WARN,
                           f"under DDP the mean gradient differs by {e.rel_diff:.1%} ({e.z:.1f} standard errors); "
                           "BatchNorm normalises each process's share by its own statistics: cause not isolated",
                           {**metrics, "cause": "not_isolated"}, tables, [FIX_ADVICE])
    from .accumulation_causes import near

    how = f"{e.scale:.3g}× along the single-process mean, {max(e.z, e.scale_z):.1f} standard errors out"
    if near(e.scale, 1 / world, 0.15) and e.scale_z > 3:
        # Before blaming the step for a division by the world size: a sum-reduced loss gives 1/world under DDP's
        # averaging with no division anywhere (the deterministic path tests the same, via loss_kind).
        from ._batch_dependence import loss_kind

        if loss_kind(setup, full, freeze=False, close=max(10 * tol, 1e-4)) == "sum":
            return sum_loss_result(setup, world, e.scale, metrics, tables)
    for factor, cause, advice in (
            (1 / world, "the averaging is applied twice: the loss is divided by the world size",
             "DDP already averages gradients over processes: do not divide the loss by the world size."),
            (world, "they are summed, not averaged", "Do not all-reduce (sum) gradients yourself: DDP averages.")):
        if near(e.scale, factor, 0.15) and e.scale_z > 3:
            return CheckResult("loop.ddp", Status.FAIL,
                               f"under DDP with {world} processes the mean gradient differs by {e.rel_diff:.1%} "
                               f"({how}): {cause}", {**metrics, "cause": cause}, tables, [advice])
    return CheckResult("loop.ddp", Status.WARN,
                       f"under DDP with {world} processes the mean gradient differs by {e.rel_diff:.1%} ({how}; "
                       f"noise floor {floor:.1%}); cause not isolated", {**metrics, "cause": "not_isolated"}, tables,
                       ["Give every process an equal share of each batch and let DDP average the gradients.",
                        FIX_ADVICE])
