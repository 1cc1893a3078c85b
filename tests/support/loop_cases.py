"""Shared fixtures of the stage-4 tests: the Setups (an MLP, a token-level LM, a ReduceLROnPlateau loop, the loop.ddp
MLP), the planted bugs several check files use, and running every invariance check under the no-mutation helper."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import tropt
from support import ce_loss, make_classification
from tropt.loop import check_accumulation, check_loss_scaling, check_resume, check_scheduler_cadence, check_zero_grad
from tropt.testing import untouched

CHECKS = {
    "loop.zero_grad": check_zero_grad,
    "loop.accumulation": check_accumulation,
    "loop.loss_scaling": check_loss_scaling,
    "loop.scheduler_cadence": check_scheduler_cadence,
    "loop.resume": check_resume,
}


def mlp_setup(step=None, *, k=1, scheduler=True, clip=None, scaler=False, optimizer="adamw", dropout=0.0, **kw):
    """A 10-32-4 MLP on 4 batches of 24; ``dropout=None`` leaves the Dropout layer out (a plain Linear-ReLU-Linear)."""
    x, y = make_classification(n=96, d=10, classes=4, seed=1)
    batches = [(x[i:i + 24], y[i:i + 24]) for i in range(0, 96, 24)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), *([] if dropout is None else [nn.Dropout(dropout)]),
                          nn.Linear(32, 4))
    opt = {"adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
           "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)}[optimizer]
    return tropt.Setup(model, ce_loss, opt, batches, step=step, accumulation_steps=k,
                       scheduler=((lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)))
                                  if scheduler else None),
                       grad_clip=clip, use_scaler=scaler, precision="fp16" if scaler else "fp32", num_classes=4, **kw)


def run_all(setup):
    out = {}
    for cid, fn in CHECKS.items():
        with untouched(setup):  # the shared no-mutation helper, on every check
            out[cid] = fn(setup)
    return out


def statuses(results):
    return {cid: r.status for cid, r in results.items()}


def step_loss_not_divided(ctx, micro_batches):
    for mb in micro_batches:
        ctx.loss_fn(ctx.model, mb).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()
    if ctx.scheduler is not None:
        ctx.scheduler.step()


def step_scheduler_per_micro_batch(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        ctx.scheduler.step()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


class TinyLM(nn.Module):
    def __init__(self, vocab=20, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


def token_batches(n_batches=3, b=8, max_len=12, vocab=20):
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n_batches):
        lengths = torch.randint(2, max_len + 1, (b,), generator=g)
        ids = torch.randint(1, vocab, (b, max_len), generator=g)
        mask = torch.arange(max_len)[None, :] < lengths[:, None]
        out.append({"input_ids": ids * mask, "attention_mask": mask})
    return out


def token_losses(model, batch):
    logits = model(batch["input_ids"][:, :-1])
    target = batch["input_ids"][:, 1:]
    valid = batch["attention_mask"][:, 1:]
    per_token = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    return (per_token * valid).sum(), valid.sum()


def lm_loss(model, batch):
    total, count = token_losses(model, batch)
    return total / count


def step_per_micro_batch_token_mean(ctx, micro_batches):  # the bug
    for mb in micro_batches:
        total, count = token_losses(ctx.model, mb)
        (total / count / len(micro_batches)).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def step_global_token_mean(ctx, micro_batches):  # the fix
    n_tokens = sum(int(mb["attention_mask"][:, 1:].sum()) for mb in micro_batches)
    for mb in micro_batches:
        total, _ = token_losses(ctx.model, mb)
        (total / n_tokens).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def lm_setup(step):
    torch.manual_seed(0)
    return tropt.Setup(TinyLM(), lm_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), token_batches(),
                       step=step, accumulation_steps=4)


def ddp_setup(step=None, k=1, batchnorm=False):
    """The loop.ddp Setup: a 10-16-4 MLP (BatchNorm optional) on two batches of 32, SGD."""
    x, y = make_classification(n=64, d=10, classes=4, seed=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), *([nn.BatchNorm1d(16)] if batchnorm else []), nn.ReLU(), nn.Linear(16, 4))
    return tropt.Setup(model, ce_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                       [(x[:32], y[:32]), (x[32:], y[32:])],
                       step=step, accumulation_steps=k)


def step_dividing_by_world_size(ctx, micro_batches):
    world = dist.get_world_size() if dist.is_initialized() else 1
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / world).backward()  # DDP already averages: this halves the gradient
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def step_plateau(ctx, micro_batches):
    """A correct step for a metric-based scheduler: scheduler.step(loss) once per optimizer step."""
    total = 0.0
    for mb in micro_batches:
        loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
        loss.backward()
        total += loss.item()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()
    ctx.scheduler.step(total)


def plateau_setup(**kw):
    return mlp_setup(step_plateau, **kw).replace(
        scheduler=lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5))
