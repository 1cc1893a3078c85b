"""CTC speech recognition ports (held-out probe "misc"): nn.CTCLoss over variable input and target lengths.

- ``wav2letter_ctc``: pytorch/audio ``examples/pipeline_wav2letter/main.py`` + ``torchaudio/models/wav2letter.py``
  (paraphrased): a 1-D conv acoustic model over (batch, features, time) with a stride-2 first layer, log-softmax over
  the characters, the output transposed to (time, batch, classes) for ``nn.CTCLoss(blank=0, reduction='mean',
  zero_infinity=True)``
  input lengths are the frame counts after the stride, target lengths the transcript lengths;
  ``optimizer.zero_grad()``, loss, ``backward``, ``clip_grad_norm_``, ``step``. Features are random frames whose
  mean depends on the character being "spoken"; each utterance is padded to the batch's longest.

Planted bug: ``input_lengths`` set to the padded output length for every utterance (``torch.full((N,), T_out)``, a
DeepSpeech-forum classic): the padding frames are aligned as speech.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port
from ports.heldout._steps import share_weighted_step

N_FEAT, N_CHAR = 8, 6  # 5 characters + blank (0)


def utterances(n_batches: int = 4, batch: int = 8, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    sounds = torch.randn(N_CHAR, N_FEAT, generator=g)
    out = []
    for _ in range(n_batches):
        feats, flens, tgts, tlens = [], [], [], []
        for _ in range(batch):
            s = int(torch.randint(2, 5, (1,), generator=g))
            text = torch.randint(1, N_CHAR, (s,), generator=g)
            frames = []
            for c in text.tolist():
                frames += [sounds[c]] * int(torch.randint(3, 6, (1,), generator=g))
            x = torch.stack(frames) + 0.3 * torch.randn(len(frames), N_FEAT, generator=g)
            feats.append(x)
            flens.append(len(frames))
            tgts.append(text)
            tlens.append(s)
        t_max, s_max = max(flens), max(tlens)
        xb = torch.zeros(batch, N_FEAT, t_max)
        yb = torch.zeros(batch, s_max, dtype=torch.long)
        for i, (x, y) in enumerate(zip(feats, tgts)):
            xb[i, :, :len(x)] = x.T
            yb[i, :len(y)] = y
        out.append((xb, torch.tensor(flens), yb, torch.tensor(tlens)))
    return out


class Wav2Letter(nn.Module):
    def __init__(self, width: int = 24) -> None:
        super().__init__()
        self.acoustic = nn.Sequential(
            nn.Conv1d(N_FEAT, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(width, width, 3, padding=1), nn.ReLU(),
            nn.Conv1d(width, N_CHAR, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.acoustic(x), dim=1)  # (batch, classes, time)


CTC = nn.CTCLoss(blank=0, reduction="mean", zero_infinity=True)


def make_loss(padded_lengths: bool = False):
    def loss_fn(model: nn.Module, batch) -> torch.Tensor:
        x, flens, y, tlens = batch
        logp = model(x).permute(2, 0, 1)  # (time, batch, classes)
        in_lens = (torch.full_like(flens, logp.shape[0]) if padded_lengths  # BUG: padding counted as speech
                   else (flens + 1) // 2)  # the stride-2 conv's output frames
        return CTC(logp, y, in_lens, tlens)
    return loss_fn


_step = share_weighted_step(10.0)


def build_wav2letter(padded_lengths: bool = False) -> tropt.Setup:
    """wav2letter pipeline: Adadelta in upstream (here Adam 3e-3 for a short run), clip 10, CTC mean reduction."""
    torch.manual_seed(0)
    return tropt.Setup(Wav2Letter(), make_loss(padded_lengths), lambda m: torch.optim.Adam(m.parameters(), lr=3e-3),
                       utterances(), val_data=utterances(2, seed=1), step=_step, grad_clip=10.0)


UP = "pytorch/audio/examples/pipeline_wav2letter/main.py"
PORTS = [
    Port("wav2letter_ctc", "speech", UP, build_wav2letter, bugs=(
        Bug("ctc_input_lengths_padded", "model.overfit_batch", ("length",), lambda: build_wav2letter(True),
            source="DeepSpeech/pytorch forums: CTCLoss input_lengths must be the per-utterance output lengths, "
                   "not the padded length"),)),
]
