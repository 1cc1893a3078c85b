"""``perf.memory``: where one optimizer step's memory goes, whether it fits, and which strategy makes it fit.

The Setup's own step runs on a copy. Ground truth is the allocator: ``torch.cuda.max_memory_allocated`` on CUDA,
``torch.profiler(profile_memory=True)``'s allocation events on CPU (every allocation made from the moment the copy
is built, so the copy's parameters, gradients and optimizer state are in it and nothing of the user's is). Markers
dropped into that timeline (step begin, ``optimizer.step``, each gradient accumulated, each tensor saved for and
released by backward) say what was alive at the peak instant, so the breakdown is measured, not assumed:

- parameters (and buffers), gradients, optimizer state (its tensors after a step, bytes per parameter),
- activations saved for backward (``torch.autograd.graph.saved_tensors_hooks``; storages deduplicated, parameter
  and input-batch storages left out),
- the remainder: temporaries of forward, backward and the optimizer, and anything held between steps.

Activations and the forward/backward peak are measured at two batch sizes (the Setup's and half of it) and fitted
linearly, which gives the largest batch that fits ``memory_limit`` and the estimated peak of each strategy
(micro-batching, activation checkpointing, bf16 autocast, 8-bit or factored optimizer state, optimizer-state
sharding and full FSDP over N devices). A 10-step run fits the trend of memory left allocated after each step:
growth means something keeps every step's graph alive. After each of those steps the autograd graph reachable from
what the step keeps (tensors on ``ctx``, on its objects, the model or the step's closure) is walked
(:mod:`tropt.perf.graphs`): backward frees a graph's saved tensors but not its nodes, so a running
``ctx.total_loss = ctx.total_loss + loss`` leaks nodes the allocator hardly sees; a node count that grows step over step
is a WARN naming where the graph is held.

On CUDA the peak counts what the check's copy allocates from the moment it is built (the batches are on the device
before that); memory already in use (your original model, the CUDA context, other processes) is not in it.

Cost: ``growth_steps`` (10) optimizer steps, one at half the batch, and, when the Setup trains in fp32, the same two
batch sizes under bf16 autocast: 13 in all.

This module judges; the allocator meters are in :mod:`tropt.perf.meters`, the measured run in
:mod:`tropt.perf.measurement` and the strategy model in :mod:`tropt.perf.strategies`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from .graphs import graph_table, growing_graph
from .measurement import Measurement, measure
from .meters import GIB, MIB, StepMemory
from .strategies import SHARDS, Plan, plan

if TYPE_CHECKING:
    from ..setup import Setup

CHECK_ID = "perf.memory"
Finding = tuple  # (status, text for the summary, advice or None)


def _limit_bytes(memory_limit: Any, device: torch.device) -> tuple[float | None, str]:
    """The limit in bytes and where it comes from; raises on a non-positive or non-numeric limit."""
    if memory_limit is not None:
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)) \
                or not math.isfinite(memory_limit) or memory_limit <= 0:
            raise TroptError(f"perf.memory: memory_limit={memory_limit!r}; it must be a positive number of GiB",
                             "pass the accelerator's memory in GiB, e.g. memory_limit=80 for an 80 GB device, "
                             "or leave it out to use the CUDA device's capacity")
        return float(memory_limit) * GIB, f"memory_limit={_mib(float(memory_limit) * GIB)}"
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return float(total), f"{torch.cuda.get_device_name(device)} capacity"
    return None, "none"


def _devices(model: nn.Module) -> list[str]:
    return sorted({str(t.device) for t in [*model.parameters(), *model.buffers()]})


def _mib(x: float) -> str:
    """Bytes in the unit that reads best: KiB, MiB or GiB."""
    if abs(x) < MIB:
        return f"{x / 1024:,.1f} KiB"
    return f"{x / MIB:,.1f} MiB" if abs(x) < GIB else f"{x / GIB:,.2f} GiB"


@register(CHECK_ID, title="Memory of one step and the strategy that fits",
          description="Measure one optimizer step's peak (parameters, gradients, optimizer state, activations, "
                      "remainder), its growth over 10 steps, "
                      "and which precision/checkpointing/sharding fits the limit.",
          budgets={'quick': {'growth_steps': 4, 'bf16': False}, 'thorough': {'growth_steps': 20}},
          plot="tropt.plots.perf")
def check_memory(
    setup: Setup,
    *,
    memory_limit: float | None = None,
    headroom: float = 0.1,
    growth_steps: int = 10,
    growth_threshold: float = 1e-4,
    held_threshold: float = 0.5,
    precision_result: Any = None,
    bf16: bool = True,
    progress: bool = True,
) -> CheckResult:
    """Measure the memory of the Setup's own optimizer step on a copy and plan what fits.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup` (never modified).
    memory_limit
        Device memory to plan for, in GiB (2**30 bytes). Default: the CUDA device's capacity. On CPU there is no
        default: without it the breakdown, growth and strategy estimates are reported with no fit verdict (host RAM
        says little about the accelerator the run is meant for); pass e.g. ``memory_limit=80`` to plan for one.
    headroom
        WARN when the peak leaves less than this share of the limit free (fragmentation, longer sequences, eval).
    growth_steps
        Steps whose end-of-step memory is fitted for growth (>= 4; the first, which creates the optimizer state,
        is left out of the fit).
    growth_threshold
        WARN when memory left allocated after each step grows by more than this share of the peak (and 4 KiB) per
        step, rising in at least two thirds of the steps: 1e-4 is 10% of the peak per 1,000 steps.
    held_threshold
        WARN when memory held between steps that is not parameters, gradients, optimizer state or the batch exceeds
        this share of the step's activations (a loss or output kept with its graph).
    precision_result
        A ``perf.precision`` result whose bf16 stability verdict is attached to the bf16 option.
    bf16
        Measure the bf16 option (two more steps under bf16 autocast, for an fp32 Setup); False (budget quick) leaves
        the option out of the estimates, saying so.
    progress
        Show a progress bar.
    """
    from ..snapshot import preserved

    device = cast(torch.device, setup.device)  # Setup.__post_init__ makes it a torch.device
    limit, limit_from = _limit_bytes(memory_limit, device)
    _check_options(growth_steps, headroom, growth_threshold, held_threshold)
    skipped = _model_parallel_skip(setup)
    if skipped is not None:
        return skipped
    setup.validate()
    from .precision import support

    bf16_ok, bf16_why = support("bf16", device)
    with preserved(setup.model):
        meas = measure(setup, growth_steps, setup.precision == "fp32" and bf16_ok and bf16, progress)
    if not bf16 and setup.precision == "fp32" and bf16_ok:
        bf16_why = "not measured (bf16=False, as at budget quick; pass bf16=True or the standard budget)"
    ev = _evidence(meas, growth_steps, getattr(setup, "optimizer", None) is None)
    options = plan(meas, ev.peak, limit, setup.accumulation_steps, _bf16_note(setup, meas, precision_result, bf16_why))
    metrics = _metrics(ev, options, growth_steps, limit, limit_from, device)
    if getattr(setup, "optimizer", None) is None:
        metrics["optimizer"] = "none: optimizer state is 0"
    findings = _findings(ev, options, metrics, growth_steps, limit, limit_from, headroom, held_threshold,
                         growth_threshold)
    return _result(ev, options, metrics, findings, growth_steps)


def _check_options(growth_steps: int, headroom: float, growth_threshold: float, held_threshold: float) -> None:
    """Raise on options out of range, saying which default to use."""
    for name, value, low in (("growth_steps", growth_steps, 4),):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise TroptError(f"perf.memory: {name}={value!r}; it must be an integer >= {low}", f"use e.g. {name}=10")
    for name, share, high in (("headroom", headroom, 1), ("growth_threshold", growth_threshold, 1),
                              ("held_threshold", held_threshold, 10)):
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < high:
            raise TroptError(f"perf.memory: {name}={share!r} is out of range", f"use the default {name}")


def _model_parallel_skip(setup: Setup) -> CheckResult | None:
    """A SKIP when the model's parameters sit on several devices (a layout this check cannot measure)."""
    devices = _devices(setup.model)
    if len(devices) <= 1:
        return None
    return CheckResult(
        CHECK_ID, Status.SKIP,
        f"the model's parameters sit on {len(devices)} devices ({', '.join(devices)}): a model-parallel layout, whose "
        "memory per device this check cannot measure on one device",
        {"devices": ", ".join(devices)}, {},
        [f"Measure each device's part as its own Setup, or pass the model on one device (tropt's copies run on "
         f"Setup.device={setup.device})."])


def _bf16_note(setup: Setup, meas: Measurement, precision_result: Any, bf16_why: str) -> str:
    """What the bf16 option's cost says: perf.precision's verdict when bf16 was measured, else why it was not."""
    if meas.bf16_step is not None:
        return _bf16_verdict(precision_result)
    return f"the Setup already trains in {setup.precision}" if setup.precision != "fp32" else bf16_why


@dataclass
class _Evidence:
    """What the measured steps show, before any verdict: the steady step's peak and parts, and the growth."""

    meas: Measurement
    steady: StepMemory
    peak: float
    in_opt: bool  # the peak falls in optimizer.step()
    breakdown: pd.DataFrame
    ends: np.ndarray
    slope: float
    rising: float
    held: float  # bytes alive when the steady step starts beyond parameters, state and gradients
    graph: tuple[str, float, int] | None  # where an autograd graph grows step over step, nodes per step, nodes


def _evidence(meas: Measurement, growth_steps: int, no_optimizer: bool) -> _Evidence:
    steady = meas.steps[meas.steady]
    peak, in_opt, breakdown = _breakdown(meas, steady, no_optimizer)
    ends, slope, rising = _growth(meas, growth_steps)
    held = steady.start - meas.params - meas.state - steady.grads_start
    graph = growing_graph(meas.graphs, growth_steps)
    return _Evidence(meas, steady, peak, in_opt, breakdown, ends, slope, rising, held, graph)


def _metrics(ev: _Evidence, options: Plan, growth_steps: int, limit: float | None, limit_from: str,
             device: torch.device) -> dict[str, Any]:
    """The check's metrics: the breakdown in MiB, the growth, and the plan's headline numbers."""
    meas, steady, peak, in_opt = ev.meas, ev.steady, ev.peak, ev.in_opt
    half = meas.steps.get(meas.half_step) if meas.half_step is not None else None
    b, max_batch = meas.batch, options.max_batch
    acts, grads_at = steady.opt_parts if in_opt else steady.fb_parts
    return {
        "ground_truth": meas.ground_truth, "device": str(device), "memory_limit_from": limit_from,
        "memory_limit_mib": limit / MIB if limit is not None else math.nan,
        "peak_mib": peak / MIB, "peak_phase": "optimizer.step" if in_opt else "forward/backward",
        "params_mib": meas.params / MIB, "grads_mib": meas.grads / MIB, "grads_at_peak_mib": grads_at / MIB,
        "optimizer_state_mib": meas.state / MIB,
        "optimizer_state_bytes_per_param": meas.state / max(meas.n_params, 1),
        "optimizer_state_vs_params": meas.state / max(meas.params, 1),
        "activations_mib": steady.activations / MIB, "activations_at_peak_mib": acts / MIB,
        "remainder_mib": float(ev.breakdown.loc[4, "mib"]), "held_between_steps_mib": max(ev.held, 0) / MIB,
        "batch_size": b, "half_batch_size": meas.half if meas.half else math.nan,
        "activations_half_batch_mib": half.activations / MIB if half else math.nan,
        "activations_per_sample_mib": (options.model.act[1] if half else steady.activations / b) / MIB,
        "growth_per_step_mib": ev.slope / MIB, "growth_rising_share": ev.rising, "growth_steps": growth_steps,
        "optimizer_steps": len(meas.steps), "checkpointing_keeps": options.checkpoint_share,
        "activations_bf16_mib": (meas.steps[meas.bf16_step].activations / MIB if meas.bf16_step is not None
                                 else math.nan),
        "max_batch": max_batch if max_batch is not None else math.nan,
        "headroom": (1 - peak / limit) if limit else math.nan, "parameters": meas.n_params,
        "graph_held_by": ev.graph[0] if ev.graph else "none",
        "graph_nodes_per_step": ev.graph[1] if ev.graph else 0.0, "graph_nodes": ev.graph[2] if ev.graph else 0,
    }


def _findings(ev: _Evidence, options: Plan, metrics: dict[str, Any], growth_steps: int, limit: float | None,
              limit_from: str, headroom: float, held_threshold: float, growth_threshold: float) -> list[Finding]:
    """The leak findings and the fit verdict; the verdict's metrics go into ``metrics``."""
    findings = _leak_findings(ev.held - min(ev.held, ev.steady.batch), ev.steady.activations, ev.peak, ev.slope,
                              ev.rising, growth_steps, held_threshold, growth_threshold)
    if ev.graph is not None:
        findings.append(_graph_finding(*ev.graph, growth_steps))
    if limit is None:
        findings.append((Status.PASS, "no memory_limit on CPU: no fit verdict (pass memory_limit= in GiB to plan for a "
                                      "device)", None))
    else:
        verdict, recommended, extra = _fit_verdict(ev.peak, limit, limit_from, headroom, options.max_batch,
                                                   options.strategies, options.shards, ev.meas)
        findings.append(verdict)
        metrics.update(extra, fits=bool(ev.peak <= limit), recommended=recommended)
    return findings


def _result(ev: _Evidence, options: Plan, metrics: dict[str, Any], findings: list[Finding],
            growth_steps: int) -> CheckResult:
    parts = ", ".join(f"{r.part} {_mib(r.mib * MIB)}" for r in ev.breakdown.itertuples())
    summary = (f"peak {_mib(ev.peak)} during {metrics['peak_phase']} ({ev.meas.ground_truth}): {parts}; "
               f"optimizer state {metrics['optimizer_state_bytes_per_param']:.2f} B/param")
    status = max((f[0] for f in findings), key=_rank, default=Status.PASS)
    summary += "".join(f"; {text}" for _, text, _ in findings)
    advice = [a for _, _, a in findings if a]
    curve = options.curve
    tables = {"breakdown": ev.breakdown, "strategies": options.strategies, "batch_curve": curve,
              "steps": _steps_table(ev.meas, growth_steps), "graphs": graph_table(ev.meas.graphs)}
    series = {"growth_end_mib": ev.ends / MIB, "curve_batch": curve["batch_size"].to_numpy(dtype=float),
              "curve_peak_mib": curve["peak_mib"].to_numpy()}
    return CheckResult(CHECK_ID, status, summary, metrics, tables, advice, series)


def _breakdown(meas: Measurement, steady: StepMemory, no_optimizer: bool) -> tuple[float, bool, pd.DataFrame]:
    """The steady step's peak, whether it falls in optimizer.step(), and the parts alive at that instant."""
    fb, op = steady.fb_peak, steady.opt_peak if steady.has_opt else -math.inf
    in_opt = op > fb
    peak = max(fb, op)
    acts, grads_at = steady.opt_parts if in_opt else steady.fb_parts
    held = steady.start - meas.params - meas.state - steady.grads_start
    table = pd.DataFrame([
        {"part": "parameters", "mib": meas.params / MIB, "note": "parameters and buffers of the model"},
        {"part": "gradients", "mib": grads_at / MIB, "note": f"alive at the peak (all gradients: {_mib(meas.grads)})"},
        {"part": "optimizer state", "mib": meas.state / MIB,
         "note": "no optimizer (hand-written updates): no state" if no_optimizer else
         f"{meas.state / max(meas.n_params, 1):.2f} bytes per parameter"},
        {"part": "activations", "mib": acts / MIB,
         "note": f"saved for backward, alive at the peak (most at once: {_mib(steady.activations)})"},
        {"part": "remainder", "mib": (peak - meas.params - grads_at - meas.state - acts) / MIB,
         "note": "temporaries of " + ("optimizer.step()" if in_opt else "forward/backward")
                 + f", the allocator; {_mib(max(held, 0))} held from before the step"},
    ])
    table["share"] = table["mib"] / (peak / MIB) if peak > 0 else math.nan
    return peak, in_opt, table


def _growth(meas: Measurement, growth_steps: int) -> tuple[np.ndarray, float, float]:
    """Memory left allocated after each step (the first, which creates the optimizer state, left out), its fitted
    slope in bytes per step, and the share of steps that ended higher than the one before."""
    idx = np.arange(1, growth_steps, dtype=float)
    ends = np.asarray([meas.steps[i].end for i in range(1, growth_steps)], dtype=float)
    slope = float(np.polyfit(idx, ends, 1)[0]) if ends.size >= 2 else 0.0
    rising = float(np.mean(np.diff(ends) > 0)) if ends.size >= 2 else 0.0
    return ends, slope, rising


def _steps_table(meas: Measurement, growth_steps: int) -> pd.DataFrame:
    kinds = {meas.half_step: "half batch", meas.bf16_step: "bf16", meas.bf16_half_step: "bf16, half batch"}
    return pd.DataFrame([{
        "step": i, "batch_size": meas.half if i in (meas.half_step, meas.bf16_half_step) else meas.batch,
        "kind": kinds.get(i, "growth"), "start_mib": r.start / MIB, "fb_peak_mib": r.fb_peak / MIB,
        "opt_peak_mib": r.opt_peak / MIB if r.has_opt else math.nan, "end_mib": r.end / MIB,
        "activations_mib": r.activations / MIB if (i == meas.steady or i >= growth_steps) else math.nan,
    } for i, r in sorted(meas.steps.items())])


def _leak_findings(held: float, activations: float, peak: float, slope: float, rising: float, growth_steps: int,
                   held_threshold: float, growth_threshold: float) -> list[Finding]:
    """WARNs for memory held between steps beyond the accounted parts, and for memory that grows step by step."""
    out: list[Finding] = []
    if held > max(held_threshold * activations, 0.05 * peak, 64 * 1024):
        out.append((Status.WARN, f"{_mib(held)} stay allocated between steps beyond parameters, gradients and "
                                 "optimizer state",
                    f"{_mib(held)} is held from one step into the next that is not parameters, gradients or optimizer "
                    "state: the step (or something it stores) keeps a tensor with its graph alive, e.g. `total += "
                    "loss` or `losses.append(loss)`; keep loss.item() or loss.detach() instead."))
    # allocation counts are exact bytes, so a small slope is real when most steps end higher than the one before
    if slope > max(growth_threshold * peak, 4096) and rising >= 2 / 3:
        out.append((Status.WARN, f"memory grows by {_mib(slope)} per step over {growth_steps} steps",
                    f"Memory grows by {_mib(slope)} per step (fitted over steps 2–{growth_steps}); after 1,000 steps "
                    f"that is {_mib(1000 * slope)} more. Something keeps every step's autograd graph alive (a list of "
                    "losses, a running `total += loss`): store loss.item() / loss.detach()."))
    return out


def _graph_finding(where: str, per_step: float, nodes: int, growth_steps: int) -> Finding:
    """A WARN naming where an autograd graph that grows step over step is held (the graphs table is the evidence)."""
    text = (f"{where} holds an autograd graph of {nodes:,} nodes that grows by ~{per_step:,.0f} per step "
            f"over {growth_steps} steps")
    return (Status.WARN, text,
            f"{text}: every step's graph stays alive, linked to the next (a running `total += loss`, a list of "
            f"losses). Backward freed its saved tensors, so the allocator barely sees it, but the nodes pile up in "
            f"host memory for the whole run (see the graphs table). Keep loss.item() or loss.detach() in {where}.")


def _fit_verdict(peak: float, limit: float, limit_from: str, headroom: float, max_batch: int | None,
                 strategies: pd.DataFrame, shards: dict[str, int | None],
                 meas: Measurement) -> tuple[Finding, str, dict[str, Any]]:
    """PASS with headroom; WARN under it or when only another single-device option fits; FAIL when none does (the
    advice names the sharding over the smallest N that fits). Returns the finding, the recommendation, metrics."""
    fitting = strategies[strategies["fits"].astype(bool)]
    singles = fitting[(fitting["devices"] == 1) & (fitting["option"] != "as is")]
    roomy = singles[singles["headroom"] >= headroom]
    choice = roomy if not roomy.empty else singles
    extra = {f"smallest_n_{o.replace(' ', '_').replace('-', '_')}": (n if n is not None else math.nan)
             for o, n in shards.items()}
    room = 1 - peak / limit
    if room >= headroom:
        return ((Status.PASS, f"fits {limit_from} with {room:.0%} headroom (up to batch {max_batch})", None), "as is",
                extra)
    if peak <= limit:
        advice = (f"The step peaks at {_mib(peak)} of {_mib(limit)} ({room:.0%} headroom, under {headroom:.0%}): "
                  + (_option_advice(choice.iloc[0]) if not choice.empty
                     else "leave room for longer inputs and evaluation."))
        return (Status.WARN, f"only {room:.0%} headroom under {limit_from}", advice), \
            (_option_name(choice.iloc[0]) if not choice.empty else "as is"), extra
    if not choice.empty:
        return (Status.WARN, f"does not fit {limit_from} as is, {choice.iloc[0]['option']} does",
                f"The step needs {_mib(peak)} of {_mib(limit)}: " + _option_advice(choice.iloc[0])), \
            _option_name(choice.iloc[0]), extra
    found = {o: n for o, n in shards.items() if n is not None}
    text = f"does not fit {limit_from} and no single-device option does"
    if not found:
        advice = (f"Nothing fits {_mib(limit)}, not even full FSDP over {max(SHARDS)} devices: use a smaller model, "
                  "or combine FSDP with activation checkpointing and bf16.")
        return (Status.FAIL, text, advice), "none", extra
    best = min(found, key=lambda o: (found[o], o != "optimizer-state sharding"))  # fewest devices, then less invasive
    n = found[best]
    row = strategies[(strategies["option"] == best) & (strategies["devices"] == n)]
    others = "; ".join(f"{o} needs N={v}" for o, v in found.items() if o != best)
    advice = (f"Nothing on one device fits {_mib(limit)} (the step needs {_mib(peak)}; optimizer state alone "
              f"{_mib(meas.state)}): shard with {best} over N={n} devices (the smallest N that fits), estimated "
              f"{float(row['peak_mib'].iloc[0]):,.1f} MiB per device" + (f"; {others}." if others else "."))
    return (Status.FAIL, text, advice), f"{best} over N={n}", extra


def _option_name(row: Any) -> str:
    return str(row["option"]) + (f" over N={int(row['devices'])}" if int(row["devices"]) > 1 else "")


def _rank(s: Status) -> int:
    return [Status.PASS, Status.SKIP, Status.WARN, Status.FAIL, Status.ERROR].index(s)


def _option_advice(row: Any) -> str:
    where = f" over N={int(row['devices'])} devices" if int(row["devices"]) > 1 else ""
    return (f"use {row['option']}{where} (estimated peak {row['peak_mib']:,.1f} MiB, "
            f"{row['headroom']:.0%} headroom; cost: {row['cost']}).")


def _bf16_verdict(precision_result: Any) -> str:
    """perf.precision's stability verdict for bf16, from a result the caller passes."""
    if precision_result is None:
        return "stability not checked here: run perf.precision (or pass precision_result=)"
    table = getattr(precision_result, "tables", {}).get("precisions")
    if table is None or "bf16" not in set(table["precision"]):
        return "perf.precision did not measure bf16"
    row = table.set_index("precision").loc["bf16"]
    if row["status"] != "measured":
        return f"perf.precision: bf16 {row['status']} ({row['reason']})"
    deviation = float(row["loss_deviation"])
    return (f"perf.precision: bf16 stable (loss within {deviation:.1%} of fp32)" if bool(row["stable"])
            else f"perf.precision: bf16 UNSTABLE (loss {deviation:.1%} from fp32)")
