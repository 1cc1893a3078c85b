"""``Setup``: everything a model-side check needs, given once, validated at construction and at first use.

Checks never touch the user's objects: :meth:`Setup.build` makes a fresh deep copy of the model with a new
optimizer, scheduler and scaler from the user's factories, and :meth:`Setup.batches` reads the training data
deterministically (seeded) for reproducible comparisons.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import torch
from torch import nn

from .core.accelerate import accelerate_told
from .core.batch import BatchLayout, join_batches, remember_parts, to_device
from .core.compiled import mark_batch_dynamic
from .errors import SetupError, StepError, TroptError
from .setup_validation import (
    OptimizerFactories,
    OptimizerFactory,
    SetupValidation,
    describe_callable,
    optimizer_entries,
)
from .setup_validation import optimizer_factory_from as optimizer_factory_from  # re-exported: integrations use it
from .snapshot import copy_module
from .training import StepContext, standard_step


@dataclass(frozen=True, eq=False)
class Setup(SetupValidation):
    """A training setup to diagnose.

    Parameters
    ----------
    model
        The ``nn.Module``; checks work on deep copies, the original is never touched.
    loss_fn
        ``loss_fn(model, batch) -> scalar loss tensor`` (covers tuples, dicts, HF-style models).
    optimizer
        ``optimizer(model) -> torch.optim.Optimizer``, a factory so param groups are the user's. An optimizer
        instance built on ``model`` is accepted too and turned into a factory (its state is not copied). None for
        a step that updates the parameters by hand (``ctx.optimizer`` is then None; checks observe the update as
        the parameter change around the step). Several optimizers stepped in one training step (a GAN's
        discriminator then generator, an actor and a critic): a tuple or list of factories, or a dict
        ``{"D": make_d, "G": make_g}`` whose keys name them in findings; they need your own ``step``, which reads
        them as ``opt_d, opt_g = ctx.optimizers`` (``ctx.optimizer`` is the first). One call of the step is one
        training step whichever optimizers it steps; every check observes every optimizer's update, and a
        parameter counts as updated when any optimizer holds it. An optimizer the step builds itself and keeps
        on ``ctx`` (``ctx.opt_g``) is observed the same way.
    train_data
        A DataLoader, a map-style Dataset (batched by ``batch_size``, drawn in a seeded shuffled order), or a list
        of batches.
    val_data
        Optional validation data, same forms as ``train_data``.
    scheduler
        ``scheduler(optimizer) -> LR scheduler`` or None; stepped once per optimizer step by :func:`standard_step`.
        With several optimizers: one factory (each optimizer gets its own scheduler from it), or a tuple/dict of
        factories (None where an optimizer has none) matching ``optimizer``; ``ctx.schedulers`` holds them.
    step
        The user's own step ``step(ctx, micro_batches) -> loss or None``; None means :func:`standard_step`.
    accumulation_steps
        Micro-batches per optimizer step (>= 1): the K of your loop.
    accumulation
        What one optimizer step reads when ``accumulation_steps=K > 1``. ``"batches"`` (the default, what Hugging
        Face's ``gradient_accumulation_steps``, Lightning's ``accumulate_grad_batches`` and most hand-written loops
        do): each optimizer step takes K consecutive loader batches, each one micro-batch, so the effective batch is
        K times the loader's; checks see the step's batch as those K batches joined (:meth:`batches`), and
        :meth:`split` into K gives the loader's own batches back. ``"split"``: each loader batch is cut into K
        micro-batches, so the effective batch is the loader's.
    steps_per_epoch
        Optimizer steps in one epoch of your training, or None to read it from the data: ``len(train_data) // K``
        with ``accumulation="batches"``, ``len(train_data)`` with ``"split"``. A schedule's horizon is set beside it.
    grad_clip
        Max global gradient norm, or None.
    precision
        "fp32", "bf16" or "fp16" (autocast).
    use_scaler
        Use a ``torch.amp.GradScaler`` (only needed with fp16; accepted with fp32/bf16, where loop.loss_scaling warns
        that it is unnecessary).
    num_classes
        Number of classes, when the objective is classification.
    save_state, load_state
        ``save_state(ctx) -> state`` and ``load_state(ctx, state) -> None`` for the resume check; both or neither.
    device
        Where checks run ("cpu", "cuda", "cuda:1", ...).
    seed
        Seed for every copy and data order a check makes.
    batch_size
        Batch size used only when ``train_data``/``val_data`` is a Dataset rather than a DataLoader or list.
    metric
        A :class:`tropt.Metric` (``fn(model, val_data) -> float`` and its direction), or None: the score stage 2
        (``model.eval_metric``) checks and stage 7 (``tropt.compare``) selects by.
    eval_augmentation
        True when random transforms in evaluation are meant (test-time augmentation); ``data.eval_transforms``
        then accepts them. Needs ``val_data``.
    distributed
        True when the loop is meant to run under DistributedDataParallel: ``loop.ddp`` then WARNs about wasted
        all-reduces (communication only); otherwise that finding is a latent note.
    batch_dim
        The dimension along which every batch tensor holds its samples (1 for time-major ``(seq, batch)``
        batches; a flattened ``(seq * batch,)`` target beside them is split as ``(seq, batch)``).
    split_fn, size_fn
        For layouts tropt cannot infer: ``split_fn(batch, sizes) -> list of micro-batches`` (contiguous, holding
        ``sizes[i]`` samples each) and ``size_fn(batch) -> number of samples``; given together.
    join_fn
        ``join_fn(list of loader batches) -> one batch`` for ``accumulation="batches"`` when tropt cannot join them
        (batches padded to different lengths, a ``split_fn`` layout); the loader's batches themselves are still
        what the step receives.
    """

    model: nn.Module
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    optimizer: OptimizerFactory | OptimizerFactories | None = None
    train_data: Any = None
    val_data: Any = None
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None
    step: Callable[[StepContext, list], Any] | None = None
    _: KW_ONLY
    accumulation_steps: int = 1
    accumulation: str = "batches"
    steps_per_epoch: int | None = None
    grad_clip: float | None = None
    precision: str = "fp32"
    use_scaler: bool = False
    num_classes: int | None = None
    save_state: Callable[[StepContext], Any] | None = None
    load_state: Callable[[StepContext, Any], None] | None = None
    device: str | torch.device = "cpu"
    seed: int = 0
    batch_size: int = 32
    metric: Any = None
    eval_augmentation: bool = False
    distributed: bool = False
    batch_dim: int = 0
    split_fn: Callable[[Any, list[int]], list] | None = None
    size_fn: Callable[[Any], int] | None = None
    join_fn: Callable[[list], Any] | None = None
    _validated: dict = field(default_factory=dict, init=False, repr=False)

    # ------------------------------------------------------------------ construction-time validation
    def __post_init__(self) -> None:
        # Validation in this order: the first problem found is the one reported.
        self._validate_model()
        self._validate_optimizer()
        self._validate_callables()
        self._validate_numbers()
        self._validate_device()
        self._validate_options()

    # ------------------------------------------------------------------ helpers for checks
    def replace(self, **changes: Any) -> Setup:
        """A new Setup with some fields changed (the original is unchanged)."""
        return dataclasses.replace(self, **changes)

    @property
    def layout(self) -> BatchLayout:
        """Where batches keep their samples (``batch_dim`` or ``split_fn``/``size_fn``)."""
        return BatchLayout(self.batch_dim, self.split_fn, self.size_fn)

    def size(self, batch: Any) -> int:
        """The number of samples in ``batch``, by the Setup's layout."""
        return self.layout.size(batch)

    def split(self, batch: Any, k: int | None = None, *, sizes: list[int] | None = None) -> list:
        """Split ``batch`` into ``k`` (or ``sizes``) contiguous micro-batches, by the Setup's layout."""
        return self.layout.split(batch, k, sizes=sizes)

    @property
    def _dynamic_dim(self) -> int | None:
        """The batch dimension a compiled model may treat as dynamic; None for a layout only split_fn knows."""
        return None if self.split_fn is not None else self.batch_dim

    @property
    def loader_batches_per_step(self) -> int:
        """Loader batches one optimizer step reads: K with ``accumulation="batches"``, else 1."""
        return self.accumulation_steps if self.accumulation == "batches" else 1

    def epoch_steps(self) -> tuple[int | None, str]:
        """Optimizer steps per epoch and where the number comes from: ``steps_per_epoch`` when given, else the
        training data's length over :attr:`loader_batches_per_step`; ``(None, "unknown")`` without a length."""
        if self.steps_per_epoch is not None:
            return self.steps_per_epoch, "Setup(steps_per_epoch=)"
        try:
            n = len(self.loader("train"))
        except (TypeError, AttributeError, NotImplementedError, TroptError):  # an iterable without length, no data
            return None, "unknown"
        per = self.loader_batches_per_step
        return (max(1, n // per) if n else None), "len(train_data)" + (f" // {per}" if per > 1 else "")

    @property
    def step_fn(self) -> Callable[[StepContext, list], Any]:
        """The step under test: the user's, or :func:`standard_step`."""
        return self.step if self.step is not None else standard_step

    @property
    def uses_standard_step(self) -> bool:
        return self.step is None or self.step is standard_step

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Call ``loss_fn`` and check it gave a scalar tensor; errors from user code name where they came from."""
        batch = mark_batch_dynamic(model, [batch], self._dynamic_dim)[0]
        try:
            loss = self.loss_fn(model, batch)
        except TroptError:
            raise
        except Exception as exc:
            raise StepError(f"loss_fn raised {type(exc).__name__}: {exc}",
                            "fix loss_fn; tropt calls it as loss_fn(model, batch) with one batch of train_data on the "
                            "Setup's device") from exc
        if not isinstance(loss, torch.Tensor):
            raise StepError(
                f"Setup: loss_fn returned a {type(loss).__name__}, expected a scalar tensor",
                "return the loss tensor itself (not loss.item())",
            )
        if loss.numel() != 1:
            raise StepError(
                f"Setup: loss_fn returned a tensor of shape {tuple(loss.shape)}, expected a scalar",
                "reduce it with .mean() or .sum()",
            )
        return loss.reshape(())

    def loader(self, which: str = "train") -> Any:
        """The train or val data as something iterable over batches (a Dataset is wrapped in a DataLoader)."""
        data = self.train_data if which == "train" else self.val_data
        if data is None:
            raise SetupError(f"Setup: no {which}_data was given", f"pass {which}_data=... to Setup")
        if isinstance(data, torch.utils.data.Dataset) and not isinstance(data, torch.utils.data.DataLoader):
            # Training draws shuffled batches, as a training loop would (a Dataset sorted by class would otherwise give
            # one-class batches); the order is seeded by batches(). Validation keeps its order.
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size, shuffle=which == "train")
        return data

    def batches(self, n: int | None = None, *, which: str = "train", seed: int | None = None,
                cycle: bool = True) -> Iterator[Any]:
        """Yield ``n`` batches (all of one pass when None) on the Setup's device, in a seeded order.

        Training data with ``accumulation="batches"`` and K > 1 yields one batch per optimizer step: K consecutive
        loader batches joined (:func:`tropt.core.batch.join_batches`), which ``split(batch, K)`` gives back as they
        came. Groups run on across passes when cycling; one pass (``n`` None or ``cycle=False``) ends with the
        remainder, a shorter group.

        Reading a shuffling DataLoader draws from the global torch RNG; callers that must not disturb it run
        inside :func:`tropt.snapshot.preserved` (every check does). A shuffling generator the user gave the
        DataLoader or its sampler is seeded for the read and put back when the iteration ends.
        """
        per = self.loader_batches_per_step if which == "train" else 1
        if per > 1:
            source = self._read(n if n is None else n * per, which, seed, cycle)
            try:
                yield from self._groups(source, per)
            finally:  # the read's own cleanup (the user's generators put back) runs now, not when collected
                source.close()
            return
        yield from self._read(n, which, seed, cycle)

    def _groups(self, source: Iterator[Any], per: int) -> Iterator[Any]:
        """``per`` consecutive batches of ``source`` at a time, joined into one (the last group may be shorter)."""
        while True:
            parts = list(itertools.islice(source, per))
            if not parts:
                return
            yield remember_parts(join_batches(parts, self.layout, self.join_fn), [self.size(p) for p in parts],
                                 parts if self.join_fn is not None and len(parts) > 1 else None)

    def _read(self, n: int | None, which: str, seed: int | None, cycle: bool) -> Generator[Any, None, None]:
        """The loader's own batches: ``n`` of them (one pass when None), seeded as :meth:`batches` says."""
        data = self.loader(which)
        seed = self.seed if seed is None else seed
        own = [g for g in (getattr(data, "generator", None), getattr(getattr(data, "sampler", None), "generator", None))
               if isinstance(g, torch.Generator)]
        saved = [g.get_state() for g in own]
        torch.manual_seed(seed)
        for g in own:
            g.manual_seed(seed)
        produced = 0
        try:
            for _ in itertools.count():
                got_any = False
                for batch in data:
                    got_any = True
                    yield to_device(batch, self.device)
                    produced += 1
                    if n is not None and produced >= n:
                        return
                if not got_any:
                    raise SetupError(f"Setup: {which}_data yielded no batches", "check the dataset is not empty")
                if n is None or not cycle:
                    return
        finally:
            for g, state in zip(own, saved):
                g.set_state(state)

    def sample_batch(self, which: str = "train") -> Any:
        """The first batch of the (seeded) data order, on the Setup's device (the global RNG is left as it was)."""
        from .snapshot import preserved

        with preserved():
            return next(self.batches(1, which=which))

    def build(self, *, seed: int | None = None, init_scale: float | None = None, model: nn.Module | None = None,
              accumulation_steps: int | None = None) -> StepContext:
        """Fresh training objects for a check: a deep copy of the model, and a new optimizer/scheduler/scaler.

        Seeding first makes two builds with the same seed start from identical states.
        """
        torch.manual_seed(self.seed if seed is None else seed)
        copy_ = copy_module(self.model if model is None else model).to(self.device)
        if self.optimizer is None:
            return self._context(copy_, [], [], init_scale, accumulation_steps)
        entries = optimizer_entries(self.optimizer)
        opts = [self._build_optimizer(name, factory, copy_, len(entries), self.model) for name, factory in entries]
        scheds = self.scheduler
        per_opt = (list(scheds.values()) if isinstance(scheds, dict) else list(scheds)
                   if isinstance(scheds, (tuple, list)) else [scheds] * len(opts))
        return self._context(copy_, list(zip((n for n, _ in entries), opts, strict=True)),
                             [self._build_scheduler(f, o) for f, o in zip(per_opt, opts, strict=True)],
                             init_scale, accumulation_steps)

    @staticmethod
    def _build_optimizer(name: str, factory: Any, copy_: nn.Module, n: int,
                         original: nn.Module | None = None) -> torch.optim.Optimizer:
        """One optimizer from its factory, checked: an Optimizer over the copy's own parameters."""
        which = "the optimizer factory" if n == 1 else f"the optimizer factory {name}"
        try:
            opt = factory(copy_)
        except Exception as exc:
            raise StepError(f"{which} raised {type(exc).__name__}: {exc}",
                            "it is called as optimizer(model) with a copy of the model") from exc
        if isinstance(opt, (tuple, list)) and opt and all(isinstance(o, torch.optim.Optimizer) for o in opt):
            kinds = ", ".join(type(o).__name__ for o in opt)
            raise SetupError(
                f"Setup: {which} returned a {type(opt).__name__} of {len(opt)} optimizers ({kinds}); tropt expects "
                "one optimizer per Setup factory",
                "when they step one after the other (a GAN's D then G), pass one factory each: "
                "Setup(optimizer=(lambda m: torch.optim.Adam(m.netD.parameters()), lambda m: torch.optim.Adam("
                "m.netG.parameters())), step=...) and read them in your step as opt_d, opt_g = ctx.optimizers; "
                "when they step together on one loss, merge them into one optimizer with one param group per part, "
                "e.g. lambda m: torch.optim.AdamW([{'params': m.encoder.parameters(), 'lr': 1e-4}, "
                "{'params': m.head.parameters(), 'lr': 1e-3}])",
            )
        if not isinstance(opt, torch.optim.Optimizer):
            raise SetupError(
                f"Setup: {which} returned a {type(opt).__name__}, expected a torch.optim.Optimizer",
                "return the optimizer, e.g. lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3)",
            )
        own = {id(p) for p in copy_.parameters()}
        foreign = sum(1 for g in opt.param_groups for p in g["params"] if id(p) not in own)
        if foreign:
            orig = {id(p) for p in original.parameters()} if original is not None else set()
            elsewhere = sum(1 for g in opt.param_groups for p in g["params"] if id(p) not in own and id(p) not in orig)
            if elsewhere:  # neither the copy's nor the original model's: a second network the factory closes over
                raise SetupError(
                    f"Setup: {which} built an optimizer over {elsewhere} parameter(s) of a module outside the model "
                    "(neither the model it was given nor your original model: a second network it closes over, e.g. "
                    "a distillation teacher or an EMA copy), which tropt neither copies nor restores",
                    "if that network should train, put it inside the model (a module holding both); if it should "
                    "stay fixed (a teacher), keep its parameters out of the optimizer",
                )
            raise SetupError(
                f"Setup: {which} built an optimizer over {foreign} parameter(s) that are not those of "
                "the model it was given (it probably closes over your original model)",
                "use the argument: lambda m: torch.optim.AdamW(m.parameters()), not model.parameters()",
            )
        return opt

    @staticmethod
    def _build_scheduler(factory: Any, opt: torch.optim.Optimizer) -> Any:
        if factory is None:
            return None
        try:
            sched = factory(opt)
        except Exception as exc:
            raise StepError(f"the scheduler factory raised {type(exc).__name__}: {exc}",
                            "it is called as scheduler(optimizer)") from exc
        if not (hasattr(sched, "step") and hasattr(sched, "state_dict")):
            raise SetupError(
                f"Setup: the scheduler factory returned a {type(sched).__name__}, expected an LR scheduler",
                "return e.g. torch.optim.lr_scheduler.StepLR(opt, step_size=10)",
            )
        return sched

    def _context(self, copy_: nn.Module, opts: list[tuple[str, torch.optim.Optimizer]], scheds: list[Any],
                 init_scale: float | None, accumulation_steps: int | None) -> StepContext:
        scaler = None
        if self.use_scaler:
            kwargs: dict[str, Any] = {} if init_scale is None else {"init_scale": init_scale}
            scaler = torch.amp.GradScaler(torch.device(self.device).type, **kwargs)
        return StepContext(
            model=copy_,
            optimizer=opts[0][1] if opts else None,
            scheduler=scheds[0] if scheds else None,
            scaler=scaler,
            loss_fn=self.loss,
            grad_clip=self.grad_clip,
            accumulation_steps=self.accumulation_steps if accumulation_steps is None else accumulation_steps,
            device=torch.device(self.device),
            precision=self.precision,
            layout=self.layout,
            more_optimizers=tuple(o for _, o in opts[1:]),
            more_schedulers=tuple(scheds[1:]),
            optimizer_names=tuple(n for n, _ in opts) if len(opts) > 1 else (),
        )

    def run_step(self, ctx: StepContext, micro_batches: list) -> Any:
        """Call the step under test; exceptions from the user's step name it and keep the cause."""
        micro_batches = mark_batch_dynamic(ctx.model, micro_batches, self._dynamic_dim)
        try:
            if "accelerate" not in sys.modules:  # nothing to tell (accelerate_told would be a no-op): the hot path
                return self.step_fn(ctx, micro_batches)
            with accelerate_told(ctx, micro_batches):
                return self.step_fn(ctx, micro_batches)
        except TroptError:
            raise
        except Exception as exc:
            who = ("tropt.standard_step" if self.uses_standard_step
                   else f"your step function {describe_callable(self.step)}")
            raise StepError(f"{who} raised {type(exc).__name__}: {exc}",
                            "fix the step; it is called as step(ctx, micro_batches)") from exc

    def validate(self) -> Setup:
        """First-use validation on copies: the factories, one batch, and a finite scalar loss with a gradient path.

        Cached: later calls return at once. Raises :class:`SetupError`/:class:`StepError` with the fix.
        """
        if self._validated.get("ok"):
            return self
        from .snapshot import preserved

        with preserved(self.model):
            ctx = self.build()
            batch = self.sample_batch()
            n = self.size(batch)
            if self.accumulation_steps > n and self.loader_batches_per_step == 1:
                raise SetupError(
                    f"Setup: accumulation_steps={self.accumulation_steps} but a batch holds only {n} samples",
                    "use bigger batches or fewer accumulation steps",
                )
            with ctx.autocast():
                loss = self.loss(ctx.model, batch)
            if not torch.isfinite(loss.detach()).item():
                raise StepError(
                    f"Setup: loss_fn returned a non-finite loss ({loss.item()}) on the first batch at initialisation",
                    "check the inputs for NaN/inf and the loss for log(0) or division by zero",
                )
            if not loss.requires_grad:
                raise StepError("Setup: the loss does not depend on any parameter that requires grad (no gradient can "
                                "flow)",
                                "do not call .item(), .detach() or torch.no_grad() inside loss_fn; check requires_grad "
                                "on the model")
            opt = ctx.optimizer
            self._validated.update(ok=True, batch_size=n, optimizer=type(opt).__name__ if opt is not None else None,
                                   optimizer_defaults={k: v for k, v in opt.defaults.items()
                                                       if isinstance(v, (int, float, str, bool, tuple))}
                                   if opt is not None else {},
                                   scheduler=type(ctx.scheduler).__name__ if ctx.scheduler is not None else None)
            if ctx.more_optimizers:  # several optimizers: each one by name
                self._validated.update(
                    optimizer=", ".join(f"{ctx.optimizer_name(i)}: {type(o).__name__}"
                                        for i, o in enumerate(ctx.optimizers)),
                    scheduler=", ".join(f"{ctx.optimizer_name(i)}: {type(s).__name__}"
                                        for i, s in enumerate(ctx.schedulers) if s is not None) or None)
        return self

    def describe(self) -> dict[str, Any]:
        """A JSON-safe description of the configuration (what the run identity hashes)."""
        n_params = sum(p.numel() for p in self.model.parameters())
        info = {
            "model": type(self.model).__name__,
            "model_repr": repr(self.model),
            "parameters": n_params,
            "step": "standard_step" if self.uses_standard_step else describe_callable(self.step),
            "accumulation_steps": self.accumulation_steps,
            **({"accumulation": self.accumulation} if self.accumulation_steps > 1 else {}),
            "grad_clip": self.grad_clip,
            "precision": self.precision,
            "use_scaler": self.use_scaler,
            "num_classes": self.num_classes,
            "device": str(self.device),
            "seed": self.seed,
        }
        if self.batch_dim or self.split_fn is not None:  # only when set, so existing identities keep their hash
            info["batch_layout"] = (f"batch_dim={self.batch_dim}" if self.split_fn is None
                                    else describe_callable(self.split_fn))
        for key in ("optimizer", "optimizer_defaults", "scheduler"):
            if key in self._validated:
                info[key] = self._validated[key]
        return info
