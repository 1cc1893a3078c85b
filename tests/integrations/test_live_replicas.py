"""LiveMonitor's replica-sync check on a real 2-process gloo group: healthy replicas are quiet, a parameter changed on
rank 1 only is a ``replicas_out_of_sync`` event that names it."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os

import pytest
import torch
from torch import nn

from tropt.integrations.live import LiveMonitor

WORLD = 2


def _rank(rank: int, store: str, perturb: bool, out) -> None:
    import torch.distributed as dist

    code = 0
    try:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        x, y = torch.randn(16, 4), torch.randn(16, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        live = LiveMonitor("model.gradient_flow", every=1000, sync_every=2, warn=False).attach(model)
        events = []
        for step in range(1, 7):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if perturb and rank == 1 and step == 4:  # after the step, before the sync at 4
                with torch.no_grad():
                    model[2].weight[0, 0] += 1e-3
            events += live.step_end(step)
        live.detach()
        out.send((rank, ([(e.kind, e.step, e.message) for e in events], live.syncs)))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - report to the parent
        code = 1
        out.send((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        os._exit(code)


def _run(tmp_path, perturb: bool) -> dict:
    ctx = mp.get_context("fork")
    store = str(tmp_path / "store")
    pipes = [ctx.Pipe(duplex=False) for _ in range(WORLD)]  # a pipe: sent synchronously before os._exit
    procs = [ctx.Process(target=_rank, args=(r, store, perturb, pipes[r][1])) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = {}
    for recv, _ in pipes:
        assert recv.poll(60), "a rank sent nothing within 60 s"
        rank, res = recv.recv()
        results[rank] = res
    for p in procs:
        p.join(timeout=30)
    for r, res in results.items():
        assert isinstance(res, tuple), f"rank {r} failed: {res}"
        assert res[1] == 3, f"rank {r} compared the replicas {res[1]} times in 6 steps with sync_every=2"
    return {r: res[0] for r, res in results.items()}


def test_healthy_replicas_raise_no_event(tmp_path):
    results = _run(tmp_path, perturb=False)
    assert results == {0: [], 1: []}


def test_a_parameter_changed_on_one_rank_is_named(tmp_path):
    results = _run(tmp_path, perturb=True)
    for rank in range(WORLD):  # every rank sees the same finding, at the first sync after the change
        [(kind, step, message)] = results[rank]
        assert kind == "replicas_out_of_sync" and step == 4
        assert "2.weight" in message and "rank 1" in message
        assert "0.weight" not in message and "2.bias" not in message


def test_no_effect_when_not_distributed():
    model = nn.Linear(3, 1)
    live = LiveMonitor("model.gradient_flow", sync_every=1, warn=False).attach(model)
    for step in range(1, 4):
        model(torch.randn(2, 3)).sum().backward()
        assert live.step_end(step) == []
    live.detach()


def test_sync_every_is_checked():
    from tropt.errors import TroptError

    for bad in (0, -1, 1.5, True):
        with pytest.raises(TroptError, match="sync_every"):
            LiveMonitor(sync_every=bad)


def test_the_callbacks_pass_sync_every_on():
    lightning = pytest.importorskip("lightning")  # noqa: F841
    from tropt.errors import TroptError
    from tropt.integrations.lightning import TroptCallback

    assert TroptCallback(sync_every=7)._options["sync_every"] == 7
    with pytest.raises(TroptError, match="sync_every"):
        TroptCallback(sync_every=0)
