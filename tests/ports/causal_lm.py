"""Causal language model ports (issue 28): learning rates set by hand, accumulation by token counts or by
accelerate, optimizers without a float learning rate, a GPT-2 from transformers. Paraphrased from their upstreams
(named in each builder), never copied.

The ports already in ``support`` (nanoGPT, the Hugging Face Trainer's accumulation, an accelerate ``no_trainer``
loop, Adafactor with ``lr=None``) are wrapped here as they are, with the bugs ``tests/loop/test_real_loops.py`` and
the model tests plant in them (the same cause texts those tests assert). The new ones:

- ``gpt2_run_clm_no_trainer``: a randomly initialised tiny ``GPT2LMHeadModel`` trained as transformers'
  ``run_clm_no_trainer.py`` does: grouped blocks with ``labels = input_ids`` (the model shifts them), AdamW with no
  weight decay on biases and LayerNorm weights, a linear warm-up schedule from ``get_scheduler``, and
  ``with accelerator.accumulate(model)`` around ``outputs.loss`` -> ``accelerator.backward`` -> step -> schedule ->
  zero_grad;
- ``mingpt_trainer``: karpathy/minGPT's ``Trainer.run`` on its GPT (one block here): ``configure_optimizers``'s
  decay / no-decay groups with ``pos_emb`` special-cased, ``model.zero_grad(set_to_none=True)``, clipping to 1.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from support import family_ports as fp
from support import real_loops as rl
from torch.nn import functional as F

import tropt
from ports import Bug, Port

TRL = "tests/loop/test_real_loops.py"
CLM = "huggingface/transformers/examples/pytorch/language-modeling/run_clm_no_trainer.py"


# ------------------------------------------------------------------ the support ports, with what they follow
def nanogpt_port() -> tropt.Setup:
    """karpathy/nanoGPT ``train.py``: ``param_group["lr"] = get_lr(iter_num)`` (warm-up, cosine) every iteration,
    each micro-step's loss divided by the accumulation steps, a disabled GradScaler in fp32, clipping to 1 after
    ``unscale_``, the iteration counter on ``ctx.it`` (``support.real_loops.nanogpt_setup``)."""
    return rl.nanogpt_setup()


def hf_trainer_port() -> tropt.Setup:
    """transformers ``Trainer`` accumulation (src/transformers/trainer.py, newer versions): token losses summed and
    divided by the step's ``num_items_in_batch``, clipping, a warm-up schedule (``support.real_loops.hf_setup``)."""
    return rl.hf_setup()


def accelerate_port() -> tropt.Setup:
    """An accelerate ``no_trainer`` loop (huggingface/accelerate examples/by_feature/gradient_accumulation.py):
    ``with accelerator.accumulate(model)`` around every micro-batch, ``accelerator.backward``, a prepared optimizer
    and scheduler that step on the synchronising micro-batch only (``support.real_loops.accelerate_setup``)."""
    return rl.accelerate_setup()


def adafactor_port() -> tropt.Setup:
    """transformers' ``Adafactor(scale_parameter=True, relative_step=True, warmup_init=True, lr=None)``
    (src/transformers/optimization.py), the optimizer the docs recommend for T5: no float learning rate in its
    param groups (``support.family_ports.adafactor_setup``)."""
    return fp.adafactor_setup()


def forgets_ctx_it() -> tropt.Setup:
    """tests/loop/test_step_contract.py: a user checkpoint of model and optimizer only, the counter on ctx left out."""
    def save(ctx):
        return {"model": ctx.model.state_dict(), "optimizer": ctx.optimizer.state_dict()}

    def load(ctx, state):
        ctx.model.load_state_dict(state["model"])
        ctx.optimizer.load_state_dict(state["optimizer"])

    return rl.nanogpt_setup().replace(save_state=save, load_state=load)


def adafactor_lr_0() -> tropt.Setup:
    """tests/model/test_gradient_flow.py: one group at a known learning rate of 0 next to Adafactor's lr=None."""
    from transformers.optimization import Adafactor

    def opt(m):
        return Adafactor([{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": 0.0,
                                                          "relative_step": False}],
                         lr=None, relative_step=True, warmup_init=True, scale_parameter=True)

    return fp.adafactor_setup().replace(optimizer=opt)


# ------------------------------------------------------------------ GPT-2 as run_clm_no_trainer.py trains it
VOCAB, BLOCK = 16, 8


def gpt2_model() -> torch.nn.Module:
    """A randomly initialised GPT-2 of ~26k parameters (the config's dropouts left at GPT-2's 0.1)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=BLOCK, n_embd=32, n_layer=1, n_head=2,
                                      bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1))


def grouped_blocks(n_batches: int = 3, batch: int = 16, seed: int = 0) -> list:
    """``group_texts``: a token stream cut into blocks of ``BLOCK``, ``labels`` a copy of ``input_ids``; the stream
    mostly walks +1 through the vocabulary (a learnable next token), with random jumps."""
    g = torch.Generator().manual_seed(seed)
    n = n_batches * batch * BLOCK
    jumps = torch.rand(n, generator=g) < 0.1
    stream = torch.empty(n, dtype=torch.long)
    stream[0] = 0
    for i in range(1, n):
        stream[i] = int(torch.randint(0, VOCAB, (1,), generator=g)) if jumps[i] else (stream[i - 1] + 1) % VOCAB
    blocks = stream.view(-1, BLOCK)
    return [{"input_ids": b, "attention_mask": torch.ones_like(b), "labels": b.clone()}
            for b in blocks.split(batch)]


def clm_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """``model(**batch).loss``: the model shifts ``labels`` against its logits."""
    return model(**batch).loss


def grouped_adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The script's two groups: weight decay on everything but biases and LayerNorm weights."""
    no_decay = ("bias", "ln_")
    decay = [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)]
    rest = [p for n, p in model.named_parameters() if any(k in n for k in no_decay)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                             lr=5e-3)


def linear_warmup(opt: torch.optim.Optimizer):
    from transformers import get_scheduler

    return get_scheduler("linear", optimizer=opt, num_warmup_steps=2, num_training_steps=200)


def gpt2_setup(*, prepare_scheduler: bool = True, k: int = 2) -> tropt.Setup:
    """transformers ``examples/pytorch/language-modeling/run_clm_no_trainer.py``: ``model.train()``; per batch
    ``with accelerator.accumulate(model):`` ``loss = model(**batch).loss``, ``accelerator.backward(loss)``,
    ``optimizer.step()``, ``lr_scheduler.step()``, ``optimizer.zero_grad()`` (the prepared optimizer and scheduler
    act on the synchronising micro-batch only). ``prepare_scheduler=False`` plants a documented misuse: the
    scheduler left out of ``accelerator.prepare`` steps on every micro-batch."""
    from accelerate import Accelerator

    def step(ctx, micro_batches):
        if not hasattr(ctx, "accelerator"):
            ctx.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=k)
            ctx.prepared = ctx.accelerator.prepare_optimizer(ctx.optimizer)
            # BUG when not prepared: the bare scheduler steps per micro-batch, not per optimizer update
            ctx.prepared_scheduler = ctx.accelerator.prepare_scheduler(ctx.scheduler) if prepare_scheduler \
                else ctx.scheduler
        acc, opt, sched = ctx.accelerator, ctx.prepared, ctx.prepared_scheduler
        ctx.model.train()
        for mb in micro_batches:
            with acc.accumulate(ctx.model):
                acc.backward(ctx.loss_fn(ctx.model, mb))
                opt.step()
                sched.step()
                opt.zero_grad()

    return tropt.Setup(gpt2_model(), clm_loss, grouped_adamw, grouped_blocks(), val_data=grouped_blocks(1, seed=1),
                       scheduler=linear_warmup, step=step, accumulation_steps=k, num_classes=VOCAB)


# ------------------------------------------------------------------ minGPT: its Trainer and configure_optimizers
class CausalSelfAttention(torch.nn.Module):
    """minGPT's attention: one linear for q, k, v, an explicit causal softmax, dropout modules."""

    def __init__(self, n_embd: int = 32, n_head: int = 2, pdrop: float = 0.1) -> None:
        super().__init__()
        self.c_attn, self.c_proj = torch.nn.Linear(n_embd, 3 * n_embd), torch.nn.Linear(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout = torch.nn.Dropout(pdrop), torch.nn.Dropout(pdrop)
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))
        self.n_head = n_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in self.c_attn(x).split(c, 2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = self.attn_dropout(torch.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), -1))
        return self.resid_dropout(self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c)))


class MinGPT(torch.nn.Module):
    """minGPT's GPT with one block: token embedding, a learned ``pos_emb`` parameter, pre-norm attention and MLP, a
    final LayerNorm and a bias-free head; ``forward(idx, targets)`` returns ``(logits, loss)``."""

    def __init__(self, n_embd: int = 32, pdrop: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok_emb = torch.nn.Embedding(VOCAB, n_embd)
        self.pos_emb = torch.nn.Parameter(torch.zeros(1, BLOCK, n_embd))
        self.drop = torch.nn.Dropout(pdrop)
        self.ln1, self.ln2, self.ln_f = (torch.nn.LayerNorm(n_embd) for _ in range(3))
        self.attn = CausalSelfAttention(n_embd, pdrop=pdrop)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(n_embd, 4 * n_embd), torch.nn.GELU(),
                                       torch.nn.Linear(4 * n_embd, n_embd), torch.nn.Dropout(pdrop))
        self.head = torch.nn.Linear(n_embd, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple:
        x = self.drop(self.tok_emb(idx) + self.pos_emb[:, : idx.size(1)])
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=-1)
        return logits, loss


def configure_optimizers(model: torch.nn.Module, *, forget_pos_emb: bool = False) -> torch.optim.Optimizer:
    """minGPT's ``configure_optimizers``: weight decay on Linear weights only; biases, LayerNorm and Embedding
    weights, and the special-cased ``pos_emb``, in the no-decay group. ``forget_pos_emb`` drops the special case
    (and the assertion that every parameter landed in a group): ``pos_emb`` then trains in no group."""
    decay, no_decay = set(), set()
    for mn, m in model.named_modules():
        for pn, _ in m.named_parameters(recurse=False):
            fpn = f"{mn}.{pn}" if mn else pn
            if pn.endswith("bias") or isinstance(m, (torch.nn.LayerNorm, torch.nn.Embedding)):
                no_decay.add(fpn)
            elif pn.endswith("weight") and isinstance(m, torch.nn.Linear):
                decay.add(fpn)
    if not forget_pos_emb:
        no_decay.add("pos_emb")
    params = dict(model.named_parameters())
    return torch.optim.AdamW([{"params": [params[n] for n in sorted(decay)], "weight_decay": 0.1},
                              {"params": [params[n] for n in sorted(no_decay)], "weight_decay": 0.0}],
                             lr=5e-3, betas=(0.9, 0.95))


def mingpt_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return model(x, y)[1]


def mingpt_setup(*, forget_pos_emb: bool = False) -> tropt.Setup:
    """karpathy/minGPT ``mingpt/trainer.py`` ``Trainer.run``: ``model.train()``; per batch ``logits, loss =
    model(x, y)``, ``model.zero_grad(set_to_none=True)``, ``loss.backward()``, ``clip_grad_norm_(...,
    grad_norm_clip=1.0)``, ``optimizer.step()``; the optimizer from ``mingpt/model.py`` ``configure_optimizers``."""

    def step(ctx, micro_batches):
        model = ctx.model
        model.train()
        model.zero_grad(set_to_none=True)
        for mb in micro_batches:
            loss = ctx.loss_fn(model, mb) / len(micro_batches)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), ctx.grad_clip)
        ctx.optimizer.step()
        return loss.detach() * len(micro_batches)

    def xy(b: dict) -> tuple:  # CharDataset: x = chunk[:-1], y = chunk[1:]
        return b["input_ids"][:, :-1].contiguous(), b["input_ids"][:, 1:].contiguous()

    blocks, val = [xy(b) for b in grouped_blocks()], [xy(b) for b in grouped_blocks(1, seed=1)]
    return tropt.Setup(MinGPT(), mingpt_loss, partial(configure_optimizers, forget_pos_emb=forget_pos_emb), blocks,
                       val_data=val, step=step, grad_clip=1.0, num_classes=VOCAB)


# ------------------------------------------------------------------ the corpus
def _nanogpt(**kw):
    return rl.nanogpt_setup(**kw)


def _hf(**kw):
    return rl.hf_setup(**kw)


PORTS: list[Port] = [
    Port("nanogpt_hand_set_lr", "causal_lm", "karpathy/nanoGPT/train.py", nanogpt_port, bugs=(
        Bug("nanogpt_lr_counter_per_micro_batch", "loop.scheduler_cadence",
            ("advances per micro-batch", '"per_micro_batch_confirmed": true'),
            partial(_nanogpt, lr_per_micro=True), source=TRL),
        *(Bug(f"nanogpt_no_division_by_k_clip_{c}", "loop.accumulation",
              ("4× the full-batch one: micro-batch losses are summed",), partial(_nanogpt, divide=False, clip=c),
              source=f"{TRL}; karpathy/nanoGPT/train.py: `loss = loss / gradient_accumulation_steps`, dropped")
          for c in (None, 1.0)),
        *(Bug(f"nanogpt_zero_grad_inside_micro_loop_clip_{c}", "loop.accumulation", ("only the last micro-batch",),
              partial(_nanogpt, zero_inside=True, clip=c), source=TRL) for c in (None, 1.0, 0.1)),
        *(Bug(f"nanogpt_double_optimizer_step_k{k}", "loop.accumulation", ("2 times",),
              partial(_nanogpt, double_step=True, k=k), source=TRL) for k in (4, 1)),
        Bug("nanogpt_checkpoint_forgets_ctx_it", "loop.resume", ("step attributes",), forgets_ctx_it,
            source="tests/loop/test_step_contract.py"),
    )),
    Port("hf_trainer_num_items", "causal_lm", "huggingface/transformers/src/transformers/trainer.py",
         hf_trainer_port, bugs=tuple(
             Bug(f"hf_per_micro_batch_token_mean_clip_{c}", "loop.accumulation",
                 ("average of per-micro-batch mean losses",), partial(_hf, per_micro_mean=True, clip=c),
                 source=f"{TRL}; the Trainer before its 2024 fix (huggingface.co/blog/gradient_accumulation)")
             for c in (None, 1.0, 0.1))),
    Port("accelerate_accumulate", "causal_lm",
         "huggingface/accelerate/examples/by_feature/gradient_accumulation.py", accelerate_port,
         needs=("accelerate",)),
    Port("adafactor_lr_none", "causal_lm", "huggingface/transformers/src/transformers/optimization.py",
         adafactor_port, needs=("transformers",),
         notes={"model.overfit_batch": "warmup_init: the relative step starts at 1e-6",
                "dynamics.loss_curve": "flat while Adafactor's step size is still warming up"}, bugs=(
             # the test asserts "learning rate 0" and that the problems are exactly 2.weight and 2.bias
             Bug("adafactor_group_at_lr_0", "model.gradient_flow", ("learning rate 0: 2.weight, 2.bias",),
                 adafactor_lr_0, source="tests/model/test_gradient_flow.py"),
         )),
    Port("gpt2_run_clm_no_trainer", "causal_lm", CLM, gpt2_setup, needs=("transformers", "accelerate"),
         notes={"dynamics.loss_curve": "a tiny model on 3 batches overfits them"}, bugs=(
        Bug("gpt2_scheduler_not_prepared", "loop.scheduler_cadence", ("the scheduler is stepped per micro-batch",),
            partial(gpt2_setup, prepare_scheduler=False),
            source="huggingface/accelerate docs/source/usage_guides/gradient_accumulation.md: the prepared "
                   "scheduler steps only when the optimizer did"),
    )),
    Port("mingpt_trainer", "causal_lm", "karpathy/minGPT/mingpt/trainer.py", mingpt_setup,
         notes={"dynamics.loss_curve": "a tiny model on 3 batches overfits them"}, bugs=(
        Bug("mingpt_pos_emb_in_no_param_group", "model.gradient_flow", ("not in any optimizer param group: pos_emb",),
            partial(mingpt_setup, forget_pos_emb=True),
            source="karpathy/minGPT/mingpt/model.py configure_optimizers: `no_decay.add('pos_emb')`, special-cased, "
                   "and the assertion that every parameter is in a group"),
    )),
]
