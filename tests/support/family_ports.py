"""Small CPU ports of loop families the step contract had not met (issue 28), paraphrased from their public
originals, not copied. Each ``*_setup`` returns a healthy :class:`tropt.Setup`:

- ``adafactor_setup``: the Hugging Face docs' recommended T5 fine-tuning optimizer,
  ``Adafactor(params, scale_parameter=True, relative_step=True, warmup_init=True, lr=None)``
  (transformers/optimization.py, class ``Adafactor``): no learning rate in the param groups, a relative step size
  the optimizer schedules itself;
- ``t5_setup``: a sequence-to-sequence fine-tuning loop as ``examples/pytorch/translation/run_translation.py`` runs
  it: ``T5ForConditionalGeneration(**batch)`` with ``labels`` that the model shifts right into its decoder inputs,
  the loss read off ``outputs.loss``, and an evaluation that reports ``eval_loss`` (the Trainer's
  ``prediction_step``: the mean of ``outputs.loss`` over the validation batches). Tiny dims, random init, no hub;
- ``checkpointed_dropout_setup``: activation checkpointing as ``torch.utils.checkpoint`` documents it (and as the
  Hugging Face ``gradient_checkpointing_enable()`` models run it): every block, dropout inside, recomputed in the
  backward pass with ``checkpoint(block, h, use_reentrant=False)``;
- ``spectral_norm_setup``: an SNGAN-style discriminator (pytorch-spectral-normalization-gan's ``model_resnet.py``,
  BigGAN-PyTorch's ``layers.py``) whose layers are wrapped in ``spectral_norm``, either the hook-based
  ``torch.nn.utils.spectral_norm``/``weight_norm`` those repositories use or the parametrization
  ``torch.nn.utils.parametrizations.spectral_norm``; as a user has it in a notebook after a forward pass.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import tropt

# ------------------------------------------------------------------ a small classification task (MLP ports)
D, C = 8, 4


def class_batches(n_batches: int = 4, batch: int = 32, seed: int = 0) -> list:
    """(x, y) batches: y is the argmax of a random linear teacher, learnable by an MLP."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(D, C, generator=g)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, D, generator=g)
        out.append((x, (x @ teacher).argmax(1)))
    return out


def class_ce(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def class_mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, C))


# ------------------------------------------------------------------ Adafactor: no float learning rate
def adafactor(model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer factory the Hugging Face docs recommend for T5 (lr=None: a relative step, warmed up)."""
    from transformers.optimization import Adafactor

    return Adafactor(model.parameters(), scale_parameter=True, relative_step=True, warmup_init=True, lr=None)


def adafactor_setup() -> tropt.Setup:
    return tropt.Setup(class_mlp(), class_ce, adafactor, class_batches(), num_classes=C)


# ------------------------------------------------------------------ T5: labels build the decoder input
VOCAB, LENGTH = 24, 6


def t5_model(seed: int = 0) -> nn.Module:
    """A randomly initialised T5 of a few thousand parameters (pad 0 is also the decoder start token)."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=2, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(config)


def t5_batches(n_batches: int = 3, batch: int = 32, seed: int = 0) -> list:
    """Translation-like pairs: each source token maps to the next token of the vocabulary (2..VOCAB-1), so the
    decoder can only predict a target from the source (its own previous targets are random)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randint(2, VOCAB, (batch, LENGTH), generator=g)
        y = (x - 1) % (VOCAB - 2) + 2
        out.append({"input_ids": x, "attention_mask": torch.ones_like(x), "labels": y})
    return out


def seq2seq_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def eval_loss(model: nn.Module, val_data: list) -> float:
    """The Trainer's ``eval_loss``, negated so that higher is better: the mean of ``outputs.loss`` over the batches."""
    with torch.no_grad():
        return -float(torch.stack([model(**b).loss for b in val_data]).mean())


def t5_setup(lr: float = 3e-3) -> tropt.Setup:
    return tropt.Setup(t5_model(), seq2seq_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=lr), t5_batches(),
                       val_data=t5_batches(2, seed=1),
                       metric=tropt.Metric(eval_loss, higher_is_better=True, name="neg_eval_loss"))


# ------------------------------------------------------------------ activation checkpointing with dropout
class CheckpointedMLP(nn.Module):
    """Residual blocks with dropout, each recomputed in the backward pass (non-reentrant checkpointing)."""

    def __init__(self, width: int = 32, blocks: int = 3, p: float = 0.2, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(D, width)
        # A transformer's feed-forward block: dropout between its two layers.
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(p),
                                                  nn.Linear(2 * width, width)) for _ in range(blocks))
        self.head = nn.Linear(width, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + (checkpoint(block, h, use_reentrant=False) if self.training else block(h))
        return self.head(h)


def checkpointed_dropout_setup() -> tropt.Setup:
    return tropt.Setup(CheckpointedMLP(), class_ce, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
                       class_batches(), num_classes=C)


# ------------------------------------------------------------------ spectral norm (a GAN discriminator's layers)
def spectral_norm_setup(kind: str = "hooks") -> tropt.Setup:
    """``kind``: "hooks" (``torch.nn.utils.spectral_norm``), "weight_norm" (``torch.nn.utils.weight_norm``) or
    "parametrization" (``torch.nn.utils.parametrizations.spectral_norm``). The model has run one forward pass with
    gradients enabled, as it has after a sanity check or a training cell in a notebook."""
    import warnings

    torch.manual_seed(0)
    if kind == "hooks":
        wrap = nn.utils.spectral_norm
    elif kind == "weight_norm":
        wrap = nn.utils.weight_norm
    else:
        wrap = nn.utils.parametrizations.spectral_norm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.nn.utils.weight_norm is deprecated, still used
        model = nn.Sequential(wrap(nn.Linear(D, 32)), nn.LeakyReLU(0.1), wrap(nn.Linear(32, C)))
    batches = class_batches()
    model(batches[0][0])  # the forward a user ran: hook-based norms keep its non-leaf weight on the module
    return tropt.Setup(model, class_ce, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), batches,
                       num_classes=C)
