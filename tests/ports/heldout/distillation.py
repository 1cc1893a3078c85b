"""Knowledge-distillation ports (held-out probe "vision"): a frozen teacher in eval mode, a student trained on
KL(teacher || student at temperature T) * T^2 plus hard-label cross entropy. Paraphrased, never copied.

- ``kd_tutorial``: pytorch/tutorials ``beginner_source/knowledge_distillation_tutorial.py``
  (``train_knowledge_distillation``): teacher and student are separate modules
  ``teacher.eval()``,
  ``student.train()``; the teacher's logits under ``torch.no_grad()``; soft targets ``softmax(t / T)``, the student's
  ``log_softmax(s / T)``
  ``sum(p_t * (log p_t - log p_s)) / batch * T**2`` weighted 0.25, CE weighted 0.75
  Adam.
  The Setup's model is the student; the teacher lives in the closure (as in the tutorial's function arguments).
- ``kd_wrapper_frozen_teacher``: haitongli/knowledge-distillation-pytorch ``train.py`` ``train_kd`` with
  ``net.loss_fn_kd`` (``KLDivLoss()(log_softmax(s/T), softmax(t/T)) * alpha * T * T + CE * (1 - alpha)``), but with
  teacher and student in one ``Distiller`` module (torchdistill / HF-style distillation wrappers): the teacher's
  parameters ``requires_grad_(False)``, its ``train()`` override keeping the teacher in eval, SGD over the student's
  parameters only, MultiStepLR stepped per epoch.

Planted bugs:
- ``kd_teacher_left_in_train_mode`` (wrapper): no ``train()`` override, so ``model.train()`` puts the frozen teacher
  (dropout + BatchNorm) into training mode: its soft targets are re-drawn through dropout on every forward and its
  BatchNorm running statistics drift with the student's batches (a frequent KD bug: e.g. the discussion in
  haitongli/knowledge-distillation-pytorch issues and the PyTorch forum thread "teacher model in train mode during
  distillation"). Expected: ``loop.train_mode`` (a module that *changes state* in a training step, frozen or not).
- ``kd_teacher_not_under_no_grad_and_unfrozen`` (tutorial): the teacher's parameters are in the optimizer too
  (``Adam(list(student.parameters()) + list(teacher.parameters()))`` -- a port error), so the teacher drifts.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port
from ports.heldout.vision_data import C, accuracy, image_batches


class Teacher(nn.Module):
    """The tutorial's DeepNN, tiny: conv-BN-ReLU x2, pooling, a dropout classifier."""

    def __init__(self, w: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(),
                                      nn.Conv2d(w, w, 3, padding=1, stride=2), nn.BatchNorm2d(w), nn.ReLU())
        self.classifier = nn.Sequential(nn.Linear(w * 16, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, C))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class Student(nn.Module):
    """The tutorial's LightNN, tiny: one conv, pooling, a dropout classifier."""

    def __init__(self, w: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Linear(w * 16, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, C))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


_TEACHER: dict = {}


def pretrained_teacher() -> Teacher:
    """A teacher trained for 60 Adam steps on generated images (stands in for the tutorial's trained DeepNN)."""
    if "t" not in _TEACHER:
        torch.manual_seed(123)
        t = Teacher()
        opt = torch.optim.Adam(t.parameters(), 3e-3)
        data = image_batches(6, seed=7)
        t.train()
        for i in range(60):
            x, y = data[i % 6]
            opt.zero_grad()
            F.cross_entropy(t(x), y).backward()
            opt.step()
        t.eval()
        _TEACHER["t"] = t
    return copy.deepcopy(_TEACHER["t"])


T, SOFT_W, CE_W = 2.0, 0.25, 0.75


def tutorial_kd_loss(student_logits, teacher_logits, labels):
    soft_targets = F.softmax(teacher_logits / T, dim=-1)
    soft_prob = F.log_softmax(student_logits / T, dim=-1)
    soft = torch.sum(soft_targets * (soft_targets.log() - soft_prob)) / soft_prob.size(0) * T ** 2
    return SOFT_W * soft + CE_W * F.cross_entropy(student_logits, labels)


def kd_tutorial_setup(*, teacher_in_optimizer: bool = False) -> tropt.Setup:
    """pytorch/tutorials knowledge_distillation_tutorial.py ``train_knowledge_distillation``."""
    teacher = pretrained_teacher()

    def loss_fn(student, batch):
        x, y = batch
        with torch.no_grad():
            t_logits = teacher(x)
        return tutorial_kd_loss(student(x), t_logits, y)

    def step(ctx, micro_batches):
        teacher.eval()  # the tutorial: teacher.eval() (evaluation mode) and student.train()
        ctx.optimizer.zero_grad()
        n = sum(ctx.batch_size(mb) for mb in micro_batches)
        for mb in micro_batches:
            loss = ctx.loss_fn(ctx.model, mb) * ctx.batch_size(mb) / n
            loss.backward()
        ctx.optimizer.step()
        return loss.detach()

    def opt(m):
        if teacher_in_optimizer:  # BUG: the teacher's weights handed to the student's optimizer
            return torch.optim.Adam(list(m.parameters()) + list(teacher.parameters()), lr=1e-3)
        return torch.optim.Adam(m.parameters(), lr=1e-3)

    torch.manual_seed(0)
    return tropt.Setup(Student(), loss_fn, opt, image_batches(3), val_data=image_batches(2, seed=1), step=step,
                       num_classes=C, metric=tropt.Metric(accuracy, higher_is_better=True, name="acc"))


class Distiller(nn.Module):
    """teacher + student in one module; forward is the student's (what is evaluated and deployed)."""

    def __init__(self, teacher: nn.Module, student: nn.Module, hold_teacher_eval: bool = True) -> None:
        super().__init__()
        self.teacher, self.student = teacher, student
        self.hold_teacher_eval = hold_teacher_eval
        for p in self.teacher.parameters():
            p.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.hold_teacher_eval:
            self.teacher.eval()  # the teacher stays in eval whatever the trainer toggles
        return self

    def forward(self, x):
        return self.student(x)


ALPHA = 0.9


def loss_fn_kd(m: Distiller, batch):
    """haitongli's ``loss_fn_kd``: KLDivLoss() (element mean) on softened outputs * alpha T^2 + CE * (1 - alpha)."""
    x, y = batch
    with torch.no_grad():
        t_out = m.teacher(x)
    s_out = m.student(x)
    kd = nn.KLDivLoss(reduction="batchmean")(F.log_softmax(s_out / T, dim=1), F.softmax(t_out / T, dim=1))
    return kd * (ALPHA * T * T) + F.cross_entropy(s_out, y) * (1.0 - ALPHA)


def kd_wrapper_setup(*, hold_teacher_eval: bool = True) -> tropt.Setup:
    """haitongli/knowledge-distillation-pytorch train.py ``train_kd``: ``model.train()`` each epoch, teacher logits
    under no_grad, ``optimizer.zero_grad()
    loss.backward()
    optimizer.step()``
    SGD(momentum 0.9, wd 5e-4) on the
    student; StepLR stepped once per epoch."""
    steps_per_epoch = 3

    def step(ctx, micro_batches):
        ctx.model.train()  # train_kd: model.train() (Distiller.train keeps the teacher in eval)
        ctx.optimizer.zero_grad()
        n = sum(ctx.batch_size(mb) for mb in micro_batches)
        for mb in micro_batches:
            loss = ctx.loss_fn(ctx.model, mb) * ctx.batch_size(mb) / n
            loss.backward()
        ctx.optimizer.step()
        ctx.it = getattr(ctx, "it", 0) + 1
        if ctx.it % steps_per_epoch == 0:
            ctx.scheduler.step()
        return loss.detach()

    torch.manual_seed(0)
    model = Distiller(pretrained_teacher(), Student(), hold_teacher_eval=hold_teacher_eval)
    return tropt.Setup(model, loss_fn_kd,
                       lambda m: torch.optim.SGD(m.student.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4),
                       image_batches(3), val_data=image_batches(2, seed=1),
                       scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=100, gamma=0.2), step=step,
                       num_classes=C, metric=tropt.Metric(accuracy, higher_is_better=True, name="acc"))


TUT = "pytorch/tutorials/beginner_source/knowledge_distillation_tutorial.py"
HAI = "haitongli/knowledge-distillation-pytorch/train.py"

PORTS: list[Port] = [
    Port("kd_tutorial", "distillation", TUT, kd_tutorial_setup, bugs=(
        Bug("kd_teacher_in_student_optimizer", "model.gradient_flow", ("teacher",),
            lambda: kd_tutorial_setup(teacher_in_optimizer=True),
            source=f"{TUT}: optimizer = optim.Adam(student.parameters(), ...), teacher's parameters added"),
    )),
    Port("kd_wrapper_frozen_teacher", "distillation", HAI, kd_wrapper_setup,
         notes={"loop.scheduler_cadence": "StepLR stepped once per epoch"}, bugs=(
             Bug("kd_teacher_left_in_train_mode", "loop.train_mode", ("teacher",),
                 lambda: kd_wrapper_setup(hold_teacher_eval=False),
                 source=f"{HAI}: train_kd calls teacher_model.eval(); a wrapper whose model.train() reaches the "
                        "teacher puts its dropout and BatchNorm back in training mode"),
         )),
]
