"""Deep metric learning ports (held-out probe "misc"): batch-hard triplet loss, mined inside the batch.

- ``reid_batch_hard_triplet``: michuanhaohao/reid-strong-baseline ``layers/triplet_loss.py`` (``euclidean_dist``,
  ``hard_example_mining``: for each anchor the farthest positive and the closest negative of the batch, read as
  ``dist_mat[is_pos].view(N, -1)``, ``TripletLoss`` = ``MarginRankingLoss(margin=0.3)``) + ``modeling/baseline.py``
  (a BNNeck: global feature -> BatchNorm1d -> bias-free classifier) + ``layers/__init__.py`` (``softmax_triplet``:
  ID cross entropy on the classifier's scores + triplet on the global feature), trained by ``engine/trainer.py``
  (``model.train()``, ``optimizer.zero_grad()``, forward, loss, ``backward``, ``step``). Batches are P identities x K
  instances (``RandomIdentitySampler``), generated here as P=4 x K=4.

The loss of each sample depends on the other samples of its batch (its hardest positive and negative): a
batch-dependent loss; the BNNeck's BatchNorm is batch-dependent too.

Planted bug: the hardest pairs mined on detached distances and the loss computed from those detached distances
(``dist_mat = euclidean_dist(feat.detach(), ...)`` meant "mining without gradient", but the returned dist_ap/dist_an
carry no gradient): the triplet term silently trains nothing
only the ID loss updates the model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port
from ports.heldout._steps import share_weighted_step

D_IN, N_ID, P, K = 16, 8, 4, 4


def pk_batches(n_batches: int = 4, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    centers = 2.0 * torch.randn(N_ID, D_IN, generator=g)
    out = []
    for _ in range(n_batches):
        ids = torch.randperm(N_ID, generator=g)[:P].repeat_interleave(K)  # P identities x K instances, grouped
        x = centers[ids] + torch.randn(P * K, D_IN, generator=g)
        out.append((x, ids))
    return out


def euclidean_dist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    xx = x.pow(2).sum(1, keepdim=True).expand(x.size(0), y.size(0))
    yy = y.pow(2).sum(1, keepdim=True).expand(y.size(0), x.size(0)).t()
    return (xx + yy - 2 * x @ y.t()).clamp(min=1e-12).sqrt()


def hard_example_mining(dist_mat: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """reid-strong-baseline: assumes every anchor has the same number of positives (P x K batches)."""
    n = dist_mat.size(0)
    is_pos = labels.expand(n, n).eq(labels.expand(n, n).t())
    is_neg = ~is_pos
    dist_ap, _ = dist_mat[is_pos].contiguous().view(n, -1).max(1)
    dist_an, _ = dist_mat[is_neg].contiguous().view(n, -1).min(1)
    return dist_ap, dist_an


def triplet_loss(feat: torch.Tensor, labels: torch.Tensor, margin: float = 0.3, detach_bug: bool = False):
    d = euclidean_dist(feat.detach(), feat.detach()) if detach_bug else euclidean_dist(feat, feat)
    dist_ap, dist_an = hard_example_mining(d, labels)
    y = torch.ones_like(dist_an)
    return F.margin_ranking_loss(dist_an, dist_ap, y, margin=margin)


class Baseline(nn.Module):
    def __init__(self, width: int = 32, feat: int = 16) -> None:
        super().__init__()
        self.base = nn.Sequential(nn.Linear(D_IN, width), nn.ReLU(), nn.Linear(width, feat))
        self.bottleneck = nn.BatchNorm1d(feat)
        self.bottleneck.bias.requires_grad_(False)  # BNNeck: no shift
        self.classifier = nn.Linear(feat, N_ID, bias=False)

    def forward(self, x: torch.Tensor):
        global_feat = self.base(x)
        cls_score = self.classifier(self.bottleneck(global_feat))
        return cls_score, global_feat


def make_loss(detach_bug: bool = False):
    def loss_fn(model: nn.Module, batch) -> torch.Tensor:
        x, ids = batch
        score, feat = model(x)
        return F.cross_entropy(score, ids) + triplet_loss(feat, ids, detach_bug=detach_bug)
    return loss_fn


_step = share_weighted_step()


def build_reid(detach_bug: bool = False) -> tropt.Setup:
    """reid-strong-baseline: Adam (lr 3.5e-4, raised here), weight decay 5e-4, softmax_triplet, margin 0.3."""
    torch.manual_seed(0)
    return tropt.Setup(Baseline(), make_loss(detach_bug),
                       lambda m: torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=3e-3,
                                                  weight_decay=5e-4),
                       pk_batches(), val_data=pk_batches(2, seed=1), step=_step, num_classes=N_ID)


UP = "michuanhaohao/reid-strong-baseline/layers/triplet_loss.py"
PORTS = [
    Port("reid_batch_hard_triplet", "metric_learning", UP, build_reid, bugs=(
        Bug("triplet_mined_on_detached_distances", "model.gradient_flow", ("triplet",),
            lambda: build_reid(detach_bug=True),
            source="pytorch-metric-learning / forums: distances computed under no_grad or .detach() for mining, "
                   "then reused in the loss: the triplet term has no gradient"),)),
]


def build_reid_accumulated() -> tropt.Setup:
    """The reid port with two micro-batches per step (each loss weighted by its share): the batch-hard loss is
    batch-dependent, so K micro-batches cannot reproduce the full batch (a WARN naming the loss, not a FAIL)."""
    return build_reid().replace(accumulation_steps=2)


PORTS.append(Port("reid_batch_hard_triplet_accumulated", "metric_learning", UP, build_reid_accumulated))


def build_reid_split_accumulated() -> tropt.Setup:
    """The reid port with each P x K loader batch cut into 2 micro-batches of 2 identities x K (``accumulation=
    "split"``): the batch-hard loss mines inside each micro-batch (a WARN naming the batch-dependent loss expected)."""
    return build_reid().replace(accumulation_steps=2, accumulation="split")


PORTS.append(Port("reid_batch_hard_split_accumulated", "metric_learning", UP, build_reid_split_accumulated))
