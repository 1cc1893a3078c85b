"""Hugging Face accelerate: tell a user's ``Accelerator`` what each of tropt's runs is.

A loop written with ``with accelerator.accumulate(model):`` decides when to synchronise and step from accelerate's
process-global state, not from the micro-batches it is given, and decides whether it is distributed from the
environment a launcher (``accelerate launch``, ``torchrun``) sets up. tropt runs one step in several configurations
inside one process (K = 1 and K = 4) and, for ``loop.ddp``, in forked gloo processes that no launcher started; these
helpers tell accelerate about each run, so the user's loop runs unchanged.

Nothing here imports accelerate: each helper is a no-op unless the user's code already did. The adapter lives in the
core because ``Setup.run_step`` and ``loop.ddp`` need it; :mod:`tropt.integrations.accelerate` is its public name.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["accelerate_num_steps", "accelerate_told", "tell_distributed"]


def _gradient_state_class() -> Any:
    state = sys.modules.get("accelerate.state")
    return getattr(state, "GradientState", None)


@contextlib.contextmanager
def accelerate_num_steps(n: int) -> Iterator[None]:
    """For the duration of the block, accelerate's ``GradientState.num_steps`` (the accumulation steps every
    ``Accelerator`` in the process reads) is ``n``. A no-op when accelerate is not imported or its layout changed."""
    cls = _gradient_state_class()
    saved = cls.__dict__.get("num_steps") if cls is not None else None
    if not isinstance(saved, property):
        yield
        return
    cls.num_steps = property(lambda self: n)
    try:
        yield
    finally:
        cls.num_steps = saved


@contextlib.contextmanager
def accelerate_told(ctx: Any, micro_batches: list) -> Iterator[None]:
    """Tell accelerate, for one call of the step, that it accumulates over this call's micro-batches.

    ``Accelerator.accumulate()`` decides when to synchronise and step from process-global state (the shared
    ``GradientState.num_steps``, fixed by ``Accelerator(gradient_accumulation_steps=...)``) and a per-``Accelerator``
    counter, not from the micro-batches it is given. tropt runs the same step with K = 1 and K = 4 in one process,
    so for the duration of each call ``GradientState.num_steps`` reads this call's number of micro-batches, and the
    counter of every ``Accelerator`` the step keeps on ``ctx`` restarts: each call is one accumulation cycle ending
    in one optimizer step, whatever the script configured. A no-op unless accelerate is already imported (tropt
    never imports it).
    """
    if _gradient_state_class() is None:
        yield
        return
    kind = getattr(sys.modules.get("accelerate"), "Accelerator", None)
    for value in vars(ctx).values():
        if kind is not None and isinstance(value, kind):
            value.step = 0
    with accelerate_num_steps(max(1, len(micro_batches))):
        yield


def tell_distributed(rank: int, world_size: int) -> None:
    """In a process tropt started for ``loop.ddp`` (gloo already initialised), say what a launcher would have said.

    ``accelerate launch --cpu`` / ``torchrun`` set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and
    ``ACCELERATE_USE_CPU``; from those an ``Accelerator`` built in this process decides it is ``MULTI_CPU`` with
    ``world_size`` processes (it reuses the initialised process group), so ``accelerator.accumulate(model)`` wraps the
    non-synchronising micro-batches in ``model.no_sync()`` and ``num_processes`` is right (HF ``Trainer`` token
    counts, ``gather``). An ``Accelerator`` that already existed before the fork shares accelerate's process-global
    state, which is updated in place to the same facts. Only ever called in a forked child that exits after one step:
    the environment and state it changes die with it.
    """
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), "ACCELERATE_USE_CPU": "true"})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # else accelerate picks a thread count and warns
    state = sys.modules.get("accelerate.state")
    kinds = getattr(sys.modules.get("accelerate.utils"), "DistributedType", None)
    if state is None or kinds is None:
        return
    facts = {"distributed_type": kinds.MULTI_CPU, "backend": "gloo", "num_processes": world_size,
             "process_index": rank, "local_process_index": rank}
    for name in ("PartialState", "AcceleratorState"):
        shared = getattr(getattr(state, name, None), "_shared_state", None)
        if shared:  # built before the fork: the state every Accelerator of this process reads
            shared.update(facts)
