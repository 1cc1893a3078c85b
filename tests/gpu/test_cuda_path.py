"""The GPU path (issue 32): every check on CUDA with the semantics it has on the CPU.

Marked ``gpu`` and skipped without CUDA, so the CPU suite stays green; ``benchmarks/device_check.sh`` runs them on a
GPU machine. Each test has a known answer: a healthy setup gives no FAIL or ERROR on the device, a planted defect
still FAILs for its cause, and the device-specific measurements read the device (the caching allocator, device
synchronisation), not the host.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tropt
import tropt.loop
import tropt.perf
from tropt.result import Status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run benchmarks/device_check.sh)")]

DEVICE = "cuda"


def _batches(n: int = 4, batch: int = 64, d: int = 16, classes: int = 4, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d, classes, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(batch, d, generator=g)
        out.append((x, (x @ w).argmax(1)))
    return out


def _ce(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _mlp_setup(**kw) -> tropt.Setup:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    return tropt.Setup(model, _ce, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), train_data=_batches(),
                       val_data=_batches(2, seed=1), device=DEVICE, num_classes=4, **kw)


def _bad(report) -> dict:
    return {r.check: f"{r.status.value}: {r.summary}" for r in report.results
            if r.status in (Status.FAIL, Status.ERROR)}


def test_healthy_mlp_passes_every_model_and_loop_check_on_cuda():
    report = tropt.diagnose(_mlp_setup(), checks=["model", "loop"], budget="quick", progress=False)
    assert not _bad(report), _bad(report)


def test_healthy_mlp_with_accumulation_and_clip_passes_on_cuda():
    report = tropt.diagnose(_mlp_setup(accumulation_steps=4, grad_clip=1.0), checks=["loop"], budget="quick",
                            progress=False)
    assert not _bad(report), _bad(report)


def test_missing_division_by_k_still_fails_on_cuda():
    def step(ctx, micro_batches):
        ctx.optimizer.zero_grad(set_to_none=True)
        for mb in micro_batches:
            ctx.loss_fn(ctx.model, mb).backward()  # the planted bug: no / len(micro_batches)
        ctx.optimizer.step()

    r = tropt.loop.check_accumulation(_mlp_setup(accumulation_steps=4, step=step), progress=False)
    assert r.status is Status.FAIL, r.summary
    assert "summed" in r.summary, r.summary


def test_memory_reads_the_caching_allocator():
    r = tropt.perf.check_memory(_mlp_setup(), progress=False)
    assert r.status is not Status.ERROR, r.summary
    assert "torch.cuda.max_memory_allocated" in r.summary, r.summary


def test_precision_compares_what_the_device_supports():
    r = tropt.perf.check_precision(_mlp_setup(), progress=False)
    assert r.status is not Status.ERROR, r.summary
    if torch.cuda.is_bf16_supported():
        assert "bf16" in str(r.metrics) + str(r.tables), r.metrics


def test_fp16_with_a_real_grad_scaler_passes_loss_scaling_on_cuda():
    setup = _mlp_setup(precision="fp16", use_scaler=True, grad_clip=1.0)
    r = tropt.loop.check_loss_scaling(setup, progress=False)
    assert r.status in (Status.PASS, Status.WARN, Status.SKIP), r.summary


def test_throughput_times_the_device_not_the_host():
    r = tropt.perf.check_throughput(_mlp_setup(), progress=False)
    assert r.status is not Status.ERROR, r.summary
    assert str(r.metrics.get("device", "")).startswith("cuda"), r.metrics


def test_nothing_of_the_users_moves_off_its_device():
    setup = _mlp_setup()
    before = {n: p.detach().clone() for n, p in setup.model.state_dict().items()}
    tropt.diagnose(setup, checks=["model", "loop"], budget="quick", progress=False)
    after = setup.model.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert all(p.device.type == "cuda" for p in setup.model.parameters())
