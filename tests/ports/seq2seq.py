"""Encoder-decoder ports (issue 28): translation with labels that build the decoder input, padding masks, token
counts under accumulation, label smoothing, an evaluation that reads ``outputs.loss``. Paraphrased from their
upstreams (named in each builder), never copied.

- ``t5_seq2seq_eval_loss``: ``support.family_ports.t5_setup`` wrapped as it is (a tiny T5, ``eval_loss`` metric);
- ``bart_translation_num_items``: a randomly initialised tiny BART fine-tuned as transformers'
  ``run_translation_no_trainer.py`` does, with variable-length pairs padded by ``DataCollatorForSeq2Seq`` (labels
  padded with -100), and the accumulation of accelerate's "variable-size training samples" guide: token losses
  summed and divided by the number of label tokens of the whole optimizer step;
- ``nn_transformer_translation``: PyTorch's ``translation_transformer.py`` tutorial: ``nn.Transformer`` on
  sequence-first ``(seq, batch)`` tensors, a causal target mask and source / target padding masks, teacher forcing
  with ``tgt[:-1]`` in and ``tgt[1:]`` out, cross-entropy that ignores the padding with label smoothing 0.1;
- ``fairseq_update_freq_sample_size``: fairseq's ``train_step`` with ``--update-freq``: summed label-smoothed token
  losses, the gradients divided once by the update's token count (``multiply_grads``), ``inverse_sqrt``.
"""

from __future__ import annotations

import contextlib
import math
from functools import partial

import torch
from support import family_ports as fp
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port

VOCAB, MAXLEN = 24, 8
PAD, BOS, EOS = 1, 0, 2  # BART's ids; the tutorial's PAD_IDX / BOS_IDX / EOS_IDX play the same roles


def t5_port() -> tropt.Setup:
    """transformers ``examples/pytorch/translation/run_translation.py`` with the Trainer: a tiny T5 whose ``labels``
    build its decoder input, the loss read off ``outputs.loss``, ``eval_loss`` as the metric
    (``support.family_ports.t5_setup``)."""
    return fp.t5_setup()


def t5_no_source() -> tropt.Setup:
    """tests/model/test_overfit_batch.py: the T5 fed a constant source (the test runs 60 steps; quick runs its own)."""
    def no_source(m, b):
        return m(input_ids=torch.full_like(b["input_ids"], 2), attention_mask=b["attention_mask"],
                 labels=b["labels"]).loss

    return fp.t5_setup(lr=1e-2).replace(loss_fn=no_source)


# ------------------------------------------------------------------ translation-like pairs of variable length
def pairs(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(source, target) token lists of 2..MAXLEN-2 tokens: the target is the source with every token mapped to the
    next one of the content vocabulary (3..VOCAB-1), so it is predictable from the source only."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(2, MAXLEN - 1, (1,), generator=g))
        src = torch.randint(3, VOCAB, (length,), generator=g)
        out.append((src.tolist(), ((src - 2) % (VOCAB - 3) + 3).tolist()))
    return out


def collate_seq2seq(batch: list) -> dict:
    """``DataCollatorForSeq2Seq``: sources padded with PAD (attention mask 0 there), labels with -100; EOS appended."""
    width = max(len(s) for s, _ in batch) + 1
    ids = torch.full((len(batch), width), PAD)
    labels = torch.full((len(batch), width), -100)
    for i, (s, t) in enumerate(batch):
        ids[i, :len(s) + 1] = torch.tensor([*s, EOS])
        labels[i, :len(t) + 1] = torch.tensor([*t, EOS])
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(), "labels": labels}


def bart_batches(n_batches: int = 3, batch: int = 16, seed: int = 0) -> list:
    data = pairs(n_batches * batch, seed)
    return [collate_seq2seq(data[i:i + batch]) for i in range(0, len(data), batch)]


def bart_model() -> nn.Module:
    """A randomly initialised BART of ~23k parameters (dropout 0.1, as the config's default)."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    return BartForConditionalGeneration(BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=16,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS, forced_eos_token_id=EOS))


def bart_setup(*, per_micro_mean: bool = False, k: int = 2) -> tropt.Setup:
    """transformers ``examples/pytorch/translation/run_translation_no_trainer.py``: ``model(**batch)`` on
    ``DataCollatorForSeq2Seq`` batches, AdamW, a linear schedule stepped per update; accumulation as accelerate's
    ``usage_guides/gradient_accumulation`` ("variable-size training samples") does it: the label tokens of the
    step's micro-batches (on every process) counted first, each micro-batch's summed token loss divided by that count.
    ``per_micro_mean`` plants the script's older form: ``outputs.loss`` (a per-micro-batch token mean) / K."""

    def step(ctx, micro_batches):
        model, opt = ctx.model, ctx.optimizer
        model.train()
        steps = len(micro_batches)
        num_items, scale = sum(int((mb["labels"] != -100).sum()) for mb in micro_batches), 1.0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # the guide's accelerator.gather(num_items).sum(): the step's token count over every process; DDP
            # averages the gradients over processes, so each loss is scaled by the world size
            count = torch.tensor(float(num_items))
            torch.distributed.all_reduce(count)
            num_items, scale = float(count), float(torch.distributed.get_world_size())
        for mb in micro_batches:
            out = model(**mb)
            if per_micro_mean:  # BUG: padded micro-batches weighted equally, whatever their token counts
                loss = out.loss / steps
            else:
                loss = F.cross_entropy(out.logits.reshape(-1, VOCAB), mb["labels"].reshape(-1), ignore_index=-100,
                                       reduction="sum") * scale / num_items
            loss.backward()
        opt.step()
        ctx.scheduler.step()
        opt.zero_grad()

    return tropt.Setup(bart_model(), fp.seq2seq_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=5e-3),
                       bart_batches(), val_data=bart_batches(1, seed=1),
                       scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: max(0.0, 1 - s / 500)),
                       step=step, accumulation_steps=k, num_classes=VOCAB,
                       metric=tropt.Metric(fp.eval_loss, higher_is_better=True, name="neg_eval_loss"))


# ------------------------------------------------------------------ PyTorch tutorial: nn.Transformer translation
class PositionalEncoding(nn.Module):
    def __init__(self, emb: int, dropout: float, maxlen: int = 64) -> None:
        super().__init__()
        den = torch.exp(-torch.arange(0, emb, 2) * math.log(10000) / emb)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        table = torch.zeros(maxlen, emb)
        table[:, 0::2], table[:, 1::2] = torch.sin(pos * den), torch.cos(pos * den)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("table", table.unsqueeze(-2))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.dropout(tokens + self.table[: tokens.size(0)])


class Seq2SeqTransformer(nn.Module):
    """Token embeddings scaled by sqrt(emb), sinusoidal positions, ``nn.Transformer`` (sequence first), a generator."""

    def __init__(self, emb: int = 32, nhead: int = 2, layers: int = 1, ff: int = 64, dropout: float = 0.1) -> None:
        super().__init__()
        self.transformer = nn.Transformer(d_model=emb, nhead=nhead, num_encoder_layers=layers,
                                          num_decoder_layers=layers, dim_feedforward=ff, dropout=dropout)
        self.src_tok, self.tgt_tok = nn.Embedding(VOCAB, emb), nn.Embedding(VOCAB, emb)
        self.positional = PositionalEncoding(emb, dropout)
        self.generator = nn.Linear(emb, VOCAB)
        self.emb = emb

    def forward(self, src, tgt, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, memory_key_padding_mask):
        src_emb = self.positional(self.src_tok(src) * math.sqrt(self.emb))
        tgt_emb = self.positional(self.tgt_tok(tgt) * math.sqrt(self.emb))
        outs = self.transformer(src_emb, tgt_emb, src_mask, tgt_mask, None, src_padding_mask, tgt_padding_mask,
                                memory_key_padding_mask)
        return self.generator(outs)


def create_mask(src: torch.Tensor, tgt: torch.Tensor) -> tuple:
    """The tutorial's masks: no source mask, a causal target mask, padding masks. All boolean (True: not attended):
    the tutorial's float -inf masks beside boolean padding masks mean the same, and newer torch warns on every call
    about the mix."""
    tgt_mask = torch.triu(torch.ones(tgt.size(0), tgt.size(0), dtype=torch.bool), diagonal=1)
    src_mask = torch.zeros((src.size(0), src.size(0)), dtype=torch.bool)
    return src_mask, tgt_mask, (src == PAD).transpose(0, 1), (tgt == PAD).transpose(0, 1)


def tutorial_batches(n_batches: int = 3, batch: int = 16, seed: int = 0) -> list:
    """The tutorial's ``collate_fn``: BOS + tokens + EOS, padded with PAD, stacked sequence first: (src (S, N),
    tgt (T, N))."""
    data = pairs(n_batches * batch, seed)
    out = []
    for i in range(0, len(data), batch):
        chunk = data[i:i + batch]
        pad = nn.utils.rnn.pad_sequence
        src = pad([torch.tensor([BOS, *s, EOS]) for s, _ in chunk], padding_value=PAD)
        tgt = pad([torch.tensor([BOS, *t, EOS]) for _, t in chunk], padding_value=PAD)
        out.append((src, tgt))
    return out


CRITERION = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)


def tutorial_loss(model: nn.Module, batch) -> torch.Tensor:
    """Teacher forcing: ``tgt[:-1]`` in, ``tgt[1:]`` the targets; padding ignored."""
    src, tgt = batch
    tgt_input = tgt[:-1, :]
    src_mask, tgt_mask, src_pad, tgt_pad = create_mask(src, tgt_input)
    logits = model(src, tgt_input, src_mask, tgt_mask, src_pad, tgt_pad, src_pad)
    return CRITERION(logits.reshape(-1, logits.shape[-1]), tgt[1:, :].reshape(-1))


def tutorial_setup(*, forget_zero_grad: bool = False) -> tropt.Setup:
    """pytorch/tutorials ``beginner_source/translation_transformer.py``: ``train_epoch``: ``model.train()``, per batch
    the masks from ``create_mask``, ``optimizer.zero_grad()``, the loss of ``tgt[1:]``, ``backward``,
    ``optimizer.step()``; ``Adam(lr=1e-4, betas=(0.9, 0.98), eps=1e-9)`` (a larger lr here: a tiny model, few
    steps); label smoothing 0.1 as in "Attention Is All You Need"."""

    def step(ctx, micro_batches):
        ctx.model.train()
        if not forget_zero_grad:  # BUG when forgotten: every step adds to the gradients of the steps before
            ctx.optimizer.zero_grad()
        for mb in micro_batches:
            loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
            loss.backward()
        ctx.optimizer.step()
        return loss.detach() * len(micro_batches)

    torch.manual_seed(0)
    model = Seq2SeqTransformer()
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return tropt.Setup(model, tutorial_loss,
                       lambda m: torch.optim.Adam(m.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9),
                       tutorial_batches(), val_data=tutorial_batches(1, seed=1), step=step, batch_dim=1,
                       num_classes=VOCAB)


# ------------------------------------------------------------------ fairseq: summed losses, gradients / sample_size
def smoothed_nll_sum(model: nn.Module, batch, eps: float = 0.1) -> tuple[torch.Tensor, int]:
    """fairseq's ``label_smoothed_cross_entropy`` criterion: the smoothed NLL summed over the non-padding target
    tokens, and the batch's ``sample_size`` (its token count)."""
    src, tgt = batch
    tgt_input = tgt[:-1, :]
    src_mask, tgt_mask, src_pad, tgt_pad = create_mask(src, tgt_input)
    lprobs = F.log_softmax(model(src, tgt_input, src_mask, tgt_mask, src_pad, tgt_pad, src_pad), -1)
    target = tgt[1:, :]
    keep = target != PAD
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.sum(-1)
    loss = (1.0 - eps - eps / (VOCAB - 1)) * nll + eps / (VOCAB - 1) * smooth
    return loss[keep].sum(), int(keep.sum())


def fairseq_loss(model: nn.Module, batch) -> torch.Tensor:
    """The criterion's loss per token (``loss / sample_size``), as fairseq logs it."""
    total, n = smoothed_nll_sum(model, batch)
    return total / n


def inverse_sqrt(opt: torch.optim.Optimizer, warmup: int = 4):
    """fairseq's ``inverse_sqrt`` schedule: linear warm-up over ``warmup`` updates, then ``sqrt(warmup / update)``."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda u: (u + 1) / warmup if u < warmup
                                             else math.sqrt(warmup / (u + 1)))


def fairseq_setup(*, per_micro_norm: bool = False, k: int = 2) -> tropt.Setup:
    """fairseq ``fairseq/trainer.py`` ``train_step`` with ``--update-freq`` (facebookresearch/fairseq): each
    micro-batch's criterion loss summed over tokens and backpropagated, the ``sample_size`` of the update summed
    (all-reduced across workers), then ``optimizer.multiply_grads(world_size / sample_size)``, ``clip_grad_norm``,
    ``optimizer.step()`` and ``lr_scheduler.step_update(num_updates)``; the ``label_smoothed_cross_entropy``
    criterion (eps 0.1), Adam(betas=(0.9, 0.98)) and the ``inverse_sqrt`` schedule of its translation recipes (the
    same recipe fine-tunes BART for summarisation). ``per_micro_norm`` plants a per-micro-batch normalisation."""

    def step(ctx, micro_batches):
        model, opt = ctx.model, ctx.optimizer
        model.train()
        opt.zero_grad()
        sample_size, world = 0.0, 1.0
        for i, mb in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
                loss, n = smoothed_nll_sum(model, mb)
                if per_micro_norm:  # BUG: every micro-batch normalised by its own token count, then averaged
                    loss = loss / n / len(micro_batches)
                loss.backward()  # under DDP: all-reduced on the last micro-batch only (maybe_no_sync)
            sample_size += n
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            count = torch.tensor(sample_size)
            torch.distributed.all_reduce(count)
            sample_size, world = float(count), float(torch.distributed.get_world_size())
        if not per_micro_norm:
            for p in model.parameters():  # optimizer.multiply_grads
                if p.grad is not None:
                    p.grad.mul_(world / sample_size)
        nn.utils.clip_grad_norm_(model.parameters(), ctx.grad_clip)
        opt.step()
        ctx.scheduler.step()  # step_update(num_updates)

    torch.manual_seed(0)
    return tropt.Setup(Seq2SeqTransformer(), fairseq_loss,
                       lambda m: torch.optim.Adam(m.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-8),
                       tutorial_batches(), val_data=tutorial_batches(1, seed=1), scheduler=inverse_sqrt, step=step,
                       accumulation_steps=k, grad_clip=1.0, batch_dim=1, num_classes=VOCAB)


TRANSLATION = "huggingface/transformers/examples/pytorch/translation/run_translation_no_trainer.py"

PORTS: list[Port] = [
    Port("t5_seq2seq_eval_loss", "seq2seq", "huggingface/transformers/examples/pytorch/translation/run_translation.py",
         t5_port, needs=("transformers",), notes={"dynamics.loss_curve": "a tiny model on 3 batches overfits them"},
         bugs=(
             Bug("t5_constant_source", "model.overfit_batch", ("ignores its input",), t5_no_source,
                 source="tests/model/test_overfit_batch.py"),
         )),
    Port("bart_translation_num_items", "seq2seq", TRANSLATION, bart_setup, needs=("transformers",), bugs=(
        Bug("bart_per_micro_batch_token_means", "loop.accumulation", ("average of per-micro-batch mean losses",),
            partial(bart_setup, per_micro_mean=True),
            source="huggingface.co/blog/gradient_accumulation; huggingface/accelerate docs/source/usage_guides/"
                   "gradient_accumulation.md (variable-size training samples)"),
    )),
    Port("nn_transformer_translation", "seq2seq", "pytorch/tutorials/beginner_source/translation_transformer.py",
         tutorial_setup, notes={
             "model.overfit_batch": "label smoothing 0.1 puts the floor above 0",
             "loop.accumulation": "latent (no accumulation): per-micro-batch token means over padded batches"},
         bugs=(
             Bug("nn_transformer_without_zero_grad", "loop.zero_grad", ("plus the gradient left over from step 1",),
                 partial(tutorial_setup, forget_zero_grad=True),
                 source="pytorch/tutorials/recipes_source/recipes/zeroing_out_gradients.py"),
         )),
    Port("fairseq_update_freq_sample_size", "seq2seq", "facebookresearch/fairseq/fairseq/trainer.py", fairseq_setup,
         notes={"model.overfit_batch": "label smoothing 0.1 puts the floor above 0"}, bugs=(
             Bug("fairseq_per_micro_batch_normalisation", "loop.accumulation",
                 ("average of per-micro-batch mean losses",), partial(fairseq_setup, per_micro_norm=True),
                 source="huggingface.co/blog/gradient_accumulation (the same per-micro-batch normalisation); "
                        "fairseq/trainer.py normalises once by the update's sample_size instead"),
         )),
]
