"""Small CPU ports of widely used public training loops, written for tropt's step contract (not copied).

Each ``*_setup`` function returns a healthy :class:`tropt.Setup`; keyword flags plant one documented bug. The loops
follow what their public originals do:

- ``nanogpt_setup``: a GPT training script that writes ``param_group["lr"] = get_lr(it)`` (linear warm-up, cosine
  decay) every iteration, divides each micro-step's loss by the number of micro-steps, clips to norm 1 and keeps
  its iteration counter on ``ctx.it``;
- ``manual_sgd_setup``: the PyTorch examples' regression loop: no optimizer, ``p.data.add_(p.grad, alpha=-lr)``;
- ``word_lm_setup``: the PyTorch examples' word-level LSTM language model: ``batchify`` to time-major
  ``(seq, batch)`` columns, flattened targets, a hidden state carried across batches on ``ctx.hidden`` and
  detached ("repackaged") every batch, clipping and a hand-written SGD update;
- ``accelerate_setup``: an accelerate ``no_trainer`` loop: ``with accelerator.accumulate(model):`` around every
  micro-batch, ``accelerator.backward``, a prepared optimizer that steps only on the synchronising micro-batch;
- ``native_scaler_setup``: an image-model library's ``train_one_epoch`` with its native scaler, a class owning its
  own ``torch.amp.GradScaler`` whose ``__call__`` does scale -> backward -> unscale -> clip -> step -> update;
- ``lbfgs_setup``: the PyTorch examples' time-sequence prediction: two ``LSTMCell`` layers predicting the next value
  of sine waves, one full batch, ``optimizer.step(closure)`` with LBFGS (the closure zeroes, computes the loss,
  backpropagates and returns it; LBFGS evaluates it several times per step);
- ``sam_setup``: sharpness-aware minimisation as its popular wrapper optimizer does it: ``first_step`` climbs to
  ``w + e(w)`` and zeroes the gradients, a second forward/backward, ``second_step`` returns to ``w`` and calls
  ``base_optimizer.step()`` (the wrapper's own ``step`` is never called); its ``state_dict`` leaves out the base
  optimizer's momentum (davda54/sam#73), so a healthy loop checkpoints that too;
- ``hf_setup``: the Hugging Face Trainer's accumulation: losses summed over tokens and divided by the step's
  ``num_items_in_batch`` (newer versions), or each micro-batch's token mean divided by the accumulation steps
  (older versions, the 2024 bug).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

import tropt

# ------------------------------------------------------------------ a tiny causal token model (GPT / HF ports)
VOCAB, SEQ = 16, 8


class TinyLM(nn.Module):
    """Embedding + learned positions + MLP + head: logits (batch, seq, vocab)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 32)
        self.pos = nn.Parameter(torch.zeros(SEQ, 32))
        self.fc = nn.Linear(32, 32)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx) + self.pos[: idx.size(1)]
        return self.head(F.gelu(self.fc(h)))


def token_batches(n_batches: int = 3, batch: int = 16, seed: int = 0) -> list:
    """(x, y) pairs where y is x shifted by one in a learnable cyclic pattern."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
        out.append((x, (x + 1) % VOCAB))
    return out


def lm_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


# ------------------------------------------------------------------ nanoGPT-style: LR set by hand every iteration
WARMUP, DECAY, PEAK, FLOOR = 2, 12, 1e-2, 1e-3


def get_lr(it: int) -> float:
    """Linear warm-up then cosine decay to a floor."""
    if it < WARMUP:
        return PEAK * (it + 1) / (WARMUP + 1)
    if it > DECAY:
        return FLOOR
    ratio = (it - WARMUP) / (DECAY - WARMUP)
    return FLOOR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (PEAK - FLOOR)


def nanogpt_setup(*, lr_per_micro: bool = False, divide: bool = True, zero_inside: bool = False,
                  double_step: bool = False, clip: float | None = 1.0, k: int = 4) -> tropt.Setup:
    def step(ctx, micro_batches):
        if not hasattr(ctx, "it"):
            ctx.it = 0
        if not hasattr(ctx, "grad_scaler"):  # the script builds GradScaler(enabled=dtype == float16): off in fp32
            ctx.grad_scaler = torch.amp.GradScaler("cpu", enabled=False)
        scaler, opt = ctx.grad_scaler, ctx.optimizer
        for g in opt.param_groups:
            g["lr"] = get_lr(ctx.it)
        steps = len(micro_batches)
        for i, mb in enumerate(micro_batches):
            if hasattr(ctx.model, "require_backward_grad_sync"):  # under DDP: all-reduce on the last micro-step only
                ctx.model.require_backward_grad_sync = i == steps - 1
            if zero_inside:  # BUG: clears the earlier micro-steps' gradients
                opt.zero_grad(set_to_none=True)
            with ctx.autocast():
                loss = ctx.loss_fn(ctx.model, mb)
                if divide:  # BUG when missing: K micro-steps sum to K x the gradient
                    loss = loss / steps
            scaler.scale(loss).backward()
            if lr_per_micro:  # BUG: the counter that sets the LR advances per micro-step
                ctx.it += 1
                for g in opt.param_groups:
                    g["lr"] = get_lr(ctx.it)
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), clip)
        scaler.step(opt)
        if double_step:  # BUG: a second update per call
            opt.step()
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if not lr_per_micro:
            ctx.it += 1
        return loss.detach() * (steps if divide else 1)

    torch.manual_seed(0)
    return tropt.Setup(TinyLM(), lm_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=PEAK, weight_decay=0.1),
                       token_batches(), step=step, accumulation_steps=k, grad_clip=clip, num_classes=VOCAB)


# ------------------------------------------------------------------ PyTorch examples regression: SGD by hand
LR_SGD = 0.1


def poly_batches(n_batches: int = 3, batch: int = 32, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    w, b = torch.tensor([[0.5], [-1.0], [0.3], [0.8]]), torch.tensor([0.2])
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, generator=g).unsqueeze(1)
        feats = torch.cat([x ** i for i in range(1, 5)], 1)
        out.append((feats, feats @ w + b))
    return out


def smooth_l1(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.smooth_l1_loss(model(x), y)


def manual_sgd_setup(*, forget_zero_grad: bool = False, k: int = 1) -> tropt.Setup:
    def step(ctx, micro_batches):
        model = ctx.model
        if not forget_zero_grad:
            model.zero_grad()
        sizes = [ctx.batch_size(mb) for mb in micro_batches]
        total = sum(sizes)
        for mb, n in zip(micro_batches, sizes):
            (ctx.loss_fn(model, mb) * (n / total)).backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR_SGD)

    torch.manual_seed(0)
    return tropt.Setup(nn.Linear(4, 1), smooth_l1, None, poly_batches(), step=step, accumulation_steps=k)


# ------------------------------------------------------------------ PyTorch examples word-level LSTM language model
WORDS, BPTT, COLUMNS = 20, 6, 8


class RNNModel(nn.Module):
    """Encoder -> LSTM -> decoder; input (seq, batch), output (seq * batch, vocab) as the example returns."""

    def __init__(self, ninp: int = 16, nhid: int = 24, nlayers: int = 2, dropout: float = 0.2) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(WORDS, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, WORDS)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, data: torch.Tensor, hidden: tuple) -> tuple:
        emb = self.drop(self.encoder(data))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)).view(-1, WORDS), hidden

    def init_hidden(self, bsz: int) -> tuple:
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(stream: torch.Tensor, bsz: int) -> torch.Tensor:
    """Cut a token stream into ``bsz`` columns: (rows, bsz), each column a contiguous piece of the text."""
    rows = stream.size(0) // bsz
    return stream[: rows * bsz].view(bsz, -1).t().contiguous()


def word_batches(n_batches: int = 3, seed: int = 0) -> list:
    """(data (BPTT, COLUMNS), target (BPTT * COLUMNS,)) pairs cut from a batchified stream, as get_batch does."""
    g = torch.Generator().manual_seed(seed)
    # A text with structure: each word is mostly followed by the next one in a fixed cycle.
    words = [int(torch.randint(0, WORDS, (1,), generator=g))]
    for _ in range(COLUMNS * (n_batches * BPTT + 1) - 1):
        jump = torch.rand((), generator=g) < 0.1
        words.append(int(torch.randint(0, WORDS, (1,), generator=g)) if jump else (words[-1] + 3) % WORDS)
    source = batchify(torch.tensor(words), COLUMNS)
    out = []
    for i in range(0, n_batches * BPTT, BPTT):
        out.append((source[i:i + BPTT], source[i + 1:i + 1 + BPTT].reshape(-1)))
    return out


def word_lm_loss(model: nn.Module, batch) -> torch.Tensor:
    data, targets = batch
    net = getattr(model, "module", model)  # under DDP the step's model is wrapped
    output, _ = model(data, net.init_hidden(data.size(1)))
    return F.nll_loss(F.log_softmax(output, -1), targets)


def repackage_hidden(h):
    """Detach the hidden state from the graph of the previous batch (truncated backpropagation through time)."""
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


LR_WORD, CLIP_WORD = 2.0, 0.25


def word_lm_setup(*, layout: str = "batch_dim", k: int = 1) -> tropt.Setup:
    def step(ctx, micro_batches):
        model = ctx.model
        net = getattr(model, "module", model)
        model.train()
        sizes = [ctx.batch_size(mb) for mb in micro_batches]
        total = sum(sizes)
        hidden = getattr(ctx, "hidden", None)
        if hidden is None or hidden[0].size(1) != total:  # a new run (or a new batch width) starts from zeros
            hidden = net.init_hidden(total)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        carried, start = [], 0
        for (data, targets), n in zip(micro_batches, sizes):
            part = tuple(h[:, start:start + n] for h in hidden)  # this micro-batch's columns of the state
            output, part = model(data, part)
            loss = F.nll_loss(F.log_softmax(output, -1), targets) * (n / total)
            loss.backward()
            carried.append(part)
            start += n
        ctx.hidden = tuple(torch.cat([c[i] for c in carried], dim=1) for i in range(2))
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_WORD)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR_WORD)

    extra = {"batch_dim": 1} if layout == "batch_dim" else {"split_fn": split_time_major,  # batches cut in K columns
                                                            "size_fn": lambda b: b[0].size(1), "accumulation": "split"}
    torch.manual_seed(0)
    return tropt.Setup(RNNModel(), word_lm_loss, None, word_batches(), step=step, accumulation_steps=k,
                       grad_clip=CLIP_WORD, num_classes=WORDS, **extra)


def split_time_major(batch, sizes):
    """split_fn for (data (seq, batch), target (seq * batch,)): columns of data, the matching target entries."""
    data, target = batch
    seq, width = data.shape
    grid = target.view(seq, width)
    out, start = [], 0
    for n in sizes:
        out.append((data[:, start:start + n], grid[:, start:start + n].reshape(-1)))
        start += n
    return out


# ------------------------------------------------------------------ accelerate no_trainer loop
def accelerate_setup(*, k: int = 4) -> tropt.Setup:
    from accelerate import Accelerator

    def step(ctx, micro_batches):
        if not hasattr(ctx, "accelerator"):  # kept on ctx; tropt tells it each call's number of micro-batches
            ctx.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=k)  # the script's own setting
            ctx.prepared = ctx.accelerator.prepare_optimizer(ctx.optimizer)
            ctx.prepared_scheduler = ctx.accelerator.prepare_scheduler(ctx.scheduler)
        acc, opt, sched = ctx.accelerator, ctx.prepared, ctx.prepared_scheduler
        for mb in micro_batches:
            with acc.accumulate(ctx.model):
                loss = ctx.loss_fn(ctx.model, mb)
                acc.backward(loss)  # divides by gradient_accumulation_steps
                if acc.sync_gradients and ctx.grad_clip is not None:
                    acc.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)
                opt.step()  # both step only on the synchronising micro-batch
                sched.step()
                opt.zero_grad()

    torch.manual_seed(0)
    return tropt.Setup(TinyLM(), lm_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), token_batches(),
                       scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 3)),
                       step=step, accumulation_steps=k, num_classes=VOCAB)


# ------------------------------------------------------------------ native-scaler wrapper (train_one_epoch style)
class NativeScalerLike:
    """Owns its GradScaler; one call scales, backpropagates and, on an update, unscales, clips, steps, updates."""

    def __init__(self, clip_before_unscale: bool = False) -> None:
        self._scaler = torch.amp.GradScaler("cpu")
        self.clip_before_unscale = clip_before_unscale

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, need_update=True) -> None:
        self._scaler.scale(loss).backward()
        if not need_update:
            return
        if clip_grad is not None:
            params = list(parameters)
            if self.clip_before_unscale:  # BUG: clips the still-scaled gradients
                torch.nn.utils.clip_grad_norm_(params, clip_grad)
                self._scaler.unscale_(optimizer)
            else:
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()

    def state_dict(self) -> dict:
        return self._scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._scaler.load_state_dict(state)


def native_scaler_setup(*, clip_before_unscale: bool = False, precision: str = "fp16", k: int = 2) -> tropt.Setup:
    def step(ctx, micro_batches):
        if not hasattr(ctx, "loss_scaler"):
            ctx.loss_scaler = NativeScalerLike(clip_before_unscale)
        steps = len(micro_batches)
        for i, mb in enumerate(micro_batches):
            with ctx.autocast():
                loss = ctx.loss_fn(ctx.model, mb)
            ctx.loss_scaler(loss / steps, ctx.optimizer, clip_grad=ctx.grad_clip, parameters=ctx.model.parameters(),
                            need_update=i == steps - 1)
        ctx.optimizer.zero_grad()
        if ctx.scheduler is not None:
            ctx.scheduler.step()

    x = torch.randn(96, 12, generator=torch.Generator().manual_seed(3))
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4] > 0).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 4))
    return tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                       [(x[i:i + 32], y[i:i + 32]) for i in range(0, 96, 32)], step=step, accumulation_steps=k,
                       grad_clip=1.0, precision=precision, num_classes=4)


# ------------------------------------------------------------------ Hugging Face Trainer accumulation
def padded_batches(n_batches: int = 3, batch: int = 16, seed: int = 0) -> list:
    """{"input_ids", "labels"} with -100 past each sequence's own length (1 to SEQ tokens)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
        lengths = torch.randint(1, SEQ + 1, (batch,), generator=g)
        labels = (x + 1) % VOCAB
        labels[torch.arange(SEQ)[None, :] >= lengths[:, None]] = -100
        out.append({"input_ids": x, "labels": labels})
    return out


def hf_loss(model: nn.Module, batch) -> torch.Tensor:
    """The model's own loss: mean over the batch's non-padding tokens."""
    return F.cross_entropy(model(batch["input_ids"]).reshape(-1, VOCAB), batch["labels"].reshape(-1), ignore_index=-100)


def hf_setup(*, per_micro_mean: bool = False, clip: float | None = 1.0, k: int = 4) -> tropt.Setup:
    def step(ctx, micro_batches):
        steps = len(micro_batches)
        num_items = sum(int((mb["labels"] != -100).sum()) for mb in micro_batches)  # num_items_in_batch
        scale = 1.0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # average_tokens_across_devices: the item count of the whole step over all processes; DDP averages
            # the gradients over processes, so each process scales its loss by the world size.
            count = torch.tensor(float(num_items))
            torch.distributed.all_reduce(count)
            num_items, scale = float(count), float(torch.distributed.get_world_size())
        for mb in micro_batches:
            logits = ctx.model(mb["input_ids"]).reshape(-1, VOCAB)
            if per_micro_mean:  # the older Trainer: each micro-batch's token mean, divided by the accumulation steps
                loss = F.cross_entropy(logits, mb["labels"].reshape(-1), ignore_index=-100) / steps
            else:
                loss = F.cross_entropy(logits, mb["labels"].reshape(-1), ignore_index=-100,
                                       reduction="sum") * scale / num_items
            loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), clip)
        ctx.optimizer.step()
        ctx.scheduler.step()
        ctx.optimizer.zero_grad()

    torch.manual_seed(0)
    return tropt.Setup(TinyLM(), hf_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), padded_batches(),
                       scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 3)),
                       step=step, accumulation_steps=k, grad_clip=clip, num_classes=VOCAB)


# ------------------------------------------------------------------ PyTorch examples time-sequence prediction: LBFGS
class SineLSTM(nn.Module):
    """Two LSTMCells unrolled over the sequence, a linear read-out per step: (batch, T) -> (batch, T)."""

    def __init__(self, hidden: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1, self.lstm2 = nn.LSTMCell(1, hidden), nn.LSTMCell(hidden, hidden)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.linear = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1 = c1 = h2 = c2 = torch.zeros(x.size(0), self.hidden, dtype=x.dtype)
        out = []
        for t in range(x.size(1)):
            h1, c1 = self.lstm1(x[:, t:t + 1], (h1, c1))
            h2, c2 = self.lstm2(self.drop(h1), (h2, c2))
            out.append(self.linear(h2))
        return torch.cat(out, dim=1)


def sine_batch(n: int = 32, length: int = 20, seed: int = 0) -> tuple:
    """Sine waves with random phase shifts: inputs and the next value at every step."""
    g = torch.Generator().manual_seed(seed)
    shift = torch.randint(-40, 40, (n, 1), generator=g)
    waves = torch.sin((torch.arange(length) + shift).float() / 6.0)
    return waves[:, :-1], waves[:, 1:]


def sine_mse(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def lbfgs_setup(*, forget_zero_grad: bool = False, dropout: float = 0.0) -> tropt.Setup:
    """Full-batch LBFGS with a closure (strong-Wolfe line search, as is common; without it, lr=0.8 on this data
    diverges after ~300 steps, which tropt's loss-curve check rightly reports)."""

    def step(ctx, micro_batches):
        batch = micro_batches[0]  # a loop that never accumulates

        def closure():
            if not forget_zero_grad:
                ctx.optimizer.zero_grad()
            loss = ctx.loss_fn(ctx.model, batch)
            loss.backward()
            return loss

        return ctx.optimizer.step(closure)

    torch.manual_seed(0)
    return tropt.Setup(SineLSTM(dropout=dropout), sine_mse,
                       optimizer=lambda m: torch.optim.LBFGS(m.parameters(), lr=1.0, max_iter=3,
                                                             line_search_fn="strong_wolfe"),
                       train_data=[sine_batch()], val_data=[sine_batch(seed=1)], step=step)


# ------------------------------------------------------------------ SAM: a wrapper optimizer with two passes per update
class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimisation around a base optimizer that shares its param groups."""

    def __init__(self, params, base_optimizer, rho: float = 0.05, **kwargs) -> None:
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        norm = torch.norm(torch.stack([p.grad.norm() for g in self.param_groups for p in g["params"]
                                       if p.grad is not None]))
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["e_w"] = e_w = p.grad * (group["rho"] / (norm + 1e-12))
                    p.add_(e_w)
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(self.state[p]["e_w"])
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()

    def step(self, closure=None):
        raise NotImplementedError("call first_step and second_step")

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self.base_optimizer.param_groups = self.param_groups


def digit_batches(n: int = 8, batch: int = 64) -> list:
    """scikit-learn's digits (shipped): 8x8 images scaled to [0, 1], as (x, y) batches."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, n * batch, batch)]


def digits_ce(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def sam_setup(*, checkpoint_base: bool = True) -> tropt.Setup:
    def step(ctx, micro_batches):
        k = len(micro_batches)
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / k).backward()
        ctx.optimizer.first_step(zero_grad=True)
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / k).backward()
        ctx.optimizer.second_step(zero_grad=True)

    def save(ctx):
        state = {"model": ctx.model.state_dict(), "optimizer": ctx.optimizer.state_dict(), "rng": torch.get_rng_state()}
        if checkpoint_base:
            state["base"] = ctx.optimizer.base_optimizer.state_dict()
        return state

    def load(ctx, state):
        ctx.model.load_state_dict(state["model"])
        ctx.optimizer.load_state_dict(state["optimizer"])
        if checkpoint_base:
            ctx.optimizer.base_optimizer.load_state_dict(state["base"])
        torch.set_rng_state(state["rng"])

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))
    batches = digit_batches(10)
    return tropt.Setup(model, digits_ce, optimizer=lambda m: SAM(m.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9),
                       train_data=batches[:8], val_data=batches[8:], step=step, save_state=save, load_state=load,
                       num_classes=10)
