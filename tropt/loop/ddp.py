"""``loop.ddp``: does the user's step give the same update under DistributedDataParallel?

Run A is one process on the full batch. Run B forks ``world_size`` processes (gloo, CPU) that each wrap a seeded copy
in ``DistributedDataParallel`` and run the same step on their share of the batch. DDP averages gradients across
processes, so with mean-reduced losses and equal shares both runs must reach ``optimizer.step()`` with the same
gradients. The gradients at ``optimizer.step()`` are judged; those at the entry of the step's clip call explain
what clipping hides. A communication hook counts the gradient all-reduces: with K micro-batches a loop should
synchronise once per optimizer step (``model.no_sync()`` around the first K-1 backward passes), not K times.

BatchNorm normalises each process's share with that share's statistics, so its gradients differ under DDP by
design (as with accumulation): when a model has such layers and the gradients differ, both runs are repeated with
the batch statistics frozen. WARN when that isolated rerun matches, FAIL when it does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import faulthandler
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import re
import tempfile
import time
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.accelerate import tell_distributed
from ..core.capture import run_steps
from ..core.compare import compare_tensors
from ..core.modes import batch_dependent_layers, quiet_randomness
from ..core.noise_floor import floor_between, reseed
from ..errors import StepError, TroptError
from ..registry import register
from ..result import CheckResult, Status
from ..setup import Setup
from ..snapshot import preserved
from ._batch_dependence import Freeze, forward_updated_buffers, freeze_batch_dependence, loss_coupling, loss_kind
from ._clip_seen import ClipSeen
from ._ddp_causes import per_process_mean, single_run
from ._ddp_expectation import ddp_in_expectation
from ._ddp_verdict import BUFFER_MARK, DdpEvidence, ddp_verdict, rank0_grads, replica_table
from ._stochastic import QuietFunctionalDropout
from ._verdicts import defer_multi_step, require_steps, tolerance_for

_TIMEOUT_S = 60


def _rank_main(rank: int, world: int, setup: Setup, shares: list[list], store: str, out: Any, freeze: Freeze,
               find_unused: bool = False, streams: list[list[int]] | None = None) -> None:
    """One DDP process: wrap a seeded copy, run one step on this rank's micro-batches, send back its gradients at
    ``optimizer.step()``, its pre-clip gradients averaged over the processes, and its parameters after the step (the
    parent compares every rank's with rank 0's: replicas that drift apart are a finding of their own).

    It runs in a forked child, so it is careful: everything it imports was imported by the parent before the fork
    (an import could wait forever on a lock another parent thread held); it uses one thread (OpenMP's pool does
    not survive a fork); it writes nothing through the parent's streams (a Jupyter or test-capture stream holds
    locks and threads that did not survive either); it sends its result synchronously through a pipe; and it
    leaves with ``os._exit`` right after, so no teardown (gloo, DDP reducer, atexit) can lose or delay the result.
    """
    import sys
    import warnings

    import torch.distributed as dist

    code = 0
    streams = streams or [[0]] * world  # one run per rank; more (a stochastic step): each on its own RNG stream
    try:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # both ranks are on this host: talk over loopback
        # Both files stay open until os._exit: nothing in this process may close them earlier.
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115
        warnings.simplefilter("ignore")
        stack = open(f"{store}.rank{rank}.stack", "w")  # noqa: SIM115
        faulthandler.dump_traceback_later(_TIMEOUT_S - 5, file=stack)  # where a hang sits
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=_TIMEOUT_S - 10))
        tell_distributed(rank, world)  # an accelerate Accelerator in the step learns it is one of `world` processes

        def one(stream: int) -> tuple:
            return _one_ddp_run(rank, world, setup, shares, freeze, find_unused, stream)

        first, counts, calls = one(streams[rank][0])
        repeats = [(first[0], first[1], first[3])] + [_view_triple(one(s)[0]) for s in streams[rank][1:]]
        payload = (*first, repeats) if len(streams[rank]) > 1 else first
        out.send((rank, "ok", payload, counts, calls))
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent, which turns it into an ERROR
        code = 1
        with contextlib.suppress(BaseException):  # the parent sees the closed pipe instead
            message = exc.message if isinstance(exc, TroptError) else f"{type(exc).__name__}: {exc}"
            out.send((rank, "error", message, None, None))
    finally:
        os._exit(code)


def _view_triple(run: tuple) -> tuple:
    """(at optimizer.step, before clipping averaged over the processes, at the clip's entry) of one rank's run."""
    return run[0], run[1], run[3]


def _one_ddp_run(rank: int, world: int, setup: Setup, shares: list[list], freeze: Freeze, find_unused: bool,
                 stream: int) -> tuple:
    """One fresh seeded copy wrapped in DDP, its step run on this rank's share drawing from ``stream``: (gradients
    at optimizer.step, pre-clip gradients averaged over the processes, parameters after the step), the all-reduce
    counts and the optimizer steps. Runs in the forked child (see :func:`_rank_main`)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    ctx = setup.build()
    reseed(setup.seed, stream)
    quiet_randomness(ctx.model)
    freeze_batch_dependence(ctx.model, freeze)
    ddp = DistributedDataParallel(ctx.model, find_unused_parameters=find_unused)
    syncs = [0, 0, 0]  # bucket all-reduces, synchronised backward passes, those starting from zeroed gradients
    opened = {"open": False, "fresh": False}  # the current backward pass: seen, and whether .grad was clear

    def first_gradient(p: torch.nn.Parameter):
        def hook(grad):  # runs before this pass's gradient is added to p.grad
            if not opened["open"]:
                opened.update(open=True, fresh=p.grad is None or not bool(torch.any(p.grad)))
        return hook

    for p in ctx.model.parameters():
        if p.requires_grad:
            p.register_hook(first_gradient(p))

    def counting_allreduce(state, bucket):  # unannotated: DDP rejects annotations other than dist.GradBucket
        syncs[0] += 1
        if bucket.is_last():
            # A synchronised pass that adds to gradients not yet used (accumulation without no_sync) wastes
            # its all-reduce; one that starts from cleared gradients (a closure's evaluation, SAM's second
            # pass) needs it.
            syncs[1] += 1
            syncs[2] += int(opened["fresh"])
            opened["open"] = False
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting_allreduce)
    ctx.model = ddp
    with QuietFunctionalDropout(), ClipSeen(ddp.module) as seen:
        records, calls = run_steps(setup, ctx, [shares[rank]])
    grads = {name.removeprefix("module."): (None if g is None else g.numpy()) for name, g in
             (records[0].grads.items() if records else [])}
    pre = _averaged_pre_clip(ddp, records[0].pre_clip if records else {}, world)
    evaluations = records[0].closure_evaluations if records else 0  # LBFGS: each is a synchronised backward
    params = {name: p.detach().cpu().numpy().copy()  # after the step
              for name, p in ddp.module.named_parameters()}
    return (grads, pre, params, seen.grads), [*syncs, evaluations], calls


def _averaged_pre_clip(ddp: Any, pre: dict, world: int) -> dict:
    """This process's pre-clip gradients averaged over the processes, as DDP's all-reduce averages ``.grad``: the
    gradient the optimizer would get before the step's clipping. Clipping to the same norm would otherwise hide a
    scale error (a 2× gradient clipped to norm 1 steps like the right one clipped to norm 1). Every rank takes part
    (one all-reduce of the flattened gradients, zeros where this rank has none, and one of which ranks had any)."""
    import torch.distributed as dist

    if not pre:
        return {}
    names = [n for n, p in ddp.named_parameters() if p.requires_grad]
    shapes = {n: p.shape for n, p in ddp.named_parameters()}
    flat = torch.cat([(pre[n] if pre.get(n) is not None else torch.zeros(shapes[n])).reshape(-1).double()
                      for n in names])
    had = torch.tensor([float(pre.get(n) is not None) for n in names], dtype=torch.float64)
    dist.all_reduce(flat)
    dist.all_reduce(had)
    out, i = {}, 0
    for j, n in enumerate(names):
        size = int(np.prod(shapes[n])) if len(shapes[n]) else 1
        mean = (flat[i:i + size] / world).reshape(shapes[n]).float().numpy() if had[j] > 0 else None
        out[n.removeprefix("module.")] = mean
        i += size
    return out


def _stuck_at(path: str) -> str:
    """The innermost Python frame of a faulthandler dump, for a hang's error message."""
    try:
        with open(path) as fh:
            frames = [line.strip() for line in fh if line.strip().startswith("File ")]
    except OSError:
        return ""
    return frames[0] if frames else ""


def _kill(procs: list) -> None:
    """SIGKILL the workers still alive and reap them (a rank blocked in a gloo collective only notices a peer's
    exit at the collective's timeout, and a Python-level interrupt cannot reach it inside native code)."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join()


def _run_ddp(setup: Setup, shares: list[list], world: int, freeze: Freeze = False,
             find_unused: bool = False, streams: list[list[int]] | None = None) -> list[tuple]:
    import torch.distributed.algorithms.ddp_comm_hooks.default_hooks  # imported before the fork: see _rank_main
    import torch.nn.parallel  # noqa: F401

    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="tropt-ddp-") as tmp:
        store = os.path.join(tmp, "store")
        procs, readers = [], {}
        for r in range(world):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_rank_main, daemon=True,
                            args=(r, world, setup, shares, store, send, freeze, find_unused, streams))
            p.start()
            send.close()  # the child holds the only writer: its exit closes the pipe
            procs.append(p)
            readers[recv] = r
        results: dict[int, tuple] = {}
        deadline = time.monotonic() + _TIMEOUT_S
        try:
            while len(results) < world:
                pending = [c for c, r in readers.items() if r not in results]
                ready: list[Any] = mp_connection.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    where = "; ".join(f"rank {r} in {_stuck_at(f'{store}.rank{r}.stack') or 'native code'}"
                                      for r in range(world) if r not in results)
                    raise StepError(f"the DDP processes did not finish within {_TIMEOUT_S} s ({where})",
                                    "make every process run the same number of backward passes and optimizer steps")
                for conn in ready:
                    r = readers[conn]
                    try:
                        results[r] = conn.recv()
                    except EOFError:
                        procs[r].join(timeout=5)
                        results[r] = (r, "error", f"the process exited with code {procs[r].exitcode} before reporting",
                                      None, None)
        except BaseException:  # Ctrl-C, a timeout, ...: stop the workers now instead of waiting for them
            _kill(procs)
            raise
        finally:
            for p in procs:
                p.join(timeout=5)
            _kill(procs)
            for conn in readers:
                conn.close()
    return [results[r] for r in range(world)]


# The step failed because ctx.model is tropt's wrapper: it reached an attribute (or item) of the module the wrapper
# does not expose. The single-process run of the same step succeeded before.
_HIDDEN = re.compile(r"'DistributedDataParallel' object (?:has no attribute '(\w+)'|is not \w+)")


class WrapperHides(Exception):
    """The step breaks only under tropt's own DDP wrapper, on a Setup not declared for DDP: a SKIP's reason."""


class ShareUnfit(Exception):
    """A process's share of the batch is no valid batch for ``loss_fn`` (not a DDP problem): loop.ddp SKIPs."""


def _share_fails_alone(setup: Setup, micro: list) -> str | None:
    """Why ``loss_fn`` fails on one process's micro-batches without any DDP wrapper, or None when it runs."""
    ctx = setup.build()
    try:
        with torch.no_grad():
            for mb in micro:
                setup.loss(ctx.model, mb)
    except Exception as exc:  # noqa: BLE001 - the user's loss on the share: the reason is the finding
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        return f"{type(cause).__name__}: {cause}"
    return None


def _both_runs(setup: Setup, full: Any, shares: list[list], world: int, *, freeze: Freeze,
               find_unused: bool = False, streams: list[list[int]] | None = None
               ) -> tuple[tuple[dict, dict, dict], list[tuple], str]:
    """The single-process gradients on the full batch, every DDP rank's result on its share, and where the
    single-process update was observed."""
    pair, where = single_run(setup, full, freeze=freeze)
    ranks = _run_ddp(setup, shares, world, freeze=freeze, find_unused=find_unused, streams=streams)
    errors = [r for r in ranks if r[1] != "ok"]
    hidden = next((m for r in errors if (m := _HIDDEN.search(str(r[2])))), None)
    if hidden is not None and not setup.distributed:
        what = f" ({hidden.group(1)})" if hidden.group(1) else ""
        raise WrapperHides(
            f"the step reaches attributes of ctx.model{what} that a DistributedDataParallel wrapper hides "
            f"(rank {errors[0][0]}: {errors[0][2]}): tropt cannot emulate DDP for it; a GAN wraps each network in "
            "its own DDP — run with distributed=True and your own wrapping, or reach ctx.model.module")
    if errors:
        rank = errors[0][0]
        alone = _share_fails_alone(setup, shares[rank])
        if alone is not None:
            # The share itself is the problem, not the wrapper: the same micro-batches fail on one process too.
            raise ShareUnfit(
                f"tropt cannot emulate DDP for this batch: rank {rank}'s share ({setup.size(shares[rank][0])} samples "
                f"per micro-batch, the batch cut into {world} along its batch dimension) fails without DDP too "
                f"({alone}), so the failure is the share's, not the wrapper's")
        raise StepError(f"under DDP, rank {rank} failed: {errors[0][2]}",
                        "the step runs with ctx.model wrapped in DistributedDataParallel: reach the module as "
                        "ctx.model.module")
    for rank, _, _, _, rank_calls in ranks:
        require_steps(setup, rank_calls, f"DDP rank {rank}")
    return pair, ranks, where


def _compare(pair: tuple[dict, dict, dict], ranks: list[tuple], world: int, tol: float,
             clip: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """(the decisive comparison, the one at optimizer.step, which view decides: 0 at optimizer.step, 3 at the clip's
    entry, 1 before clipping as the losses asked for).

    The verdict judges the gradients that reach ``optimizer.step()`` (DDP's own all-reduce is seen there: a bucket
    it never reduces shows only there). A view before clipping only explains what a clip hides (a 2× gradient
    clipped to norm 1 steps like the right one): the gradients at the entry of the step's clip call when both runs
    made one (after any rescaling the step does between backward and the clip, as fairseq's multiply_grads), else,
    when a clip by hand left both runs at the declared norm, the losses' own gradients (summed over the backward
    passes, averaged over processes)."""
    labels = ("1_process", f"ddp_{world}")
    post = compare_tensors(pair[0], rank0_grads(ranks), labels=labels)
    if pair[2] and ranks[0][2][3]:
        seen = compare_tensors(pair[2], rank0_grads(ranks, 3), labels=labels)
        return (seen, post, 3) if float(seen["rel_error"].max()) > tol else (post, post, 0)
    if pair[1] and ranks[0][2][1] and _at_bound(pair[0], clip) and _at_bound(rank0_grads(ranks), clip):
        pre = compare_tensors(pair[1], rank0_grads(ranks, 1), labels=labels)
        if float(pre["rel_error"].max()) > tol:
            return pre, post, 1
    return post, post, 0


def _at_bound(grads: dict, clip: float | None) -> bool:
    """Whether the gradients' global norm sits at the declared clip (a clip engaged: it may hide a scale)."""
    if clip is None:
        return False
    norm = float(torch.sqrt(sum((v.double() ** 2).sum() for v in grads.values() if v is not None)))
    return abs(norm - clip) <= 1e-3 * clip


@register(
    "loop.ddp",
    title="DistributedDataParallel equivalence",
    description="1 process on the full batch vs 2 gloo DDP processes on half each: same gradients, one all-reduce "
                "per step",
    plot="tropt.plots.loop",
)
def check_ddp(setup: Setup, *, world_size: int = 2, tol: float | None = None, progress: bool = True) -> CheckResult:
    """FAIL when the step's gradients change under DDP; WARN when it all-reduces more than once per optimizer step.

    SKIP where forking gloo processes is not possible (no torch.distributed, no ``fork``, or a non-CPU Setup).
    A step that updates more than once per call gets a WARN pointing to loop.accumulation, which owns that finding.
    """
    result = _check_ddp(setup, world_size=world_size, tol=tol)
    return defer_multi_step(result, [int(result.metrics.get("optimizer_steps_per_call", 0))])


def _check_ddp(setup: Setup, *, world_size: int = 2, tol: float | None = None) -> CheckResult:
    unavailable = _unavailable(setup)
    if unavailable is not None:
        return unavailable
    if world_size < 2:
        raise TroptError(f"check_ddp needs world_size >= 2 (got {world_size})", "use world_size=2")
    setup.validate()
    tol = tolerance_for(setup, tol)
    try:
        with preserved(setup.model):
            evidence = _ddp_evidence(setup, world_size, tol)
    except WrapperHides as hidden:
        return CheckResult("loop.ddp", Status.SKIP, str(hidden), {"world_size": world_size}, {},
                           ["Declare Setup(distributed=True) with a step that wraps each network in its own "
                            "DistributedDataParallel, or reach the wrapped module's attributes as ctx.model.module."])
    except ShareUnfit as unfit:
        return CheckResult("loop.ddp", Status.SKIP, str(unfit), {"world_size": world_size}, {},
                           ["Give Setup(split_fn=..., size_fn=...) for a batch whose samples are not rows of every "
                            "tensor (a whole graph with a node mask, an adjacency), or batches large enough that "
                            f"each of {world_size} processes' shares is a valid batch for the loss (a P x K sampler "
                            "needs two identities per share)."])
    if isinstance(evidence, CheckResult):  # a stochastic step, judged in expectation
        return evidence
    result = ddp_verdict(setup, evidence)
    return dataclasses.replace(result, metrics={**result.metrics, "noise_floor": 0.0})


def _unavailable(setup: Setup) -> CheckResult | None:
    """A SKIP where forking gloo processes on CPU is not possible, else None."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return CheckResult("loop.ddp", Status.SKIP,
                           "torch.distributed with the gloo backend is not available in this build")
    if "fork" not in mp.get_all_start_methods():
        return CheckResult("loop.ddp", Status.SKIP, "this platform cannot fork processes, which the DDP check needs")
    if torch.device(setup.device).type != "cpu":
        return CheckResult("loop.ddp", Status.SKIP,
                           f"the DDP check runs gloo processes on CPU; this Setup is on {setup.device}: "
                           "run it with setup.replace(device='cpu')")
    return None


def _ddp_evidence(setup: Setup, world_size: int, tol: float) -> DdpEvidence | CheckResult:
    k = setup.accumulation_steps
    batch = setup.sample_batch()
    n = setup.size(batch)
    per_rank = n // world_size
    if per_rank < k:
        raise TroptError(f"a batch of {n} samples gives {per_rank} per process, fewer than the {k} micro-batches",
                         f"use batches of at least {world_size * k} samples")
    used = per_rank * world_size
    full = setup.split(batch, sizes=[used, n - used])[0] if used < n else batch
    whole = setup.split(full, world_size)
    shares = [setup.split(share, k) for share in whole]
    pair, ranks, where = _both_runs(setup, full, shares, world_size, freeze=False)
    # The noise floor: the single-process run again with only the step's own draws changed.
    advanced: list[str] = []
    again, _ = single_run(setup, full, freeze=False, stream=1, advanced=advanced)
    floor = max(floor_between(pair[0], again[0]), floor_between(pair[1], again[1]) if pair[1] else 0.0,
                floor_between(pair[2], again[2]) if pair[2] and again[2] else 0.0)
    if floor > tol:
        sources = [f"it draws from the global RNG ({', '.join(advanced)})"] if advanced else []
        return ddp_in_expectation(setup, full, shares, world_size, tol, floor, ranks, _run_ddp, single_run, sources)
    single = pair[0]
    table, post, view = _compare(pair, ranks, world_size, tol, setup.grad_clip)
    pre_clip = view != 0
    err = float(table["rel_error"].max())
    # Parameters the single-process step gives no gradient: DDP without find_unused_parameters=True waits for
    # them, so their bucket is never all-reduced (each process keeps its own gradients, or the next step raises).
    trainable = {name for name, p in setup.model.named_parameters() if p.requires_grad}
    unused = [name for name, g in single.items() if g is None and name in trainable]
    utable = None
    if err > tol and unused:
        upair, uranks, _ = _both_runs(setup, full, shares, world_size, freeze=False, find_unused=True)
        utable = _compare(upair, uranks, world_size, tol, setup.grad_clip)[0]
    bn_layers = batch_dependent_layers(setup.model)
    ftable, per_mean, franks = None, None, ranks
    freeze: Freeze = False
    buffers = forward_updated_buffers(setup, full) if err > tol else []
    if err > tol and (bn_layers or buffers) and ranks[0][3][0] > 0:
        # Each process normalises its share with that share's BatchNorm statistics (or updates a buffer from it), by
        # design: rerun both with them frozen to see whether the step itself is right.
        bn_layers = bn_layers + [f"{m}.{b}{BUFFER_MARK}" if m else f"{b}{BUFFER_MARK}" for m, b in buffers]
        freeze = tuple(dict.fromkeys(m for m, _ in buffers)) or True
        fpair, franks, _ = _both_runs(setup, full, shares, world_size, freeze=freeze)
        ftable = _compare(fpair, franks, world_size, tol, setup.grad_clip)[0]
    frozen_run = freeze if ftable is not None else False
    decisive = ftable if ftable is not None else table
    # With no all-reduce at all, tropt's own averaging of the ranks' gradients matches "per-process means" by
    # construction: never test a cause against it (the verdict names the bypassed DDP instead).
    if float(decisive["rel_error"].max()) > tol and ranks[0][3][0] > 0:
        per_mean = per_process_mean(setup, whole, shares, rank0_grads(franks, view),
                                     tol, frozen_run, clipped_grads=not pre_clip, view=view, full=full)
    loss = (loss_kind(setup, full, freeze=frozen_run, close=max(10 * tol, 1e-4))
            if float(decisive["rel_error"].max()) > tol and ranks[0][3][0] > 0 else None)
    # "per-process means" fits a per-item loss normalised per process and, as well, any loss that couples the
    # samples of its batch (each process computes it over its own share): only the former has a whole-batch
    # gradient that is an item-weighted mean of the shares' gradients.
    if loss is None and per_mean is not None and loss_coupling(setup, full, whole, freeze=frozen_run) > max(
            10 * tol, 1e-4):
        loss = "coupled"
    return DdpEvidence(world_size, tol, k, per_rank, single, ranks, where, table, post, pre_clip, err, unused, utable,
                     bn_layers, ftable, per_mean, replica_table(ranks), loss, view)
