"""model.init_loss pays for finding the model's inputs (one forward per batch tensor) only when its advice needs them
(issue 32): a loss at init near chance level skips it; a loss too high from a badly scaled input still names it."""

from __future__ import annotations

import torch
from support.model_fixtures import mlp, run, setup_for

from tropt.model import check_init_loss, init_loss
from tropt.result import Status


def test_a_loss_near_chance_level_never_looks_for_the_inputs(monkeypatch):
    def not_needed(*a, **k):
        raise AssertionError("input_paths ran although the loss at init is near chance level")

    monkeypatch.setattr(init_loss, "input_paths", not_needed)
    r = run(check_init_loss, setup_for(mlp(), num_classes=3))
    assert r.status is Status.PASS, r.summary


def test_a_badly_scaled_input_is_still_named_when_the_loss_is_too_high():
    calls = []
    real = init_loss.input_paths

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    g = torch.Generator().manual_seed(0)
    batches = [(1000 * torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(4)]
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(init_loss, "input_paths", counted)
        r = run(check_init_loss, setup_for(mlp(), batches=batches, num_classes=3))
    assert r.status in (Status.WARN, Status.FAIL), r.summary
    assert calls == [1] and r.advice[0].startswith("batch[0] has RMS") and "large" in r.advice[0]


def test_activation_histograms_of_large_layers_come_from_a_sample_that_keeps_the_shape_and_the_count():
    from tropt.model.activation_stats import BINS, HIST_SAMPLE, _histogram

    g = torch.Generator().manual_seed(0)
    o = torch.randn(8, 128, 1536, generator=g)  # a GPT-2 MLP's activations: 1.5M values
    full = torch.histc(o.clamp(-4, 4), bins=BINS, min=-4, max=4)
    sampled = _histogram(o, -4.0, 4.0)
    assert abs(float(sampled.sum()) - o.numel()) / o.numel() < 1e-6
    assert float((sampled - full).abs().sum()) / o.numel() < 0.02  # the same distribution, within 2%
    small = torch.randn(HIST_SAMPLE // 2, generator=g)
    assert torch.equal(_histogram(small, -4.0, 4.0), torch.histc(small.clamp(-4, 4), bins=BINS, min=-4, max=4))
