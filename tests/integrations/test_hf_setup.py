"""setup_from_trainer: a transformers Trainer's own accumulation cycle, checked by the loop checks.

A tiny GPT-2 built from a config (never downloaded) over variable-length padded sequences (labels -100 on padding),
gradient_accumulation_steps=4.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tropt  # noqa: E402
from tropt.errors import SetupError  # noqa: E402
from tropt.integrations.hf import setup_from_trainer  # noqa: E402
from tropt.result import Status  # noqa: E402
from tropt.testing import untouched  # noqa: E402

VOCAB, MAX_LEN = 48, 12


class Sequences(torch.utils.data.Dataset):
    """Token sequences of 2..MAX_LEN tokens, each token the previous one + 1 (mod VOCAB): learnable, unequal lengths."""

    def __init__(self, n: int = 32, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(2, MAX_LEN + 1, (1,), generator=g))
            start = int(torch.randint(1, VOCAB, (1,), generator=g))
            self.items.append((start + torch.arange(length)) % (VOCAB - 1) + 1)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.items[i]}


def pad(features: list) -> dict:
    """Right-pad to the longest sequence; labels are -100 on padding."""
    n = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), n, dtype=torch.long)
    labels = torch.full((len(features), n), -100)
    mask = torch.zeros(len(features), n, dtype=torch.long)
    for i, f in enumerate(features):
        k = len(f["input_ids"])
        ids[i, :k], labels[i, :k], mask[i, :k] = f["input_ids"], f["input_ids"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def gpt2(dropout: float = 0.1):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
                                  eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return transformers.GPT2LMHeadModel(cfg)


def trainer_of(cls, tmp_path, model=None, **overrides):
    args = dict(output_dir=str(tmp_path), per_device_train_batch_size=16, gradient_accumulation_steps=4, report_to=[],
                use_cpu=True, max_grad_norm=1.0, learning_rate=1e-3, warmup_steps=2, max_steps=20, save_strategy="no",
                logging_strategy="no", seed=0)
    args.update(overrides)
    return cls(model=model if model is not None else gpt2(), args=transformers.TrainingArguments(**args),
               train_dataset=Sequences(), data_collator=pad)


class TokenMeanTrainer(transformers.Trainer):
    """A user's compute_loss that returns each micro-batch's token mean and ignores num_items_in_batch."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        return (outputs.loss, outputs) if return_outputs else outputs.loss


class TokenMeanDividedTrainer(TokenMeanTrainer):
    """The same, declared as a per-batch mean: the Trainer divides it by the accumulation steps (the 2024 bug)."""

    loss_is_scaled_for_ga = False


def run(setup, checks) -> dict:
    return {r.check: r for r in tropt.diagnose(setup, checks=checks, progress=False).results}


# ------------------------------------------------------------------ the Trainer as shipped passes
def test_shipped_trainer_passes_the_loop_checks_and_is_not_modified(tmp_path):
    trainer = trainer_of(transformers.Trainer, tmp_path)
    setup = setup_from_trainer(trainer)
    assert (setup.accumulation_steps, setup.grad_clip, setup.precision) == (4, 1.0, "fp32")
    prepared = len(trainer.accelerator._dataloaders)
    with untouched(setup, trainer.model):
        results = run(setup, ["loop.accumulation", "loop.scheduler_cadence", "loop.zero_grad", "loop.resume"])
    for cid, r in results.items():
        assert r.status is Status.PASS, (cid, r.summary)
    assert "unequal sizes" in results["loop.accumulation"].summary  # exact even for uneven micro-batches: token counts
    assert trainer.optimizer is None and trainer.lr_scheduler is None
    assert len(trainer.accelerator._dataloaders) == prepared


def test_bf16_trainer_passes_accumulation_in_its_tolerance(tmp_path):
    setup = setup_from_trainer(trainer_of(transformers.Trainer, tmp_path, bf16=True))
    assert (setup.precision, setup.use_scaler, str(setup.device)) == ("bf16", False, "cpu")
    r = run(setup, ["loop.accumulation"])["loop.accumulation"]
    assert r.status is Status.PASS, r.summary


@pytest.mark.parametrize("cls, cause, words", [
    (TokenMeanTrainer, "per_micro_mean_summed", "sum of the 4 per-micro-batch mean losses"),
    (TokenMeanDividedTrainer, "per_micro_mean", "average of per-micro-batch mean losses"),
])
def test_compute_loss_ignoring_num_items_fails_accumulation_with_the_token_mean_cause(tmp_path, cls, cause, words):
    setup = setup_from_trainer(trainer_of(cls, tmp_path))
    r = run(setup, ["loop.accumulation"])["loop.accumulation"]
    assert r.status is Status.FAIL, r.summary
    assert r.metrics["cause"] == cause and words in r.summary, r.summary
    assert "normalised by its own item count" in r.summary


def test_the_step_reproduces_a_real_trainer_train(tmp_path):
    # The reference is transformers itself: Trainer.train for 2 optimizer steps (sequential batches) vs 2 calls of the
    # Setup's step on the same 4 micro-batches each reach the same parameters and learning rate.
    class InOrder(transformers.Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return torch.utils.data.SequentialSampler(train_dataset if train_dataset is not None
                                                      else self.train_dataset)

    trainer = trainer_of(InOrder, tmp_path, model=gpt2(dropout=0.0), per_device_train_batch_size=4, max_steps=2,
                         max_grad_norm=0.5)
    setup = setup_from_trainer(trainer)
    ctx = setup.build()
    batches = list(setup.train_data)
    for i in range(2):
        setup.run_step(ctx, batches[i * 4:(i + 1) * 4])
    trainer.train()
    for (name, p), q in zip(trainer.model.named_parameters(), ctx.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-4), name
    assert ctx.optimizer.param_groups[0]["lr"] == pytest.approx(trainer.optimizer.param_groups[0]["lr"])


def test_optimizers_given_to_the_trainer_are_rebuilt_for_each_copy(tmp_path):
    model = gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))
    trainer = transformers.Trainer(model=model, args=trainer_of(transformers.Trainer, tmp_path, model=model).args,
                                   train_dataset=Sequences(), data_collator=pad, optimizers=(opt, sched))
    setup = setup_from_trainer(trainer)
    ctx = setup.build()
    assert type(ctx.optimizer) is torch.optim.SGD and ctx.scheduler.optimizer is ctx.optimizer
    with untouched(opt, sched):
        r = run(setup, ["loop.scheduler_cadence"])["loop.scheduler_cadence"]
    assert r.status is Status.PASS, r.summary


# ------------------------------------------------------------------ bad inputs
def test_a_trainer_without_train_dataset_raises(tmp_path):
    trainer = transformers.Trainer(model=gpt2(),
                                   args=transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                                       report_to=[]))
    with pytest.raises(SetupError) as err:
        setup_from_trainer(trainer)
    assert "no train_dataset" in err.value.message and "train_dataset=" in err.value.fix


def test_not_a_trainer_raises():
    with pytest.raises(SetupError, match=r"not a transformers\.Trainer"):
        setup_from_trainer(object())


def test_an_unsupported_transformers_version_is_named(monkeypatch, tmp_path):
    trainer = trainer_of(transformers.Trainer, tmp_path)
    monkeypatch.setattr("tropt.integrations._frameworks.metadata.version", lambda dist: "4.30.0")
    with pytest.raises(SetupError, match=r"transformers 4\.30\.0 is installed.*>=4\.46,<6"):
        setup_from_trainer(trainer)


# ------------------------------------------------------------------ checks that run without the Trainer's schedule
def test_lr_range_sweeps_a_trainer_whose_warmup_starts_at_zero(tmp_path):
    # The Trainer's linear warmup sets the LR to 0 when it is built; lr_range runs without the schedule, so the
    # sweep must see the optimizer at its base LR (learning_rate), or every swept LR is multiplied by 0.
    setup = setup_from_trainer(trainer_of(transformers.Trainer, tmp_path, warmup_steps=5))
    r = run(setup, ["dynamics.lr_range"])["dynamics.lr_range"]
    assert r.metrics["setup_lr"] == pytest.approx(1e-3)
    assert r.metrics["best_relative_drop"] > 0.2, r.summary


# ------------------------------------------------------------------ a known bug of transformers, found
class Tokens(torch.utils.data.Dataset):
    """Variable-length token sequences labelled by whether token 7 occurs (learnable)."""

    def __init__(self, n: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = [torch.randint(3, VOCAB, (int(torch.randint(4, MAX_LEN, (1,), generator=g)),), generator=g)
                      for _ in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.items[i], "labels": int((self.items[i] == 7).any())}


def pad_classes(features: list) -> dict:
    n = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), n, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = f["input_ids"]
    return {"input_ids": ids, "attention_mask": (ids != 0).long(),
            "labels": torch.tensor([f["labels"] for f in features])}


def bert_trainer(tmp_path, **attrs):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, num_labels=2)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8,
                                          gradient_accumulation_steps=2, report_to=[], use_cpu=True, max_steps=20,
                                          save_strategy="no", logging_strategy="no")
    trainer = transformers.Trainer(model=transformers.BertForSequenceClassification(cfg), args=args,
                                   train_dataset=Tokens(), data_collator=pad_classes)
    for k, v in attrs.items():
        setattr(trainer, k, v)
    return trainer


def test_a_head_that_takes_kwargs_but_drops_num_items_in_batch_doubles_the_accumulated_gradient(tmp_path):
    # transformers#47688: BertForSequenceClassification.forward declares **kwargs, so the Trainer does not divide the
    # loss by the accumulation steps and expects the model to divide by num_items_in_batch, which its CrossEntropyLoss
    # ignores: with 2 accumulation steps the update is 2x the full-batch one. The Trainer as shipped, on the real
    # package.
    results = run(setup_from_trainer(bert_trainer(tmp_path)), ["loop.accumulation", "loop.ddp"])
    r = results["loop.accumulation"]
    assert r.status is Status.FAIL and "2×" in r.summary and "summed" in r.summary, r.summary
    # Under DDP the Trainer also multiplies the loss by the world size (average_tokens_across_devices): 2x again.
    assert (results["loop.ddp"].status is Status.FAIL
            and "2×" in results["loop.ddp"].summary), results["loop.ddp"].summary
    # The documented workaround: tell the Trainer the model does not consume the loss kwargs.
    fixed = run(setup_from_trainer(bert_trainer(tmp_path, model_accepts_loss_kwargs=False)),
                ["loop.accumulation", "loop.ddp"])
    for cid, res in fixed.items():
        assert res.status is Status.PASS, (cid, res.summary)
