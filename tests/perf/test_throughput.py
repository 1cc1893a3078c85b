"""perf.throughput with known answers; the user's objects are never touched."""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import torch
from support.perf_setups import mlp_setup, quiet_machine  # noqa: F401 - quiet_machine is an autouse fixture
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.perf import check_throughput
from tropt.result import CheckResult, Status
from tropt.testing import untouched


class SlowDataset(torch.utils.data.Dataset):
    """Each sample takes 10 ms to "decode": a batch of 16 waits ~160 ms for a step that computes in ~1 ms
    (a margin wide enough to hold on a loaded machine)."""

    def __init__(self, n=256, d=8, delay=0.01):
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.delay = torch.randn(n, d, generator=g), torch.randint(0, 3, (n,), generator=g), delay

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


def test_throughput_flags_a_slow_dataset():
    s = mlp_setup(torch.utils.data.DataLoader(SlowDataset(), batch_size=16))
    with untouched(s):
        r = check_throughput(s, warmup=1, steps=4, profile_steps=1, progress=False)
    assert r.status == Status.WARN and r.metrics["limited_by"] == "data loading"
    assert r.metrics["data_wait_share"] > 0.2 and r.metrics["data_wait_ms"] > 100
    assert any("num_workers" in a for a in r.advice)
    assert len(r.tables["steps"]) == 4 and not r.tables["top_operators"].empty
    assert r.metrics["params_mb"] > 0 and r.metrics["rss_mb"] > 0
    r.plot()
    plt.close("all")


def test_throughput_advice_for_sub_millisecond_waits_does_not_also_ask_for_workers():
    """Waits under a millisecond (tensors in memory): workers may cost more than they save, so no advice may then
    ask for num_workers=1, prefetching or persistent workers."""
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g))
    s = mlp_setup(torch.utils.data.DataLoader(ds, batch_size=8))
    r = check_throughput(s, warmup=3, steps=5, profile=False, data_threshold=0.0, progress=False)  # always WARN
    assert r.status == Status.WARN and r.metrics["data_wait_ms"] < 1.0, r.summary
    assert len(r.advice) == 1 and "may cost more than they save" in r.advice[0], r.advice
    assert not any(w in r.advice[0] for w in ("num_workers=", "prefetch_factor", "persistent_workers"))
    # a loader that already has workers is told to try without them (its waits are too timing-dependent to run here)
    from tropt.perf.throughput import _cheap_batches_advice

    assert "try num_workers=0 instead of 2" in _cheap_batches_advice(
        mlp_setup(torch.utils.data.DataLoader(ds, num_workers=2)))


def test_throughput_in_memory_batches_are_compute_bound():
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g)) for _ in range(4)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 3))
    s = tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                    lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), batches)
    with untouched(s):
        r = check_throughput(s, warmup=2, steps=6, profile=False, progress=False)
    # waiting for a list element is a pointer copy; a 512-wide MLP step on 256 samples is milliseconds
    assert r.status == Status.PASS and r.metrics["limited_by"] == "compute", r.summary
    assert r.metrics["samples_per_s"] > 0
    back = CheckResult.from_dict(r.to_dict())
    back.plot()
    plt.close("all")


def test_top_operators_sum_one_profiler_session_per_step_and_stop_early_on_op_heavy_steps(monkeypatch):
    """Each profiled step is its own profiler session (the events of three op-heavy steps in one session held a
    gigabyte); rows are summed by operator, and a step heavier than the budget is profiled alone."""
    from tropt.perf import throughput

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(4)]
    torch.manual_seed(0)
    s = tropt.Setup(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)),
                    lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                    lambda m: torch.optim.SGD(m.parameters(), lr=0.1), batches)
    r = check_throughput(s, warmup=1, steps=3, profile_steps=3, progress=False)
    ops = r.tables["top_operators"].set_index("operator")
    assert r.metrics["profiled_steps"] == 3
    assert ops.loc["aten::addmm", "calls"] == 3 * 2  # two Linear layers a step, three steps summed
    monkeypatch.setattr(throughput, "MAX_PROFILED_OPS", 10)
    r = check_throughput(s, warmup=1, steps=3, profile_steps=3, progress=False)
    assert r.metrics["profiled_steps"] == 1
    assert r.tables["top_operators"].set_index("operator").loc["aten::addmm", "calls"] == 2


def test_profiler_start_and_stop_lines_stay_out_of_the_output():
    """torch's profiler library prints start/stop markers to file descriptor 2 (a notebook shows them in the cell)."""
    import subprocess
    import sys

    code = ("import torch, tropt\nfrom torch import nn\nfrom torch.nn import functional as F\n"
            "x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))\n"
            "s = tropt.Setup(nn.Linear(4, 2), lambda m, b: F.cross_entropy(m(b[0]), b[1]), "
            "lambda m: torch.optim.SGD(m.parameters(), lr=0.1), [(x, y)] * 4)\n"
            "from tropt.perf import check_throughput\n"
            "r = check_throughput(s, warmup=1, steps=3, profile_steps=1, progress=False)\n"
            "print(r.status.value, len(r.tables['top_operators']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "profiler_start" not in out.stderr and "profiler_stop" not in out.stderr, out.stderr
    assert int(out.stdout.split()[1]) > 0  # the profile itself still ran
