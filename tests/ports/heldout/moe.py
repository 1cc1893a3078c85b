"""Mixture-of-experts ports (held-out probe "misc"): top-k routed expert FFNs with a load-balancing auxiliary loss.

- ``switch_top1_capacity``: huggingface/transformers ``models/switch_transformers/modeling_switch_transformers.py``
  (paraphrased): ``SwitchTop1Router`` (router logits in fp32, softmax, top-1 expert, a per-expert capacity of
  ``capacity_factor * tokens / experts``: tokens over it are dropped and pass through the residual only), the expert
  output scaled by the router probability, and ``load_balancing_loss_func`` (``num_experts * sum_e(fraction of tokens
  routed to e * mean router probability of e)``) added with ``router_aux_loss_coef`` 0.01, plus the router z-loss.
- ``mixtral_top2``: ``models/mixtral/modeling_mixtral.py``'s ``MixtralSparseMoeBlock`` (top-2, the two weights
  renormalised, no capacity) and its ``load_balancing_loss_func`` (top-k one-hot).

A tiny token-classification model: embedding, one pre-norm MoE block with a residual, a linear head; targets are a
function of the token and its neighbour. The aux loss is a product of batch means and the capacity scales with the
batch: batch-dependent by construction.

Planted bug: the expert output not scaled by its router probability (``expert(x)`` instead of ``p * expert(x)``) and
the aux loss dropped: the router then receives no gradient (tokens are routed by argmax only) and never trains.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port
from ports.heldout._steps import share_weighted_step

VOCAB, T, D, E, N_OUT = 16, 8, 16, 4, 4


def token_batches(n_batches: int = 4, batch: int = 16, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, N_OUT, (VOCAB, VOCAB), generator=g)
    out = []
    for _ in range(n_batches):
        x = torch.randint(0, VOCAB, (batch, T), generator=g)
        prev = torch.cat([x[:, :1], x[:, :-1]], 1)
        out.append((x, table[x, prev]))
    return out


class MoE(nn.Module):
    def __init__(self, top_k: int = 1, capacity_factor: float | None = 1.25, scale_by_prob: bool = True) -> None:
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(D, 2 * D), nn.ReLU(), nn.Linear(2 * D, D))
                                     for _ in range(E))
        self.top_k, self.capacity_factor, self.scale_by_prob = top_k, capacity_factor, scale_by_prob

    def forward(self, h: torch.Tensor):
        b, t, d = h.shape
        x = h.reshape(-1, d)
        logits = self.router(x).float()
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.top_k, dim=-1)
        if self.top_k > 1:
            w = w / w.sum(-1, keepdim=True)  # Mixtral renormalises the top-k weights
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if self.capacity_factor is not None:  # Switch: tokens past the expert's capacity are dropped
                cap = int(self.capacity_factor * x.shape[0] / E)
                rows, slot = rows[:cap], slot[:cap]
            if rows.numel() == 0:
                continue
            y = expert(x[rows])
            if self.scale_by_prob:
                y = y * w[rows, slot, None].to(y.dtype)
            out = out.index_add(0, rows, y)
        return out.view(b, t, d), logits, idx


def load_balancing_loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """HF's load_balancing_loss_func: num_experts * sum(tokens_per_expert * router_prob_per_expert)."""
    probs = logits.softmax(-1)
    mask = F.one_hot(idx, E).float()  # (tokens, k, E)
    tokens_per_expert = mask.mean(0)  # (k, E)
    router_prob = probs.mean(0)  # (E,)
    return E * (tokens_per_expert * router_prob[None]).sum()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(logits, -1).pow(2).mean()


class TinyMoEModel(nn.Module):
    def __init__(self, **kw) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(0.02 * torch.randn(T, D))
        self.norm = nn.LayerNorm(D)
        self.moe = MoE(**kw)
        self.head = nn.Linear(D, N_OUT)

    def forward(self, x: torch.Tensor):
        h = self.emb(x) + self.pos
        # the previous token's embedding beside this one (a causal "mixer" so the target is learnable)
        h = h + torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
        y, logits, idx = self.moe(self.norm(h))
        return self.head(h + y), logits, idx


def make_loss(aux_coef: float = 0.01, z_coef: float = 0.001):
    def loss_fn(model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        out, logits, idx = model(x)
        loss = F.cross_entropy(out.reshape(-1, N_OUT), y.reshape(-1))
        if aux_coef:
            loss = loss + aux_coef * load_balancing_loss(logits, idx)
        if z_coef:
            loss = loss + z_coef * z_loss(logits)
        return loss
    return loss_fn


_step = share_weighted_step(1.0)


def build_switch(bug: bool = False) -> tropt.Setup:
    """Switch Transformers' top-1 router with capacity and load-balancing loss (``bug``: the expert output not scaled
    by its router probability and no aux loss, so the router gets no gradient)."""
    torch.manual_seed(0)
    model = TinyMoEModel(top_k=1, capacity_factor=1.25, scale_by_prob=not bug)
    loss = make_loss(aux_coef=0.0 if bug else 0.01, z_coef=0.0 if bug else 0.001)
    return tropt.Setup(model, loss, lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01),
                       token_batches(), val_data=token_batches(2, seed=1), step=_step, grad_clip=1.0,
                       num_classes=N_OUT)


def build_mixtral() -> tropt.Setup:
    """Mixtral's sparse MoE block: top-2 routing, renormalised weights, no capacity, its load-balancing loss."""
    torch.manual_seed(0)
    model = TinyMoEModel(top_k=2, capacity_factor=None)
    return tropt.Setup(model, make_loss(0.02, 0.0), lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3),
                       token_batches(), val_data=token_batches(2, seed=1), step=_step, grad_clip=1.0,
                       num_classes=N_OUT)


SW = "huggingface/transformers/src/transformers/models/switch_transformers/modeling_switch_transformers.py"
MX = "huggingface/transformers/src/transformers/models/mixtral/modeling_mixtral.py"
PORTS = [
    Port("switch_top1_capacity", "moe", SW, build_switch, bugs=(
        Bug("router_gets_no_gradient", "model.gradient_flow", ("router",), lambda: build_switch(bug=True),
            source="fairseq/megablocks issues: expert outputs not multiplied by gate probabilities -> router "
                   "weights never receive gradient"),)),
    Port("mixtral_top2", "moe", MX, build_mixtral),
]


def build_switch_accumulated() -> tropt.Setup:
    """The Switch port with two micro-batches per step (each loss weighted by its share of the samples; every
    sample has the same number of tokens): the capacity and the aux loss depend on the batch (a WARN, not a FAIL)."""
    return build_switch().replace(accumulation_steps=2)


PORTS.append(Port("switch_top1_accumulated", "moe", SW, build_switch_accumulated))


def build_mixtral_split_accumulated() -> tropt.Setup:
    """The Mixtral port with each loader batch cut into 2 micro-batches (``accumulation="split"``, equal sizes,
    every sample 8 tokens): the aux loss is a product of batch means, so it is batch-dependent (a WARN expected)."""
    return build_mixtral().replace(accumulation_steps=2, accumulation="split")


PORTS.append(Port("mixtral_top2_split_accumulated", "moe", MX, build_mixtral_split_accumulated))
