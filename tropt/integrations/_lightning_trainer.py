"""Lightning's side of ``setup_from_lightning`` outside a ``Trainer``: the settings the step needs (:class:`Spec`),
the small stand-in a LightningModule reads as its trainer (:class:`TrainerStandIn`, attached with :func:`attached`),
and ``configure_optimizers`` parsed as Lightning parses it (:func:`parse_optimizers`).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..errors import SetupError, StepError
from ._frameworks import api_changed, import_from

LOW, HIGH = "2.2", "3"  # the Lightning versions supported: >= LOW, < HIGH


@dataclass
class Spec:
    """What the step needs besides the StepContext: the framework, the Trainer settings, the schedule."""

    pkg: str
    dist: str
    accumulate: int
    clip_val: float | None
    clip_algorithm: str  # "norm" or "value": what the clipping does
    steps_per_epoch: int | None
    max_epochs: int | None
    max_steps: int
    clip_given: tuple = (None, None)  # (gradient_clip_val, gradient_clip_algorithm) as given to the Trainer
    configs: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)  # optimizer -> configs

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps of the whole fit, as Lightning's property gives them (an int, or inf when unbounded)."""
        if self.steps_per_epoch is None or self.max_epochs is None or self.max_epochs < 0:
            return int(self.max_steps) if self.max_steps > 0 else float("inf")
        total = self.steps_per_epoch * int(self.max_epochs)
        return min(total, int(self.max_steps)) if self.max_steps > 0 else total



# ------------------------------------------------------------------ the Trainer stand-in
class ClipPlugin:
    """``trainer.precision_plugin.clip_gradients`` as Lightning's Precision plugin does it."""

    def clip_gradients(self, optimizer: torch.optim.Optimizer, clip_val: float | int = 0.0,
                       gradient_clip_algorithm: Any = "norm") -> None:
        if not clip_val or clip_val <= 0:
            return
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)).lower() == "value":
            torch.nn.utils.clip_grad_value_(params, clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, clip_val)


class TrainerStandIn:
    """The few ``Trainer`` attributes a LightningModule reads inside its training hooks, outside a Trainer."""

    barebones = True  # self.log returns at once (with a warning tropt silences)
    training = True
    sanity_checking = False
    logger = None
    loggers: ClassVar[list] = []
    is_global_zero = True
    global_rank = local_rank = node_rank = 0

    def __init__(self, spec: Spec, *, global_step: int = 0, epoch: int = 0, optimizer: Any = None,
                 configs: list | None = None, clip_val: float | None = None, world_size: int = 1) -> None:
        self.global_step = global_step
        self.current_epoch = epoch
        self.accumulate_grad_batches = spec.accumulate
        # As the Trainer holds them (configure_gradient_clipping receives these): None when not given, else the value
        # (tropt's grad_clip for norm clipping, which a check may change) and Lightning's GradClipAlgorithmType.
        self.gradient_clip_val = clip_val
        self.gradient_clip_algorithm = spec.clip_given[1]
        self.max_epochs, self.max_steps = spec.max_epochs, spec.max_steps
        self.num_training_batches = (spec.steps_per_epoch or 0) * spec.accumulate or float("inf")
        self.estimated_stepping_batches = spec.estimated_stepping_batches
        self.precision_plugin = ClipPlugin()
        self.optimizers = [optimizer] if optimizer is not None else []
        self.lr_scheduler_configs = list(configs or [])
        self.strategy = StrategyStandIn(self.optimizers)
        self.world_size = world_size
        self.num_devices = self.num_nodes = 1

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"the module read trainer.{name}, which tropt's stand-in for the Trainer does not have "
            "(setup_from_lightning runs the training hooks outside a Trainer; it provides global_step, current_epoch, "
            "optimizers, lr_scheduler_configs, estimated_stepping_batches, accumulate_grad_batches and the clipping "
            "settings)")


class StrategyStandIn:
    def __init__(self, optimizers: list) -> None:
        self._lightning_optimizers = optimizers
        self.optimizers = optimizers


@contextlib.contextmanager
def attached(module: Any, stand_in: TrainerStandIn):
    """The module (tropt's copy) reads ``stand_in`` as its trainer for the block; self.log stays quiet."""
    saved = module.__dict__.get("_trainer")
    module.trainer = stand_in
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*self\.log\(\)")
            yield
    finally:
        module.trainer = saved


# ------------------------------------------------------------------ configure_optimizers
def parse_optimizers(module: Any, spec: Spec) -> tuple[torch.optim.Optimizer, list]:
    """Call the module's configure_optimizers (with the stand-in attached) and parse it as Lightning does."""
    conf_opts, conf_scheds = import_from(spec.dist, LOW, HIGH, f"{spec.pkg}.core.optimizer",
                                         "_configure_optimizers", "_configure_schedulers_automatic_opt")
    name = type(module).__name__
    with attached(module, TrainerStandIn(spec)):
        try:
            conf = module.configure_optimizers()
        except StepError:
            raise
        except Exception as exc:
            raise StepError(f"{name}.configure_optimizers raised {type(exc).__name__}: {exc}",
                            "it is called on a copy of the module outside a Trainer") from exc
    if conf is None:
        raise SetupError(f"{name}.configure_optimizers returned None: there is no optimizer to check",
                         "return an optimizer (or a dict {'optimizer': ..., 'lr_scheduler': ...}) from "
                         "configure_optimizers")
    misconfigured = misconfiguration(spec.pkg)
    try:
        optimizers, schedulers, monitor = conf_opts(conf)
    except misconfigured as exc:
        raise SetupError(f"{name}.configure_optimizers returned something Lightning does not accept: {exc}",
                         "return one of the shapes Lightning documents for configure_optimizers") from exc
    except (TypeError, ValueError) as exc:
        raise api_changed(spec.dist, LOW, HIGH, "_configure_optimizers", exc) from exc
    if len(optimizers) != 1:
        kinds = ", ".join(type(o).__name__ for o in optimizers)
        raise SetupError(
            f"{name}.configure_optimizers returned {len(optimizers)} optimizers ({kinds}); tropt checks one optimizer "
            "per Setup (and Lightning's automatic optimization allows only one)",
            "merge them into one optimizer with a param group per part (each group keeps its own lr), or check each "
            "part with its own configure_optimizers")
    try:
        configs = conf_scheds(schedulers, monitor)
    except misconfigured as exc:
        raise SetupError(f"{name}.configure_optimizers: {exc}",
                         "fix the lr_scheduler entry as the message says") from exc
    return optimizers[0], configs


def misconfiguration(pkg: str) -> type[BaseException]:
    dist = "lightning" if pkg.startswith("lightning") else "pytorch_lightning"
    try:
        (exc,) = import_from(dist, LOW, HIGH, f"{pkg}.utilities.exceptions", "MisconfigurationException")
        return exc
    except SetupError:
        return RuntimeError


class Schedulers:
    """Several schedulers of one optimizer as the one ``scheduler`` a Setup has (state saved and loaded together)."""

    def __init__(self, schedulers: list) -> None:
        self.schedulers = schedulers

    def step(self) -> None:  # tropt's step steps each one by its own interval; this is for generic callers
        for s in self.schedulers:
            s.step()

    def get_last_lr(self) -> list:
        return self.schedulers[-1].get_last_lr()

    def state_dict(self) -> dict:
        return {"schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state: dict) -> None:
        for s, st in zip(self.schedulers, state["schedulers"], strict=False):
            s.load_state_dict(st)


class InertScheduler:
    """What ``self.lr_schedulers()`` gives inside ``loss_fn``: stepping it does nothing."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get_last_lr(self) -> list:
        return []


@dataclass
class InertConfig:
    scheduler: Any = field(default_factory=InertScheduler)
    interval: str = "step"
    frequency: int = 1
    reduce_on_plateau: bool = False
