"""Fine-tuning ports (issue 28): layer-wise learning-rate decay over a BERT encoder's param groups, LoRA adapters on a
frozen base, and a linear probe on a frozen backbone.

The "pre-trained" weights are a seeded random initialisation (no hub, no download); the data are generated
sequences and features with a learnable rule. The planted bugs are those these recipes are known for: a learning
rate scale that rounds to 0, an adapter whose two factors both start at zero, an optimizer built over the frozen
part.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port

# ------------------------------------------------------------------ BERT with layer-wise LR decay (BEiT / ELECTRA)
VOCAB, SEQ, LAYERS = 40, 8, 2


def bert_batches(n_batches: int = 4, batch: int = 16, seed: int = 0) -> list:
    """{input_ids, attention_mask, labels} batches: the label says whether token 5 occurs in the sequence."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(1, VOCAB, (batch, SEQ), generator=g)
        plant = torch.rand(batch, generator=g) < 0.5
        ids[plant, torch.randint(0, SEQ, (int(plant.sum()),), generator=g)] = 5
        labels = (ids == 5).any(1).long()
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out


def bert_model() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=SEQ, num_labels=2)
    return BertForSequenceClassification(config)


def hf_loss(model: nn.Module, batch) -> torch.Tensor:
    return model(**batch).loss


def layer_id(name: str) -> int:
    """BEiT's ``get_layer_id_for_vit`` for a BERT: embeddings are layer 0, encoder layer i is i + 1, the pooler and
    classifier are the top (``LAYERS + 1``)."""
    if name.startswith("bert.embeddings"):
        return 0
    if name.startswith("bert.encoder.layer."):
        return int(name.split(".")[3]) + 1
    return LAYERS + 1


def llrd_groups(model: nn.Module, lr: float, decay: float = 0.75, weight_decay: float = 0.01,
                truncate: bool = False) -> list[dict]:
    """BEiT's ``get_parameter_groups``: one group per (layer, decay/no-decay) with ``lr_scale = decay ** (top -
    layer)``; biases and LayerNorm weights get no weight decay. ``truncate`` plants an integer scale (0 below
    the top)."""
    groups: dict[str, dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim == 1 or name.endswith(".bias")
        lid = layer_id(name)
        key = f"layer_{lid}_{'no_decay' if no_decay else 'decay'}"
        scale = decay ** (LAYERS + 1 - lid)
        if truncate:  # BUG: int() of a scale below 1 is 0: every layer under the top is frozen by its lr
            scale = int(scale)
        group = groups.setdefault(key, {"params": [], "weight_decay": 0.0 if no_decay else weight_decay,
                                        "lr": lr * scale, "lr_scale": scale})
        group["params"].append(p)
    return list(groups.values())


def llrd_setup(*, truncate_scale: bool = False) -> tropt.Setup:
    """microsoft/unilm ``beit/optim_factory.py`` (``LayerDecayValueAssigner``, ``get_parameter_groups``), the
    layer-wise decay ELECTRA introduced for fine-tuning, applied to a ``BertForSequenceClassification``: AdamW
    over per-layer groups whose learning rate is ``lr * layer_decay ** (num_layers + 1 - layer_id)``, no weight
    decay on biases and norms, a linear warm-up then linear decay (``get_linear_schedule_with_warmup``) stepped once
    per optimizer step, gradients clipped to norm 1, the loss read off ``outputs.loss``."""

    def optimizer(m):
        return torch.optim.AdamW(llrd_groups(m, 1e-3, truncate=truncate_scale))

    def scheduler(opt):
        from transformers import get_linear_schedule_with_warmup

        return get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=200)

    return tropt.Setup(bert_model(), hf_loss, optimizer, bert_batches(), scheduler=scheduler, grad_clip=1.0,
                       num_classes=2)


# ------------------------------------------------------------------ LoRA adapters on a frozen base
IN, HIDDEN, CLASSES = 12, 32, 3


class LoraLinear(nn.Module):
    """peft's LoRA ``Linear``: the base layer frozen, ``lora_B(lora_A(dropout(x))) * alpha / r`` added to its output;
    ``lora_A`` Kaiming-uniform, ``lora_B`` zeros, so the adapted layer starts equal to the base."""

    def __init__(self, base: nn.Linear, r: int = 4, alpha: int = 8, dropout: float = 0.1,
                 zero_a: bool = False) -> None:
        super().__init__()
        self.base_layer = base.requires_grad_(False)
        self.lora_dropout = nn.Dropout(dropout)
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        self.scaling = alpha / r
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        if zero_a:  # BUG: A and B both zero: neither factor gets a gradient, the adapter never moves
            nn.init.zeros_(self.lora_A.weight)
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


class Backbone(nn.Module):
    """The "pre-trained" model: two hidden layers and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.classifier = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def feature_batches(n_batches: int = 4, batch: int = 32, seed: int = 0) -> list:
    """(x, y) batches; y is the argmax of a random two-layer teacher."""
    g = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(IN, 16, generator=g), torch.randn(16, CLASSES, generator=g)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, IN, generator=g)
        out.append((x, (torch.tanh(x @ w1) @ w2).argmax(1)))
    return out


def ce_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def lora_model(zero_a: bool = False) -> Backbone:
    """``get_peft_model`` by hand: LoRA on ``fc1`` and ``fc2`` (the target modules), every base weight frozen, the
    classifier trainable (``modules_to_save``)."""
    torch.manual_seed(0)
    model = Backbone()
    model.requires_grad_(False)
    model.fc1 = LoraLinear(model.fc1, zero_a=zero_a)
    model.fc2 = LoraLinear(model.fc2, zero_a=zero_a)
    model.classifier.requires_grad_(True)
    return model


def lora_setup(*, zero_a: bool = False) -> tropt.Setup:
    """huggingface/peft ``src/peft/tuners/lora/layer.py`` (``LoraLayer.update_layer``, ``Linear.forward``) as the
    peft sequence-classification examples train it: only the adapters and the classifier require gradients, AdamW
    (lr 3e-3 here) over ``filter(lambda p: p.requires_grad, model.parameters())``, a linear schedule with warm-up."""

    def optimizer(m):
        return torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3)

    def scheduler(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda it: min(1.0, (it + 1) / 3) * max(0.0, 1 - it / 300))

    return tropt.Setup(lora_model(zero_a), ce_loss, optimizer, feature_batches(), scheduler=scheduler,
                       num_classes=CLASSES)


# ------------------------------------------------------------------ linear probe on a frozen backbone (MAE)
class LARS(torch.optim.Optimizer):
    """MAE's ``util/lars.py``: SGD with momentum whose update of each matrix is rescaled by the trust ratio
    ``eta * ||p|| / ||g + wd p||``; vectors (biases, norms) are updated as plain momentum SGD."""

    def __init__(self, params, lr: float = 0.0, weight_decay: float = 0.0, momentum: float = 0.9,
                 trust_coefficient: float = 0.001) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "trust_coefficient": trust_coefficient})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                dp = p.grad
                if p.ndim > 1:
                    dp = dp.add(p, alpha=g["weight_decay"])
                    pn, un = torch.norm(p), torch.norm(dp)
                    q = torch.where(pn > 0.0, torch.where(un > 0, g["trust_coefficient"] * pn / un, 1.0), 1.0)
                    dp = dp.mul(q)
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                mu = state["mu"].mul_(g["momentum"]).add_(dp)
                p.add_(mu, alpha=-g["lr"])


class Probe(nn.Module):
    """A frozen encoder and MAE's probe head: ``BatchNorm1d(affine=False)`` then a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(IN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN))
        self.head = nn.Sequential(nn.BatchNorm1d(HIDDEN, affine=False, eps=1e-6), nn.Linear(HIDDEN, CLASSES))
        nn.init.trunc_normal_(self.head[1].weight, std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def linprobe_setup(*, optimize_encoder: bool = False) -> tropt.Setup:
    """facebookresearch/mae ``main_linprobe.py``: the head replaced by ``BatchNorm1d(affine=False)`` + ``Linear``
    (weights ``trunc_normal_(std=0.01)``), every parameter but the head's frozen, ``LARS(head.parameters(), lr,
    weight_decay=0)``, cross entropy, and a half-cycle cosine schedule after a linear warm-up set per iteration by
    ``lr_sched.adjust_learning_rate`` (here a ``LambdaLR``). ``optimize_encoder`` plants an optimizer built over the
    frozen encoder instead of the head."""

    def optimizer(m):
        # lr = blr 0.1 x 16384 / 256, the learning rate MAE's recipe runs LARS at (its trust ratio keeps steps small)
        return LARS((m.encoder if optimize_encoder else m.head).parameters(), lr=6.4, weight_decay=0.0)

    def scheduler(opt):
        warm, total = 2, 200

        def scale(it):
            return (it + 1) / warm if it < warm else 0.5 * (1 + math.cos(math.pi * (it - warm) / (total - warm)))

        return torch.optim.lr_scheduler.LambdaLR(opt, scale)

    torch.manual_seed(0)
    model = Probe()
    model.encoder.requires_grad_(False)
    return tropt.Setup(model, ce_loss, optimizer, feature_batches(), scheduler=scheduler, num_classes=CLASSES)


# ------------------------------------------------------------------ ULMFiT: discriminative LRs, gradual unfreezing
class Staged(nn.Module):
    """A "pre-trained" encoder in three layer groups and a new classifier head (fastai's splitter: four groups)."""

    def __init__(self) -> None:
        super().__init__()
        self.groups = nn.ModuleList([nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU()),
                                     nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU()),
                                     nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Dropout(0.1)),
                                     nn.Linear(HIDDEN, CLASSES)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for g in self.groups:
            x = g(x)
        return x


def freeze_to(model: nn.Module, n: int) -> None:
    """fastai's ``freeze_to(n)``: the layer groups before ``n`` frozen, the rest trainable (``n`` from the end when
    negative)."""
    groups = getattr(model, "module", model).groups
    n = n % len(groups)
    for i, g in enumerate(groups):
        g.requires_grad_(i >= n)


def ulmfit_setup(*, optimizer_over_trainable_only: bool = False) -> tropt.Setup:
    """fastai/fastai ``fastai/learner.py`` (``Learner.freeze_to``, ``unfreeze``) with the ULMFiT recipe of
    discriminative learning rates, ``slice(lr / 2.6 ** 3, lr)`` over the layer groups (one param group each), and
    gradual unfreezing: the head trains first (``freeze_to(-1)``), then one more group after each epoch (here an
    epoch is two batches), until all are unfrozen. Adam, cross entropy.

    ``optimizer_over_trainable_only`` plants the optimizer built over ``filter(requires_grad)`` at the start, so the
    groups unfrozen later get gradients and are never updated."""
    rows_per_epoch = 2 * 32

    def step(ctx, micro_batches):
        ctx.rows = getattr(ctx, "rows", 0)
        freeze_to(ctx.model, -1 - ctx.rows // rows_per_epoch)
        ctx.optimizer.zero_grad()
        n = sum(len(mb[0]) for mb in micro_batches)
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) * (len(mb[0]) / n)).backward()
        ctx.optimizer.step()
        ctx.rows += n

    def optimizer(m):
        lrs = [1e-2 / 2.6 ** k for k in (3, 2, 1, 0)]
        groups = [{"params": list(g.parameters()), "lr": lr} for g, lr in zip(m.groups, lrs)]
        if optimizer_over_trainable_only:  # BUG: the groups unfrozen later are in no param group
            groups = [{"params": [p for p in grp["params"] if p.requires_grad], "lr": grp["lr"]} for grp in groups]
            groups = [grp for grp in groups if grp["params"]]
        return torch.optim.Adam(groups)

    torch.manual_seed(0)
    model = Staged()
    freeze_to(model, -1)
    return tropt.Setup(model, ce_loss, optimizer, feature_batches(), step=step, num_classes=CLASSES)


PORTS = [
    Port("beit_layerwise_lr_decay_bert", "finetune", "microsoft/unilm/beit/optim_factory.py", llrd_setup,
         needs=("transformers",),
         bugs=(Bug("llrd_scale_truncated_to_zero", "model.gradient_flow", ("learning rate 0",),
                   lambda: llrd_setup(truncate_scale=True),
                   source="an lr_scale rounded to an integer: the param groups below the top get lr 0"),)),
    Port("peft_lora_frozen_base", "finetune", "huggingface/peft/src/peft/tuners/lora/layer.py", lora_setup,
         bugs=(Bug("lora_a_and_b_both_zero", "model.gradient_flow", ("lora_A",),
                   lambda: lora_setup(zero_a=True),
                   source="peft's init_lora_weights: B starts at zero, so A must not (LoRA paper, section 4.1)"),)),
    Port("mae_linear_probe_frozen_encoder", "finetune", "facebookresearch/mae/main_linprobe.py", linprobe_setup,
         notes={"loop.accumulation": "the probe head's BatchNorm1d normalises by its batch (MAE's design)",
                "loop.ddp": "the same BatchNorm1d, per process",
                "model.overfit_batch": "LARS's trust ratio keeps each step small: still falling after 100 steps",
                "dynamics.lr_range": "LARS scales each step by the weight norm: the LR barely changes the loss"},
         bugs=(Bug("linprobe_optimizer_over_frozen_encoder", "model.gradient_flow",
                   ("has requires_grad=False", "are in no optimizer"),
                   lambda: linprobe_setup(optimize_encoder=True),
                   source="an optimizer over the frozen module: the head gets gradients, nothing updates it"),)),
    Port("fastai_ulmfit_gradual_unfreezing", "finetune", "fastai/fastai/fastai/learner.py", ulmfit_setup,
         bugs=(Bug("ulmfit_optimizer_misses_later_unfrozen_groups", "model.gradient_flow", ("never updated",),
                   lambda: ulmfit_setup(optimizer_over_trainable_only=True),
                   source="PyTorch forums: an optimizer built over filter(requires_grad) before unfreezing"),)),
]
