"""The builders on loops written by others: Lightning's quickstart LitAutoEncoder and a run_clm-style causal-LM Trainer.

Ports of the public examples (their code shape, tiny sizes, synthetic data), not designed for tropt: the loop checks
and the can-it-learn checks that depend on the step give no FAIL and no ERROR.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from torch import nn

import tropt
from tropt.result import Status
from tropt.testing import untouched

CHECKS = ["model.overfit_batch", "model.gradient_flow", "loop"]


def verdicts(setup, *originals) -> dict:
    """Every step-dependent check's result; the user's objects are left exactly as they were."""
    with warnings.catch_warnings(), untouched(setup, *originals):
        warnings.simplefilter("ignore")
        return {r.check: r for r in tropt.diagnose(setup, checks=CHECKS, progress=False).results}


def bad(results: dict) -> dict:
    return {c: (r.status.value, r.summary) for c, r in results.items() if r.status in (Status.FAIL, Status.ERROR)}


def test_lightning_quickstart_autoencoder():
    L = pytest.importorskip("lightning")
    from tropt.integrations.lightning import setup_from_lightning

    class LitAutoEncoder(L.LightningModule):  # as in Lightning's "Lightning in 15 minutes"
        def __init__(self, encoder, decoder):
            super().__init__()
            self.encoder = encoder
            self.decoder = decoder

        def training_step(self, batch, batch_idx):
            x, _ = batch
            x = x.view(x.size(0), -1)
            z = self.encoder(x)
            x_hat = self.decoder(z)
            loss = nn.functional.mse_loss(x_hat, x)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    protos = torch.rand(5, 1, 28, 28, generator=g)  # MNIST stand-in: noisy copies of 5 prototype images
    labels = torch.randint(0, 5, (128,), generator=g)
    images = (protos[labels] + 0.05 * torch.randn(128, 1, 28, 28, generator=g)).clamp(0, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=32)
    torch.manual_seed(0)
    model = LitAutoEncoder(nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 3)),
                           nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 28 * 28)))
    for kwargs in ({}, {"accumulate_grad_batches": 4, "gradient_clip_val": 0.5, "precision": "bf16-mixed"}):
        results = verdicts(setup_from_lightning(model, train_dataloaders=data, trainer_kwargs=kwargs), model)
        assert not bad(results), (kwargs, bad(results))
        assert results["loop.accumulation"].status is Status.PASS


def test_run_clm_style_causal_lm_trainer(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tropt.integrations.hf import setup_from_trainer

    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "the", "cat", "sleeps",
             "on", "the", "warm", "mat"]
    vocab = {w: i for i, w in enumerate(sorted(set(words)))}
    tokenized = [{"input_ids": [vocab[w] for w in words[i:] + words[:i]]} for i in range(len(words))] * 4
    block_size = 16

    def group_texts(examples):  # as run_clm.py: concatenate, drop the remainder, cut into blocks, labels = input_ids
        concatenated = list(itertools.chain(*[e["input_ids"] for e in examples]))
        total = (len(concatenated) // block_size) * block_size
        blocks = [concatenated[i:i + block_size] for i in range(0, total, block_size)]
        return [{"input_ids": b, "attention_mask": [1] * block_size, "labels": list(b)} for b in blocks]

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=len(vocab), n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8,
                                          gradient_accumulation_steps=4, learning_rate=5e-3, warmup_steps=10,
                                          max_steps=400, weight_decay=0.01, report_to="none", use_cpu=True,
                                          save_strategy="no", logging_strategy="no")
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args,
                                   train_dataset=group_texts(tokenized),
                                   data_collator=transformers.default_data_collator)
    results = verdicts(setup_from_trainer(trainer), trainer.model)
    assert not bad(results), bad(results)
    for cid in ("loop.accumulation", "loop.scheduler_cadence", "loop.ddp", "model.overfit_batch"):
        assert results[cid].status is Status.PASS, (cid, results[cid].summary)
