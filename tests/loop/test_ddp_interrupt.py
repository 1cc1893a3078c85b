"""Ctrl-C during loop.ddp stops the worker processes at once instead of waiting on them (#16)."""

from __future__ import annotations

import glob
import os
import signal
import threading
import time

import pytest
import torch
from torch import nn

import tropt
from tropt.loop import check_ddp
from tropt.training import standard_step

from support import ce_loss, make_classification


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
    setup = tropt.Setup(nn.Linear(6, 3), ce_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), [(x, y)], step=stuck_step)
    sent = []

    def interrupt_when_both_started():
        while len(glob.glob(mark + ".*")) < 2:
            time.sleep(0.05)
        sent.append(time.monotonic())
        os.kill(parent, signal.SIGINT)  # what a Jupyter "interrupt kernel" or Ctrl-C does to this process

    threading.Thread(target=interrupt_when_both_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        check_ddp(setup, progress=False)
    stopped_after = time.monotonic() - sent[0]
    workers = [int(f.rsplit(".", 1)[1]) for f in glob.glob(mark + ".*")]
    assert len(workers) == 2 and not any(_alive(w) for w in workers)
    # Not a speed benchmark: waiting on the workers first (join with a 5 s timeout each, then kill) takes at least
    # 10 s by construction; killing them first takes well under a second, so 8 s separates the two on any load.
    assert stopped_after < 8, stopped_after
