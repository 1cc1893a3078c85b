"""Model-mode helpers, shared by the stage packages: switch parts of a model's training behaviour off for a probe
and put them back afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import nn


def dropout_off(model: nn.Module) -> AbstractContextManager[None]:
    """Context manager: dropout modules in eval mode and attention dropout at 0 (other modules untouched), restored
    on exit. ``nn.MultiheadAttention`` keeps its dropout as a float applied whenever it trains."""

    @contextmanager
    def cm() -> Iterator[None]:
        drops = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training]
        attn = [(a, a.dropout) for a in model.modules() if isinstance(a, nn.MultiheadAttention) and a.dropout]
        for d in drops:
            d.eval()
        for a, _ in attn:
            a.dropout = 0.0
        try:
            yield
        finally:
            for d in drops:
                d.train()
            for a, p in attn:
                a.dropout = p

    return cm()


_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_BATCH_DEPENDENT = (nn.modules.batchnorm._BatchNorm,)


def quiet_randomness(model: nn.Module) -> int:
    """Switch off dropout in a copy (p = 0) so randomness not under test cannot fake or mask a difference.

    Returns how many modules were changed. Works even if the user's step calls ``model.train()``.
    """
    changed = 0
    for m in model.modules():
        if isinstance(m, _DROPOUT) and m.p:
            m.p = 0.0
            changed += 1
        elif isinstance(m, (nn.MultiheadAttention, nn.RNNBase)) and m.dropout:
            m.dropout = 0.0  # dropout inside attention / between RNN layers
            changed += 1
    return changed


def batch_dependent_layers(model: nn.Module) -> list[str]:
    """Names of layers whose output for one sample depends on the rest of the batch in training (BatchNorm and
    friends)."""
    return [name for name, m in model.named_modules() if isinstance(m, _BATCH_DEPENDENT)]


def freeze_batch_stats(model: nn.Module) -> int:
    """Make batch-dependent layers of a copy normalise with their running statistics, whatever mode is set.

    ``model.train()`` calls ``child.train(mode)``; an instance-level override keeps these layers in eval mode.
    Layers without running statistics get fresh ones (mean 0, variance 1), which is still per-sample.
    """
    count = 0
    for m in model.modules():
        if isinstance(m, _BATCH_DEPENDENT):
            if m.running_mean is None:
                device = next(m.parameters(), torch.zeros(0)).device
                m.register_buffer("running_mean", torch.zeros(m.num_features, device=device))
                m.register_buffer("running_var", torch.ones(m.num_features, device=device))
                m.track_running_stats = True
            m.training = False
            m.train = (lambda self_: (lambda mode=True: self_))(m)  # type: ignore[method-assign,assignment]
            count += 1
    return count
