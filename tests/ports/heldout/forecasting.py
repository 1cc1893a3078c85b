"""Time-series forecasting ports (held-out probe "misc"): an LSTM encoder-decoder with scheduled sampling.

- ``lstm_seq2seq_mixed_teacher_forcing``: lkulowski/LSTM_encoder_decoder ``code/lstm_encoder_decoder.py``
  (paraphrased): ``lstm_encoder`` (nn.LSTM over a time-major (seq, batch, features) window) and ``lstm_decoder``
  (an LSTM cell step + Linear), ``train_model(training_prediction='mixed_teacher_forcing')``: the decoder starts from
  the window's last value, and at *each* output step ``random.random() < teacher_forcing_ratio`` decides whether the
  next input is the true value or the decoder's own prediction; ``dynamic_tf``: the ratio falls by 0.02 per epoch
  (here per optimizer step, carried on ``ctx``)
  ``nn.MSELoss``, Adam. Data: noisy sinusoids of random frequency and
  phase, windows of 12 in, 6 out
  ``batch_dim=1`` (time-major).

Planted bug: the validation metric decodes with teacher forcing (``teacher_forcing_ratio=1``: the true targets are
fed back in), so the score reads the labels it is meant to predict.
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port

T_IN, T_OUT, HID = 12, 6, 16


def windows(n_batches: int = 4, batch: int = 16, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        f = 0.2 + 0.3 * torch.rand(batch, generator=g)
        ph = 6.28 * torch.rand(batch, generator=g)
        t = torch.arange(T_IN + T_OUT, dtype=torch.float)[:, None]
        s = torch.sin(f[None] * t + ph[None]) + 0.05 * torch.randn(T_IN + T_OUT, batch, generator=g)
        out.append((s[:T_IN, :, None], s[T_IN:, :, None]))  # (seq, batch, 1), time-major
    return out


class Seq2Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.LSTM(1, HID)
        self.decoder = nn.LSTM(1, HID)
        self.linear = nn.Linear(HID, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None, tf_ratio: float = 0.0) -> torch.Tensor:
        _, hidden = self.encoder(x)
        dec_in = x[-1:]  # (1, batch, 1): the window's last value
        outs = []
        for t in range(T_OUT):
            h, hidden = self.decoder(dec_in, hidden)
            y = self.linear(h)
            outs.append(y)
            # mixed teacher forcing, decided per step
            dec_in = target[t:t + 1] if target is not None and random.random() < tf_ratio else y
        return torch.cat(outs, 0)


def forecast_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x, y, tf_ratio=0.5), y)


def _step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    ctx.tf_ratio = getattr(ctx, "tf_ratio", 0.5)
    ctx.model.train()
    ctx.optimizer.zero_grad()
    sizes = [ctx.batch_size(mb) for mb in micro]
    total = torch.zeros(())
    for (x, y), n in zip(micro, sizes):
        loss = F.mse_loss(ctx.model(x, y, tf_ratio=ctx.tf_ratio), y) * (n / sum(sizes))
        loss.backward()
        total += loss.detach()
    ctx.optimizer.step()
    ctx.tf_ratio = max(0.0, ctx.tf_ratio - 0.02)  # dynamic_tf
    return total


def neg_mse(tf_ratio: float = 0.0):
    def metric(model: nn.Module, data) -> float:
        errs = [float(F.mse_loss(model(x, y, tf_ratio=tf_ratio), y)) for x, y in data]
        return -sum(errs) / len(errs)
    return metric


def build_forecast(eval_teacher_forcing: bool = False) -> tropt.Setup:
    """The LSTM encoder-decoder with mixed teacher forcing decided per decoding step, its ratio decayed per step
    (``eval_teacher_forcing``: the validation metric decodes with the targets fed in)."""
    torch.manual_seed(0)
    return tropt.Setup(Seq2Seq(), forecast_loss, lambda m: torch.optim.Adam(m.parameters(), lr=0.01), windows(),
                       val_data=windows(2, seed=1), step=_step, batch_dim=1,
                       metric=tropt.Metric(neg_mse(1.0 if eval_teacher_forcing else 0.0), higher_is_better=True))


UP = "lkulowski/LSTM_encoder_decoder/code/lstm_encoder_decoder.py"
PORTS = [
    Port("lstm_seq2seq_mixed_teacher_forcing", "forecasting", UP, build_forecast, bugs=(
        Bug("metric_decodes_with_teacher_forcing", "model.eval_metric", ("target",),
            lambda: build_forecast(eval_teacher_forcing=True),
            source="forums: validation with teacher forcing overstates a seq2seq forecaster (exposure bias)"),)),
]
