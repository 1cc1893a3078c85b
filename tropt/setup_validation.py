"""What a :class:`tropt.Setup` refuses, and why: the validation its constructor runs (a mixin, so setup.py holds
what a Setup does and this module what it accepts), and the optimizer-instance-to-factory conversion.

Every refusal is a :class:`tropt.errors.SetupError` saying what is wrong and how to fix it; the checks run in a
fixed order, so the first problem found is the one reported.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .errors import SetupError
from .training import PRECISION_DTYPES

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
# Several optimizers stepped in one training step (a GAN's discriminator then generator, an actor and a critic):
# a tuple or list of factories, or a dict name -> factory (the names appear in the checks' findings).
OptimizerFactories = tuple[OptimizerFactory, ...] | list[OptimizerFactory] | dict[str, OptimizerFactory]


def optimizer_entries(optimizer: Any) -> list[tuple[str, Any]]:
    """(name, factory) for each optimizer of a Setup's ``optimizer`` field: one entry "optimizer" for a single one,
    the dict's keys, or ``optimizers[i]`` for a tuple or list; empty for None."""
    if optimizer is None:
        return []
    if isinstance(optimizer, dict):
        return [(str(k), v) for k, v in optimizer.items()]
    if isinstance(optimizer, (tuple, list)):
        return [(f"optimizers[{i}]", v) for i, v in enumerate(optimizer)]
    return [("optimizer", optimizer)]


def positional_arity_ok(fn: Callable, n: int) -> bool:
    """Whether ``fn`` can be called with ``n`` positional arguments."""
    try:
        inspect.signature(fn).bind(*([None] * n))
        return True
    except TypeError:
        return False
    except ValueError:  # builtins without a signature: assume yes
        return True


def describe_callable(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def optimizer_factory_from(optimizer: torch.optim.Optimizer, model: nn.Module) -> OptimizerFactory:
    """Turn an optimizer instance into a factory that builds the same optimizer for a copy of ``model``.

    Parameter groups and their hyperparameters are kept (parameters matched by name); optimizer state
    (moments) is not, since checks start from a fresh optimizer.
    """
    name_of = {id(p): n for n, p in model.named_parameters()}
    groups = []
    for g in optimizer.param_groups:
        missing = [tuple(p.shape) for p in g["params"] if id(p) not in name_of]
        if missing:
            raise SetupError(f"Setup: the optimizer holds {len(missing)} parameter(s) that are not in the model "
                             f"(shapes {missing[:3]})",
                             "build the optimizer from this model's parameters, or pass a factory: "
                             "lambda m: torch.optim.AdamW(m.parameters())")
        hyper = {k: copy.deepcopy(v) for k, v in g.items() if k not in ("params", "initial_lr")}
        groups.append(([name_of[id(p)] for p in g["params"]], hyper))
    cls = type(optimizer)
    # Groups carry every hyperparameter; pass only the defaults the constructor accepts (some are derived).
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {k: copy.deepcopy(v) for k, v in optimizer.defaults.items() if k in accepted}

    def factory(m: nn.Module) -> torch.optim.Optimizer:
        params = dict(m.named_parameters())
        return cls([{"params": [params[n] for n in names], **hyper} for names, hyper in groups], **defaults)

    factory.__qualname__ = f"{cls.__name__}(from instance)"
    return factory


class SetupValidation:
    """The constructor-time validation of :class:`tropt.Setup` (its fields are declared there)."""

    def _validate_model(self: Any) -> None:  # self: the Setup (its fields are declared there)
        """Validate the model and loss_fn."""
        err = SetupError
        if not isinstance(self.model, nn.Module):
            raise err(
                f"Setup: model is a {type(self.model).__name__}, expected a torch.nn.Module",
                "pass the nn.Module itself (not its state_dict or a factory)",
            )
        if not any(True for _ in self.model.parameters()):
            raise err("Setup: the model has no parameters, so there is nothing to train",
                      "pass the model that holds the weights")
        meta = [n for n, t in [*self.model.named_parameters(), *self.model.named_buffers()] if t.is_meta]
        # Built under torch.device("meta"): shapes without data, nothing to copy, run or compare. (A model with some
        # tensors elsewhere spans devices: perf.memory explains that layout, so it is not refused here.)
        if meta and all(p.is_meta for p in self.model.parameters()):
            shown = ", ".join(meta[:5]) + (f" and {len(meta) - 5} more" if len(meta) > 5 else "")
            raise err(f"Setup: the model's tensors {shown} are on the meta device: they have shapes but no data, "
                      "so the model cannot be copied or trained",
                      "materialise it first: model.to_empty(device='cpu') then load its weights "
                      "(model.load_state_dict(...)) or initialise them (e.g. model.reset_parameters())")
        if not callable(self.loss_fn):
            raise err(f"Setup: loss_fn is a {type(self.loss_fn).__name__}, not callable",
                      "pass a function loss_fn(model, batch) -> scalar tensor, e.g. "
                      "lambda m, b: F.cross_entropy(m(b[0]), b[1])")
        if not positional_arity_ok(self.loss_fn, 2):
            raise err(
                f"Setup: loss_fn {describe_callable(self.loss_fn)} cannot be called as loss_fn(model, batch)",
                "give it exactly two positional parameters: (model, batch)",
            )

    def _validate_optimizer(self: Any) -> None:  # self: the Setup (its fields are declared there)
        """Validate the optimizer: a factory, an instance (copied into a factory), or None with a step of one's own;
        or several of them (a tuple, list or dict), each validated the same way."""
        opt = self.optimizer
        if isinstance(opt, (tuple, list, dict)):
            self._validate_optimizers(opt)
            return
        self._validate_one_optimizer(opt)
        if isinstance(self.scheduler, (tuple, list, dict)):
            raise SetupError(f"Setup: scheduler is a {type(self.scheduler).__name__} of factories but there is one "
                             "optimizer", "pass one scheduler factory, or one optimizer factory per scheduler")
        if isinstance(opt, torch.optim.Optimizer):
            object.__setattr__(self, "optimizer", optimizer_factory_from(opt, self.model))

    def _validate_optimizers(self: Any, opts: Any) -> None:  # self: the Setup
        """Several optimizers: each entry a factory or an instance (turned into a factory), a step of one's own,
        and a scheduler factory per optimizer (a tuple or dict matching them) or one for all."""
        err = SetupError
        entries = optimizer_entries(opts)
        if not entries:
            raise err(f"Setup: optimizer is an empty {type(opts).__name__}",
                      "pass one factory, several (optimizer=(make_d, make_g)), or None with a step of your own")
        if isinstance(opts, dict) and not all(isinstance(k, str) for k in opts):
            raise err("Setup: the keys of an optimizer dict name the optimizers; they must be strings",
                      "e.g. optimizer={'D': make_d, 'G': make_g}")
        for name, o in entries:
            if o is None:
                raise err(f"Setup: {name} is None", "give every optimizer a factory, or leave it out")
            self._validate_one_optimizer(o, name)
        if self.step is None:
            names = ", ".join(n for n, _ in entries)
            raise err(f"Setup: {len(entries)} optimizers ({names}) need your own step: tropt.standard_step steps one "
                      "optimizer on one loss",
                      "pass step=step(ctx, micro_batches) that steps each one (opt_d, opt_g = ctx.optimizers), as in "
                      "the README's 'Fitting your loop'")
        as_factory = [optimizer_factory_from(o, self.model) if isinstance(o, torch.optim.Optimizer) else o
                      for _, o in entries]
        normalised = (dict(zip(opts, as_factory, strict=True)) if isinstance(opts, dict) else tuple(as_factory))
        object.__setattr__(self, "optimizer", normalised)
        sched = self.scheduler
        if isinstance(sched, (tuple, list, dict)):
            keys = list(sched) if isinstance(sched, dict) else list(range(len(sched)))
            want = list(opts) if isinstance(opts, dict) else list(range(len(entries)))
            if isinstance(sched, dict) != isinstance(opts, dict) or keys != want:
                raise err(f"Setup: scheduler holds {len(keys)} entr{'y' if len(keys) == 1 else 'ies'} ({keys}) but "
                          f"optimizer has {len(entries)} ({want})",
                          "give one scheduler factory (or None) per optimizer, in the same form and order, or one "
                          "factory for all of them")

    def _validate_one_optimizer(self: Any, opt: Any, name: str = "optimizer") -> None:  # self: the Setup
        err = SetupError
        if opt is None:
            if self.step is None:
                raise err("Setup: optimizer=None needs your own step: tropt.standard_step updates through an optimizer",
                          "pass optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=...), "
                          "or step=step(ctx, micro_batches) that updates the parameters by hand "
                          "(ctx.optimizer is then None)")
            if self.scheduler is not None:
                raise err("Setup: a scheduler needs an optimizer, but optimizer=None",
                          "pass the optimizer factory too, or set the learning rate by hand in your step and leave "
                          "scheduler=None")
        elif isinstance(opt, torch.optim.Optimizer):
            return
        elif isinstance(opt, type) and issubclass(opt, torch.optim.Optimizer):
            raise err(
                f"Setup: {name} is the class {opt.__name__}, expected a factory",
                f"pass lambda m: torch.optim.{opt.__name__}(m.parameters(), lr=...)",
            )
        elif not callable(opt):
            raise err(
                f"Setup: {name} is a {type(opt).__name__}, expected a factory optimizer(model) -> Optimizer",
                "pass lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3)",
            )

    def _validate_callables(self: Any) -> None:  # self: the Setup (its fields are declared there)
        """Validate the data, the scheduler factory and the step function."""
        err = SetupError
        self._check_data("train_data", self.train_data, required=True)
        self._check_data("val_data", self.val_data, required=False)
        scheds = (list(self.scheduler.values()) if isinstance(self.scheduler, dict) else list(self.scheduler)
                  if isinstance(self.scheduler, (tuple, list)) else [self.scheduler])
        for sched in scheds:
            self._check_scheduler(sched)
        if self.step is not None:
            if not callable(self.step):
                raise err(f"Setup: step is a {type(self.step).__name__}, not callable",
                          "pass a function step(ctx, micro_batches), or None for tropt.standard_step")
            if not positional_arity_ok(self.step, 2):
                raise err(f"Setup: step {describe_callable(self.step)} cannot be called as step(ctx, micro_batches)",
                          "define it as def step(ctx, micro_batches): ... (ctx is a tropt.StepContext, micro_batches "
                          "a list of batches)")

    @staticmethod
    def _check_scheduler(sched: Any) -> None:
        err = SetupError
        if sched is not None:
            if hasattr(sched, "step") and hasattr(sched, "optimizer"):
                raise err(f"Setup: scheduler is a {type(sched).__name__} instance, expected a factory",
                          "pass lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=10) so checks can build "
                          "fresh ones")
            if not callable(sched):
                raise err(f"Setup: scheduler is a {type(sched).__name__}, not callable",
                          "pass a factory scheduler(optimizer) -> scheduler, or None")

    def _validate_numbers(self: Any) -> None:  # self: the Setup (its fields are declared there)
        """Validate accumulation, clipping, precision and the batch layout."""
        err = SetupError
        k = self.accumulation_steps
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise err(f"Setup: accumulation_steps={k!r}; it must be an integer >= 1", "use 1 for no accumulation")
        if self.accumulation not in ("batches", "split"):
            raise err(f"Setup: accumulation={self.accumulation!r}; it must be 'batches' or 'split'",
                      "'batches' (the default, as Hugging Face and Lightning do): each optimizer step takes K "
                      "consecutive loader batches; 'split': each loader batch is cut into K micro-batches")
        spe = self.steps_per_epoch
        if spe is not None and (isinstance(spe, bool) or not isinstance(spe, int) or spe < 1):
            raise err(f"Setup: steps_per_epoch={spe!r}; it must be an integer >= 1 or None",
                      "pass the optimizer steps in one epoch of your training, or None to read it from the DataLoader")
        clip = self.grad_clip
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                                 or not (math.isfinite(clip) and clip > 0)):
            raise err(f"Setup: grad_clip={clip!r}; it must be a positive finite number or None",
                      "e.g. grad_clip=1.0, or None to disable clipping")
        if self.precision not in PRECISION_DTYPES:
            raise err(f"Setup: unknown precision {self.precision!r}", f"use one of {', '.join(PRECISION_DTYPES)}")
        # use_scaler with fp32/bf16 is a legal loop (AMP turned off, scaler kept): loop.loss_scaling warns about it.
        if isinstance(self.batch_dim, bool) or not isinstance(self.batch_dim, int) or self.batch_dim < 0:
            raise err(f"Setup: batch_dim={self.batch_dim!r}; it must be an integer >= 0",
                      "use 0 for (batch, ...) tensors, 1 for time-major (seq, batch, ...) tensors")
        if (self.split_fn is None) != (self.size_fn is None):
            raise err("Setup: split_fn and size_fn must be given together",
                      "pass both: split_fn(batch, sizes) -> list of micro-batches and size_fn(batch) -> number of "
                      "samples")
        for name in ("split_fn", "size_fn", "join_fn"):
            fn = getattr(self, name)
            if fn is not None and (not callable(fn) or not positional_arity_ok(fn, 2 if name == "split_fn" else 1)):
                sig = {"split_fn": "split_fn(batch, sizes) -> list", "size_fn": "size_fn(batch) -> int",
                       "join_fn": "join_fn(batches) -> batch"}[name]
                raise err(f"Setup: {name} cannot be called as {sig}", f"define it as {sig}")

    def _validate_device(self: Any) -> None:  # self: the Setup (its fields are declared there)
        """Validate the device (normalised to a torch.device)."""
        err = SetupError
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise err(f"Setup: device={self.device!r} is not a torch device ({exc})",
                      "use 'cpu', 'cuda' or 'cuda:N'") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise err(f"Setup: device={self.device!r} but CUDA is not available here",
                      "use device='cpu', or install a CUDA build of torch")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise err(f"Setup: device={self.device!r} but MPS is not available here", "use device='cpu'")
        object.__setattr__(self, "device", device)

    def _validate_options(self: Any) -> None:  # self: the Setup (its fields are declared there)
        """Validate the remaining options: classes, checkpoint hooks, seed, metric, flags, batch size."""
        err = SetupError
        if self.num_classes is not None and (isinstance(self.num_classes, bool)
                                             or not isinstance(self.num_classes, int) or self.num_classes < 2):
            raise err(f"Setup: num_classes={self.num_classes!r}; it must be an integer >= 2 or None",
                      "pass the number of output classes, or None for non-classification")
        if (self.save_state is None) != (self.load_state is None):
            raise err("Setup: save_state and load_state must be given together",
                      "pass both (save_state(ctx) -> state, load_state(ctx, state)) or neither")
        for name in ("save_state", "load_state"):
            fn = getattr(self, name)
            if fn is not None and (not callable(fn) or not positional_arity_ok(fn, 1 if name == "save_state" else 2)):
                sig = "save_state(ctx) -> state" if name == "save_state" else "load_state(ctx, state)"
                raise err(f"Setup: {name} cannot be called as {sig}", f"define it as {sig}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise err(f"Setup: seed={self.seed!r}; it must be an integer", "e.g. seed=0")
        from .metric import Metric

        if self.metric is not None and not isinstance(self.metric, Metric):
            if callable(self.metric):
                raise err(f"Setup: metric is a plain {type(self.metric).__name__}; tropt needs to know its direction",
                          "wrap it: metric=tropt.Metric(fn, higher_is_better=True)  (False for losses and errors)")
            raise err(f"Setup: metric is a {type(self.metric).__name__}, expected a tropt.Metric",
                      "pass metric=tropt.Metric(fn, higher_is_better=...) or None")
        if not isinstance(self.eval_augmentation, bool):
            raise err(f"Setup: eval_augmentation={self.eval_augmentation!r}; it must be True or False",
                      "pass eval_augmentation=True only when random test-time augmentation is intended")
        if self.eval_augmentation and self.val_data is None:
            raise err("Setup: eval_augmentation=True but there is no val_data whose transforms it would describe",
                      "pass val_data=..., or drop eval_augmentation")
        if not isinstance(self.distributed, bool):
            raise err(f"Setup: distributed={self.distributed!r}; it must be True or False",
                      "pass distributed=True for a loop meant for DDP")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise err(f"Setup: batch_size={self.batch_size!r}; it must be an integer >= 1", "e.g. batch_size=32")

    @staticmethod
    def _check_data(name: str, data: Any, required: bool) -> None:
        if data is None:
            if required:
                raise SetupError(f"Setup: {name} is None", "pass a DataLoader, a Dataset or a list of batches")
            return
        if isinstance(data, torch.utils.data.IterableDataset) or (
            not isinstance(data, torch.utils.data.DataLoader) and inspect.isgenerator(data)
        ) or isinstance(data, Iterator):
            raise SetupError(
                f"Setup: {name} is a one-shot iterator ({type(data).__name__}); checks need to read it more than once",
                "pass a DataLoader, a map-style Dataset or a list of batches",
            )
        if isinstance(data, torch.utils.data.DataLoader):
            try:
                n = len(data)
            except TypeError:
                return
            if n == 0:
                raise SetupError(f"Setup: {name} is a DataLoader with no batches",
                                 "check the dataset is not empty and drop_last/batch_size leave a batch")
            return
        if not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
            raise SetupError(f"Setup: {name} is a {type(data).__name__}, expected a DataLoader, a map-style Dataset "
                             "or a list of batches",
                             "wrap your data in a torch.utils.data.DataLoader")
        if len(data) == 0:
            raise SetupError(f"Setup: {name} is empty", "pass at least one batch")
