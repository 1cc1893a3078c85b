"""The framework builders read ``accumulation_steps`` as their framework does: K loader batches per optimizer step.

Known answers computed by hand from the framework's own arithmetic: Lightning divides each batch's loss by
``accumulate_grad_batches``; the HF Trainer sums each batch's token losses and divides by ``num_items_in_batch``, the
valid (shifted) label tokens of the K batches together. The batches come from the Setup's own batch source.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F


def _grads_at_step(setup, micro_batches) -> dict[str, torch.Tensor]:
    """The gradients, by parameter name, the Setup's step hands to ``optimizer.step()`` on one call (clipping off)."""
    ctx = setup.build()
    seen: list = []
    ctx.optimizer.register_step_pre_hook(lambda *_: seen.append(
        {n: p.grad.detach().clone() for n, p in ctx.model.named_parameters() if p.grad is not None}))
    setup.run_step(ctx, micro_batches)
    assert len(seen) == 1
    return seen[0]


def _assert_same(got: dict, model: torch.nn.Module) -> None:
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys()
    for name, g in got.items():
        assert torch.allclose(g, want[name], atol=1e-6, rtol=1e-4), name


def test_lightning_builder_steps_on_k_loader_batches_each_divided_by_k():
    pl = pytest.importorskip("lightning.pytorch")  # noqa: F841
    from test_lightning_setup import LitClassifier, loader

    from tropt.integrations.lightning import setup_from_lightning

    data = loader(n=96, batch=16)
    setup = setup_from_lightning(LitClassifier(dropout=0.0), train_dataloaders=data,
                                 trainer_kwargs={"accumulate_grad_batches": 2})
    assert setup.accumulation == "batches" and setup.epoch_steps() == (3, "Setup(steps_per_epoch=)")
    group = next(setup.batches(1))
    micro = setup.split(group, 2)
    first_two = list(data)[:2]
    assert setup.size(group) == 32 and all(torch.equal(m[0], b[0]) for m, b in zip(micro, first_two, strict=True))
    got = _grads_at_step(setup, micro)
    ref = setup.build().model  # the same initial copy
    (sum(F.cross_entropy(ref.net(x), y) for x, y in first_two) / 2).backward()  # Lightning: loss / K per batch
    _assert_same(got, ref)


def test_hf_builder_steps_on_k_loader_batches_divided_by_their_tokens(tmp_path):
    pytest.importorskip("transformers")
    from test_hf_setup import gpt2, trainer_of

    from tropt.integrations.hf import setup_from_trainer

    trainer = trainer_of(__import__("transformers").Trainer, tmp_path, model=gpt2(dropout=0.0),
                         gradient_accumulation_steps=2, per_device_train_batch_size=8, max_grad_norm=0.0)
    setup = setup_from_trainer(trainer)
    assert setup.accumulation == "batches" and setup.epoch_steps() == (2, "Setup(steps_per_epoch=)")  # 4 batches
    group = next(setup.batches(1))  # two collated batches padded to different lengths, joined by padding
    micro = setup.split(group, 2)
    assert setup.size(group) == 16 and [setup.size(m) for m in micro] == [8, 8]
    got = _grads_at_step(setup, micro)
    ref = setup.build().model
    total, count, shifted = torch.zeros(()), 0, 0
    # The Trainer's num_items_in_batch counts labels[..., 1:] only when it sees the model's loss shift them (its
    # loss_type); this config names none, so it counts every label.
    counted = (lambda labels: labels[:, 1:]) if trainer._loss_shifts_labels else (lambda labels: labels)
    for b in micro:  # the Trainer's arithmetic: token sums over the K batches / num_items_in_batch
        logits = ref(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        labels = b["labels"][:, 1:]
        total = total + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
        count += int(counted(b["labels"]).ne(-100).sum())
        shifted += int(labels.ne(-100).sum())
    (total / count).backward()
    _assert_same(got, ref)
    # the joined (padded) batch is the model's token mean over both batches: padding added no token
    with torch.no_grad():
        assert float(setup.loss(ref, group)) == pytest.approx(float(total / shifted), rel=1e-5)
