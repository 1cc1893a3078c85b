"""Ctrl-C during loop.ddp stops the worker processes at once instead of waiting on them (#16)."""

from __future__ import annotations

import glob
import os
import signal
import threading
import time

import pytest
import torch
from support import ce_loss, make_classification
from torch import nn

import tropt
from tropt.loop import check_ddp
from tropt.training import standard_step


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()
    except FileNotFoundError:
        return False


def test_interrupt_kills_the_workers_before_waiting_for_them(tmp_path):
    parent = os.getpid()
    mark = str(tmp_path / "worker")

    def stuck_step(ctx, micro_batches):  # a worker busy for minutes (a long step, or a hung collective)
        if os.getpid() != parent:
            open(f"{mark}.{os.getpid()}", "w").close()
            time.sleep(300)
        return standard_step(ctx, micro_batches)

    x, y = make_classification(n=32, d=6, classes=3, seed=1)
    torch.manual_seed(0)
    setup = tropt.Setup(nn.Linear(6, 3), ce_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), [(x, y)],
                        step=stuck_step)

    def interrupt_when_both_started():
        while len(glob.glob(mark + ".*")) < 2:
            time.sleep(0.05)
        os.kill(parent, signal.SIGINT)  # what a Jupyter "interrupt kernel" or Ctrl-C does to this process

    import multiprocessing.process as mp_process

    waited_on_live = []  # join(timeout) calls made while that worker was still running
    join = mp_process.BaseProcess.join

    def spy_join(proc, timeout=None):
        if proc.is_alive() and timeout:
            waited_on_live.append(proc.pid)
        return join(proc, timeout)

    threading.Thread(target=interrupt_when_both_started, daemon=True).start()
    mp_process.BaseProcess.join = spy_join
    try:
        with pytest.raises(KeyboardInterrupt):
            check_ddp(setup, progress=False)
    finally:
        mp_process.BaseProcess.join = join
    workers = [int(f.rsplit(".", 1)[1]) for f in glob.glob(mark + ".*")]
    assert len(workers) == 2 and not any(_alive(w) for w in workers)
    # Killed first, then reaped: the interrupt path never waits on a running worker (a timed join on each would
    # keep Ctrl-C waiting for seconds per worker).
    assert waited_on_live == [], waited_on_live
