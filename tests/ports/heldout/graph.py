"""Graph ports (held-out probe "misc"): full-batch node classification, one batch is the whole graph.

- ``pygcn_full_batch``: tkipf/pygcn ``pygcn/train.py`` + ``pygcn/models.py`` + ``pygcn/layers.py`` (paraphrased):
  a two-layer GCN ``log_softmax(A_hat @ relu(A_hat @ X W1) W2)`` with dropout 0.5 between the layers, A_hat the
  row-normalised adjacency with self-loops
  ``Adam(lr=0.01, weight_decay=5e-4)``
  each epoch is ``model.train()``,
  ``optimizer.zero_grad()``, ``nll_loss(output[idx_train], labels[idx_train])``, ``backward``, ``step``, then
  ``model.eval()`` and the validation loss on ``idx_val`` of the same forward graph (not fastmode).

The graph is a stochastic block model with class-dependent features, generated from a seed. A batch is a dict with
the whole graph and a node mask; its samples are the mask's nodes (``split_fn``/``size_fn`` split the mask, never
the graph: each micro-batch is the whole graph with a subset of the labelled nodes, as a full-batch loop would
accumulate). The validation batch is the same graph with the validation mask (transductive split).

Planted bugs: the loss over every node instead of the train mask (the labels of validation and test nodes leak into
training; pyg issue threads "why is my val accuracy 100%"), and ``model.train()`` missing after the in-loop
``model.eval()`` (dropout off from the second epoch on).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port

N_NODES, N_FEAT, N_CLASS = 60, 12, 3


def sbm_graph(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(N_NODES) % N_CLASS
    y = y[torch.randperm(N_NODES, generator=g)]
    same = (y[:, None] == y[None, :]).float()
    p = 0.25 * same + 0.03 * (1 - same)
    a = (torch.rand(N_NODES, N_NODES, generator=g) < p).float()
    a = torch.triu(a, 1)
    a = a + a.T
    a_hat = a + torch.eye(N_NODES)
    a_hat = a_hat / a_hat.sum(1, keepdim=True)  # pygcn's normalize(): row-normalised, self-loops added
    centers = torch.randn(N_CLASS, N_FEAT, generator=g)
    x = centers[y] + 1.5 * torch.randn(N_NODES, N_FEAT, generator=g)
    x = x / x.abs().sum(1, keepdim=True)  # pygcn row-normalises the features too
    perm = torch.randperm(N_NODES, generator=g)
    masks = {}
    for name, idx in (("train", perm[:24]), ("val", perm[24:42]), ("test", perm[42:])):
        m = torch.zeros(N_NODES, dtype=torch.bool)
        m[idx] = True
        masks[name] = m
    return x, a_hat, y, masks


def graph_batch(mask_name: str, seed: int = 0) -> dict:
    x, a_hat, y, masks = sbm_graph(seed)
    return {"x": x, "adj": a_hat, "y": y, "mask": masks[mask_name]}


def split_mask(batch: dict, sizes: list[int]) -> list[dict]:
    """Each micro-batch: the whole graph, with a contiguous share of the mask's nodes."""
    idx = batch["mask"].nonzero().flatten()
    out, start = [], 0
    for n in sizes:
        m = torch.zeros_like(batch["mask"])
        m[idx[start:start + n]] = True
        out.append({**batch, "mask": m})
        start += n
    return out


def size_mask(batch: dict) -> int:
    return int(batch["mask"].sum())


class GraphConvolution(nn.Module):
    """pygcn's layer: ``adj @ (x @ W) + b``, uniform(-1/sqrt(out), 1/sqrt(out)) init."""

    def __init__(self, fin: int, fout: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fin, fout))
        self.bias = nn.Parameter(torch.empty(fout))
        stdv = 1.0 / fout ** 0.5
        nn.init.uniform_(self.weight, -stdv, stdv)
        nn.init.uniform_(self.bias, -stdv, stdv)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return adj @ (x @ self.weight) + self.bias


class GCN(nn.Module):
    def __init__(self, nhid: int = 16, dropout: float = 0.5) -> None:
        super().__init__()
        self.gc1, self.gc2, self.dropout = GraphConvolution(N_FEAT, nhid), GraphConvolution(nhid, N_CLASS), dropout

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        return F.log_softmax(self.gc2(x, adj), dim=1)


def gcn_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    out = model(batch["x"], batch["adj"])
    m = batch["mask"]
    return F.nll_loss(out[m], batch["y"][m])


def gcn_loss_all_nodes(model: nn.Module, batch: dict) -> torch.Tensor:
    """BUG: every node's label in the loss, validation and test nodes included."""
    return F.nll_loss(model(batch["x"], batch["adj"]), batch["y"])


def _gcn_step(loss_fn, call_train: bool = True):
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        if call_train:
            ctx.model.train()
        ctx.optimizer.zero_grad()
        sizes = [ctx.batch_size(mb) for mb in micro]
        total = torch.zeros(())
        for mb, n in zip(micro, sizes):
            loss = loss_fn(ctx.model, mb) * (n / sum(sizes))
            loss.backward()
            total += loss.detach()
        ctx.optimizer.step()
        # pygcn (not fastmode): evaluate the validation nodes of the same graph in eval mode after the step
        ctx.model.eval()
        with torch.no_grad():
            out = ctx.model(micro[0]["x"], micro[0]["adj"])
        ctx.val_loss = float(F.nll_loss(out, micro[0]["y"]))  # whole-graph loss as a number, for a log
        return total
    return step


def _accuracy(model: nn.Module, data) -> float:
    model.eval()
    with torch.no_grad():
        hits = tot = 0
        for b in data:
            pred = model(b["x"], b["adj"]).argmax(1)
            hits += int((pred[b["mask"]] == b["y"][b["mask"]]).sum())
            tot += int(b["mask"].sum())
    return hits / tot


def build_gcn(loss_all_nodes: bool = False, call_train: bool = True, split: bool = True) -> tropt.Setup:
    """tkipf/pygcn pygcn/train.py (hidden 16, dropout 0.5, Adam lr 0.01, weight decay 5e-4)."""
    torch.manual_seed(0)
    loss_fn = gcn_loss_all_nodes if loss_all_nodes else gcn_loss
    kw = dict(split_fn=split_mask, size_fn=size_mask) if split else {}
    return tropt.Setup(GCN(), loss_fn, lambda m: torch.optim.Adam(m.parameters(), lr=0.01, weight_decay=5e-4),
                       [graph_batch("train")], val_data=[graph_batch("val")], step=_gcn_step(loss_fn, call_train),
                       num_classes=N_CLASS, metric=tropt.Metric(_accuracy, higher_is_better=True), **kw)


PYGCN = "tkipf/pygcn/pygcn/train.py"
PORTS = [
    Port("pygcn_full_batch", "graph", PYGCN, build_gcn, bugs=(
        Bug("gcn_loss_over_all_nodes", "data.target_leakage", ("label",), lambda: build_gcn(loss_all_nodes=True),
            source="pyg discussions: loss computed on data.y without data.train_mask trains on val/test labels"),
        Bug("gcn_missing_model_train", "loop.train_mode", ("train",), lambda: build_gcn(call_train=False),
            source="pygcn train(): model.train() at the start of each epoch, model.eval() for validation"),
    )),
]

# Not a fitted loop (no split_fn for a whole-graph batch, which the README asks for): kept out of PORTS. With it
# model.overfit_batch and loop.ddp ERROR with advice that points elsewhere (findings 1 and 4 of REPORT.md).
UNFITTED = [Port("pygcn_full_batch_nosplit", "graph", PYGCN, lambda: build_gcn(split=False))]


class GCNDropoutModule(GCN):
    """pyg examples/gcn.py style: the same GCN with an ``nn.Dropout`` module instead of functional dropout."""

    def __init__(self, nhid: int = 16, dropout: float = 0.5) -> None:
        super().__init__(nhid, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.gc2(self.drop(F.relu(self.gc1(x, adj))), adj), dim=1)


def build_gcn_module_dropout(call_train: bool = True) -> tropt.Setup:
    """The pygcn port with dropout as a module; the step still validates in eval mode (under no_grad) after
    optimizer.step() and puts the model back with model.train() at the start of the next call."""
    s = build_gcn(call_train=call_train)
    torch.manual_seed(0)
    return s.replace(model=GCNDropoutModule())


PORTS.append(Port("pygcn_dropout_module", "graph", PYGCN, build_gcn_module_dropout, bugs=(
    Bug("gcn_module_missing_model_train", "loop.train_mode", ("train",),
        lambda: build_gcn_module_dropout(call_train=False),
        source="pygcn train(): model.train() at the start of each epoch"),)))
