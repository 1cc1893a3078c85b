"""Recommendation and tabular ports (issue 28): embedding tables over categorical ids, click-through BCE, implicit
feedback with sampled negatives, and a small regression on a bundled scikit-learn table.

Every port is a paraphrase of its upstream loop at toy size, on data generated in-process from a seed (the diabetes
table ships inside scikit-learn). The planted bugs are the ones these loops are known for: a forgotten
``optimizer.zero_grad()``, micro-batch losses summed under accumulation, a scheduler stepped per micro-batch.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port

# ------------------------------------------------------------------ click data: dense features + categorical bags
N_DENSE, N_TABLES, ROWS, BAG = 4, 3, 20, 2


def click_batches(n_batches: int = 4, batch: int = 32, seed: int = 0) -> list:
    """(dense, ids, clicked) batches: ``ids`` is (batch, tables, bag); the click comes from a logistic teacher over
    the dense features and one weight per categorical id (so the embeddings carry signal)."""
    g = torch.Generator().manual_seed(seed)
    w_dense = torch.randn(N_DENSE, generator=g)
    w_ids = torch.randn(N_TABLES, ROWS, generator=g)
    out = []
    for _ in range(n_batches):
        dense = torch.randn(batch, N_DENSE, generator=g)
        ids = torch.randint(0, ROWS, (batch, N_TABLES, BAG), generator=g)
        logit = dense @ w_dense + sum(w_ids[t][ids[:, t]].sum(1) for t in range(N_TABLES))
        clicked = (torch.rand(batch, generator=g) < torch.sigmoid(logit)).float()
        out.append((dense, ids, clicked))
    return out


def mlp(sizes: list[int], sigmoid_last: bool = False) -> nn.Sequential:
    """DLRM's ``create_mlp``: Linear + ReLU per layer (a sigmoid after the last one of the top MLP)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        last = i == len(sizes) - 2
        layers.append(nn.Sigmoid() if last and sigmoid_last else nn.ReLU())
    return nn.Sequential(*layers)


# ------------------------------------------------------------------ DLRM: embedding bags, dot interaction, BCE
class DLRM(nn.Module):
    """Bottom MLP over the dense features, one sum-pooled EmbeddingBag per categorical table, pairwise dot products
    of all the vectors (strictly lower triangle) concatenated with the bottom output, a top MLP ending in a sigmoid."""

    def __init__(self, dim: int = 8, sparse: bool = False) -> None:
        super().__init__()
        self.bot = mlp([N_DENSE, 16, dim])
        self.emb = nn.ModuleList(nn.EmbeddingBag(ROWS, dim, mode="sum", sparse=sparse) for _ in range(N_TABLES))
        n = N_TABLES + 1
        self.top = mlp([dim + n * (n - 1) // 2, 16, 1], sigmoid_last=True)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.bot(dense)
        ly = [bag(ids[:, t]) for t, bag in enumerate(self.emb)]  # fixed-length bags: no offsets needed
        t = torch.stack([x, *ly], 1)  # (batch, n, dim)
        z = torch.bmm(t, t.transpose(1, 2))
        li, lj = torch.tril_indices(t.size(1), t.size(1), offset=-1)
        return self.top(torch.cat([x, z[:, li, lj]], 1)).squeeze(1)


def dlrm_loss(model: nn.Module, batch) -> torch.Tensor:
    dense, ids, clicked = batch
    return F.binary_cross_entropy(model(dense, ids), clicked)  # DLRM's --loss-function=bce: BCELoss on sigmoid


def dlrm_setup(*, forget_zero_grad: bool = False, sparse: bool = False) -> tropt.Setup:
    """facebookresearch/dlrm ``dlrm_s_pytorch.py``: ``DLRM_Net`` (bottom MLP, ``EmbeddingBag(mode="sum")`` tables,
    ``interact_features`` with dot products, top MLP with a sigmoid), ``BCELoss``, plain SGD, and its training
    loop: forward, loss, ``optimizer.zero_grad()``, ``backward()``, ``optimizer.step()``, ``lr_scheduler.step()``
    (its ``LRPolicyScheduler``: a linear warm-up, here over 4 iterations, then constant).

    Upstream builds its tables with ``sparse=True`` (sparse gradients for SGD). tropt's gradient readers do not take
    sparse gradients yet (issue 31): the port keeps the tables dense; ``dlrm_setup(sparse=True)`` reproduces the
    gap (six checks ERROR with PyTorch's ``NotImplementedError`` for the SparseCPU backend)."""

    def step(ctx, micro_batches):
        sizes = [ctx.batch_size(mb) for mb in micro_batches]
        if not forget_zero_grad:  # BUG when missing: every step adds the earlier steps' gradients
            ctx.optimizer.zero_grad()
        total = torch.zeros(())
        for mb, n in zip(micro_batches, sizes):
            loss = ctx.loss_fn(ctx.model, mb) * (n / sum(sizes))
            loss.backward()
            total += loss.detach()
        ctx.optimizer.step()
        ctx.scheduler.step()
        return total

    def warmup(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda it: min(1.0, (it + 1) / 4))

    torch.manual_seed(0)
    return tropt.Setup(DLRM(sparse=sparse), dlrm_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                       click_batches(), scheduler=warmup, step=step)



# ------------------------------------------------------------------ NCF: user/item towers, sampled negatives
USERS, ITEMS, NUM_NG = 16, 24, 4


def ncf_batches(n_batches: int = 4, batch: int = 40, seed: int = 0) -> list:
    """(user, item, label) batches of implicit feedback: each user's positives are the items a low-rank teacher
    scores highest; every positive comes with ``NUM_NG`` items drawn uniformly among those the user has not
    interacted with (NCF's ``ng_sample``), shuffled into batches."""
    g = torch.Generator().manual_seed(seed)
    score = torch.randn(USERS, 3, generator=g) @ torch.randn(3, ITEMS, generator=g)
    liked = score >= score.topk(4, dim=1).values[:, -1:]
    rows = []
    for u in range(USERS):
        for i in liked[u].nonzero().flatten().tolist():
            rows.append((u, i, 1.0))
            unseen = (~liked[u]).nonzero().flatten()
            for j in unseen[torch.randint(0, len(unseen), (NUM_NG,), generator=g)].tolist():
                rows.append((u, j, 0.0))
    order = torch.randperm(len(rows), generator=g)[: n_batches * batch]
    users, items, labels = (torch.tensor([rows[k][c] for k in order.tolist()]) for c in range(3))
    return [(users[s:s + batch].long(), items[s:s + batch].long(), labels[s:s + batch])
            for s in range(0, len(order), batch)]


class NCF(nn.Module):
    """NeuMF: a GMF tower (element-wise product of user and item factors) beside an MLP tower over concatenated
    user and item embeddings (layers halving in width, dropout before each), joined by one predict layer."""

    def __init__(self, factors: int = 8, layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed_user_gmf, self.embed_item_gmf = nn.Embedding(USERS, factors), nn.Embedding(ITEMS, factors)
        width = factors * 2 ** (layers - 1)
        self.embed_user_mlp, self.embed_item_mlp = nn.Embedding(USERS, width), nn.Embedding(ITEMS, width)
        tower: list[nn.Module] = []
        for k in range(layers):
            size = factors * 2 ** (layers - k)
            tower += [nn.Dropout(dropout), nn.Linear(size, size // 2), nn.ReLU()]
        self.mlp = nn.Sequential(*tower)
        self.predict = nn.Linear(2 * factors, 1)
        for emb in (self.embed_user_gmf, self.embed_item_gmf, self.embed_user_mlp, self.embed_item_mlp):
            nn.init.normal_(emb.weight, std=0.01)
        nn.init.kaiming_uniform_(self.predict.weight, a=1, nonlinearity="sigmoid")

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        gmf = self.embed_user_gmf(user) * self.embed_item_gmf(item)
        mlp_out = self.mlp(torch.cat([self.embed_user_mlp(user), self.embed_item_mlp(item)], -1))
        return self.predict(torch.cat([gmf, mlp_out], -1)).flatten()


def ncf_loss(model: nn.Module, batch) -> torch.Tensor:
    user, item, label = batch
    return F.binary_cross_entropy_with_logits(model(user, item), label)


def ncf_setup(*, divide: bool = True) -> tropt.Setup:
    """guoyang9/NCF ``main.py`` with ``model.py``'s ``NCF`` (NeuMF, no pre-training): ``BCEWithLogitsLoss``,
    ``Adam(lr=0.001)`` (here 0.01 for a short run), negatives sampled per positive, and its loop
    ``model.zero_grad()``, forward, loss, ``backward()``, ``optimizer.step()``; run with 2 micro-batches per
    step, each mean loss divided by their number."""

    def step(ctx, micro_batches):
        ctx.model.zero_grad()
        for mb in micro_batches:
            loss = ctx.loss_fn(ctx.model, mb)
            if divide:  # BUG when missing: K micro-batch means summed: K x the gradient
                loss = loss / len(micro_batches)
            loss.backward()
        ctx.optimizer.step()

    torch.manual_seed(0)
    return tropt.Setup(NCF(), ncf_loss, lambda m: torch.optim.Adam(m.parameters(), lr=0.01), ncf_batches(),
                       step=step, accumulation_steps=2)


# ------------------------------------------------------------------ Wide & Deep: linear part + DNN, summed BCE
N_SPARSE, VOCAB_SPARSE, EMB = 3, 12, 4


def wdl_batches(n_batches: int = 4, batch: int = 32, seed: int = 0) -> list:
    """(sparse ids (batch, fields), dense (batch, 2), clicked (batch,)) from a teacher with per-id weights and a
    pairwise id interaction the deep part can learn."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N_SPARSE, VOCAB_SPARSE, generator=g)
    cross = torch.randn(VOCAB_SPARSE, VOCAB_SPARSE, generator=g)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(0, VOCAB_SPARSE, (batch, N_SPARSE), generator=g)
        dense = torch.rand(batch, 2, generator=g)
        logit = w.gather(1, ids.T).sum(0) + cross[ids[:, 0], ids[:, 1]] + dense[:, 0] - 0.5
        out.append((ids, dense, (torch.rand(batch, generator=g) < torch.sigmoid(logit)).float()))
    return out


class WDL(nn.Module):
    """Wide & Deep as DeepCTR-Torch builds it: a linear model (one 1-wide embedding per sparse field plus a linear
    map of the dense features) summed with a DNN over the concatenated field embeddings and dense features; a
    sigmoid prediction layer."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.linear_emb = nn.ModuleList(nn.Embedding(VOCAB_SPARSE, 1) for _ in range(N_SPARSE))
        self.linear_dense = nn.Linear(2, 1, bias=False)
        self.embedding = nn.ModuleList(nn.Embedding(VOCAB_SPARSE, EMB) for _ in range(N_SPARSE))
        for emb in self.embedding:
            nn.init.normal_(emb.weight, std=1e-4)  # DeepCTR's init_std
        self.dnn = nn.Sequential(nn.Linear(N_SPARSE * EMB + 2, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU())
        self.dnn_linear = nn.Linear(hidden, 1, bias=False)
        self.bias = nn.Parameter(torch.zeros(1))  # PredictionLayer's bias

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        wide = sum(e(ids[:, f]) for f, e in enumerate(self.linear_emb)) + self.linear_dense(dense)
        deep_in = torch.cat([*(e(ids[:, f]) for f, e in enumerate(self.embedding)), dense], 1)
        logit = wide + self.dnn_linear(self.dnn(deep_in)) + self.bias
        return torch.sigmoid(logit).flatten()

    def regularization_loss(self, l2: float = 1e-5) -> torch.Tensor:
        """DeepCTR's ``get_regularization_loss``: L2 on the embedding tables (``l2_reg_embedding``)."""
        return l2 * sum((e.weight ** 2).sum() for e in self.embedding)


def wdl_loss(model: nn.Module, batch) -> torch.Tensor:
    ids, dense, clicked = batch
    return F.binary_cross_entropy(model(ids, dense), clicked, reduction="sum")  # BaseModel.fit: reduction='sum'


def wdl_setup(*, deep_only_optimizer: bool = False) -> tropt.Setup:
    """shenweichen/DeepCTR-Torch ``deepctr_torch/models/wdl.py`` (``WDL``) trained by ``basemodel.py``'s
    ``BaseModel.fit``: ``optim.zero_grad()``, ``loss_func(y_pred, y, reduction='sum')`` plus the L2
    regularisation of the embeddings, ``backward()``, ``optim.step()``, with ``Adam`` (its ``"adam"`` string,
    lr 0.001; 0.01 here). The summed loss needs no division across micro-batches; the regulariser is added once
    per step."""

    def step(ctx, micro_batches):
        ctx.optimizer.zero_grad()
        total = torch.zeros(())
        for mb in micro_batches:
            loss = ctx.loss_fn(ctx.model, mb)
            loss.backward()
            total += loss.detach()
        getattr(ctx.model, "module", ctx.model).regularization_loss().backward()  # (DDP-wrapped under loop.ddp)
        ctx.optimizer.step()
        return total

    def optimizer(m):
        params = m.dnn.parameters() if deep_only_optimizer else m.parameters()  # BUG: the wide part never updates
        return torch.optim.Adam(params, lr=0.01)

    torch.manual_seed(0)
    return tropt.Setup(WDL(), wdl_loss, optimizer, wdl_batches(), step=step)


# ------------------------------------------------------------------ diabetes regression: skorch's NeuralNetRegressor
def diabetes_batches(batch: int = 64) -> list:
    """The scikit-learn diabetes table (442 rows, 10 standardised features), target scaled to unit variance,
    as (x, y) batches in a seeded order."""
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    y = torch.tensor(y, dtype=torch.float32)
    y = ((y - y.mean()) / y.std()).unsqueeze(1)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[: 4 * batch]
    return [(x[order[s:s + batch]], y[order[s:s + batch]]) for s in range(0, len(order), batch)]


def regression_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def diabetes_setup(*, scheduler_per_micro_batch: bool = False, epoch_schedule_per_batch: bool = False) -> tropt.Setup:
    """skorch-dev/skorch ``skorch/regressor.py`` (``NeuralNetRegressor``: MSELoss) with the gradient-accumulating
    ``train_step`` of skorch's FAQ (each micro-batch loss divided by the accumulation steps, one optimizer step)
    and its ``LRScheduler`` callback (``skorch/callbacks/lr_scheduler.py``) with ``ReduceLROnPlateau`` monitoring
    the epoch's train loss, stepped at the end of every epoch. The module is an MLP with dropout.

    ``epoch_schedule_per_batch`` plants the bug of a ``StepLR(step_size=2)`` meant to halve the rate every 2 epochs
    but stepped after every batch (``step_every='batch'``): it halves it twice within each epoch."""
    rows = sum(len(x) for x, _ in diabetes_batches())  # one epoch: every row seen once

    def step(ctx, micro_batches):
        ctx.optimizer.zero_grad()
        for mb in micro_batches:
            loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
            loss.backward()
            ctx.epoch_loss = getattr(ctx, "epoch_loss", 0.0) + loss.item() * len(micro_batches) * len(mb[0])
            if scheduler_per_micro_batch:  # BUG: the callback's step_every='batch' counts micro-batches
                ctx.scheduler.step()
        ctx.optimizer.step()
        ctx.rows_seen = getattr(ctx, "rows_seen", 0) + sum(len(mb[0]) for mb in micro_batches)
        if epoch_schedule_per_batch:  # BUG: an epoch-sized schedule stepped per batch
            ctx.scheduler.step()
        elif ctx.rows_seen >= rows and not scheduler_per_micro_batch:  # on_epoch_end: the epoch's mean train loss
            ctx.scheduler.step(ctx.epoch_loss / ctx.rows_seen)
            ctx.epoch_loss, ctx.rows_seen = 0.0, 0

    def scheduler(opt):
        if scheduler_per_micro_batch:
            return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        if epoch_schedule_per_batch:
            return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    return tropt.Setup(model, regression_loss, lambda m: torch.optim.Adam(m.parameters(), lr=0.01),
                       diabetes_batches(), scheduler=scheduler, step=step, accumulation_steps=2,
                       accumulation="split")  # each 64-row batch in 2 micro-batches: 4 optimizer steps per epoch


PORTS = [
    Port("dlrm_embedding_bags", "tabular", "facebookresearch/dlrm/dlrm_s_pytorch.py", dlrm_setup,
         bugs=(Bug("dlrm_forgotten_zero_grad", "loop.zero_grad", ("plus the gradient left over from step 1",),
                   lambda: dlrm_setup(forget_zero_grad=True),
                   source="PyTorch docs, 'Zeroing out gradients': gradients accumulate unless zeroed every step"),)),
    Port("ncf_neumf_negative_sampling", "tabular", "guoyang9/NCF/main.py", ncf_setup,
         notes={"model.activation_stats": "the narrowest ReLU of the MLP tower loses units in a short run"},
         bugs=(Bug("ncf_accumulated_means_not_divided", "loop.accumulation", ("micro-batch losses are summed",),
                   lambda: ncf_setup(divide=False),
                   source="skorch FAQ 'How do I apply gradient accumulation?': the loss is divided by acc_steps"),)),
    Port("deepctr_wide_and_deep", "tabular", "shenweichen/DeepCTR-Torch/deepctr_torch/models/wdl.py", wdl_setup,
         notes={"model.activation_stats": "the DNN's second ReLU loses units in a short run"},
         bugs=(Bug("wdl_optimizer_over_the_deep_part_only", "model.gradient_flow", ("never updated",),
                   lambda: wdl_setup(deep_only_optimizer=True),
                   source="PyTorch forums: parameters left out of the optimizer get gradients but never change"),)),
    Port("skorch_diabetes_plateau", "tabular", "skorch-dev/skorch/skorch/regressor.py", diabetes_setup,
         needs=("sklearn",),
         notes={"loop.scheduler_cadence": "ReduceLROnPlateau is stepped at the end of an epoch, which a short run "
                                          "does not reach"},
         bugs=(Bug("skorch_scheduler_stepped_per_micro_batch", "loop.scheduler_cadence", ("per micro-batch",),
                   lambda: diabetes_setup(scheduler_per_micro_batch=True),
                   source="skorch LRScheduler(step_every='batch') inside an accumulating train_step"),
               Bug("skorch_epoch_schedule_stepped_per_batch", "loop.scheduler_cadence", ("counted in epochs",),
                   lambda: diabetes_setup(epoch_schedule_per_batch=True),
                   source="skorch LRScheduler(policy=StepLR, step_every='batch') with a step_size counted in "
                          "epochs (issue 28: schedules sized in epochs but stepped per iteration)"))),
]


# ------------------------------------------------------------------ the former corpus cases (tests/support/real_loops)
def manual_sgd_port() -> tropt.Setup:
    """pytorch/examples regression/main.py: a polynomial fit with no optimizer, ``p.data.add_(p.grad, alpha=-lr)``
    by hand (``support.real_loops.manual_sgd_setup``)."""
    from support.real_loops import manual_sgd_setup

    return manual_sgd_setup()


def manual_sgd_unused_optimizer_port() -> tropt.Setup:
    """The same hand-written update with an optimizer built and never stepped (the step updates by hand)."""
    from support.real_loops import LR_SGD, manual_sgd_setup

    return manual_sgd_setup().replace(optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=LR_SGD))


def _manual_sgd_without_zero_grad() -> tropt.Setup:
    from support.real_loops import manual_sgd_setup

    return manual_sgd_setup(forget_zero_grad=True)


PORTS += [
    Port("manual_sgd", "tabular", "pytorch/examples/regression/main.py", manual_sgd_port,
         bugs=(Bug("manual_sgd_without_zero_grad", "loop.zero_grad",
                   ("update (parameter change) differs from a fresh one", '"observed_at": "parameter change"'),
                   _manual_sgd_without_zero_grad,
                   source="pytorch/examples regression/main.py zeroes p.grad by hand after each update"),)),
    Port("manual_sgd_unused_optimizer", "tabular", "pytorch/examples/regression/main.py",
         manual_sgd_unused_optimizer_port),
]
