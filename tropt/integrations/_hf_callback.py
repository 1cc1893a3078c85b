"""``TroptTrainerCallback``: tropt's live monitoring inside ``transformers.Trainer.train`` (see
:mod:`tropt.integrations.live`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import torch

from ..errors import MissingDependencyError, TroptError
from .live import CHECKS, LiveMonitor

try:
    from transformers import TrainerCallback as _TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("tropt.integrations.hf.TroptTrainerCallback needs transformers",
                                 "pip install 'tropt[hf]'") from exc


class TroptTrainerCallback(_TrainerCallback):
    """Watch ``Trainer.train`` live: gradient flow and the loss curve, early warnings, a report at the end.

    The training loss is read per optimizer step from the model's own output (``outputs.loss`` through a forward
    hook removed at the end; the step's micro-batch losses summed when the Trainer passes ``num_items_in_batch``,
    averaged otherwise, as the Trainer itself logs it) when the model returns one, and otherwise from the Trainer's
    logs (``logging_steps``); ``eval_loss`` from the logs is the validation curve. A ``compute_loss`` override that
    changes the loss after the forward is not in the model's output: pass ``loss_from="logs"`` to read the logged
    loss instead (set ``logging_steps`` small then).

    Parameters
    ----------
    checks, every, sample_every, stop_on, warn, thresholds, curve_thresholds, budget, sync_every
        As :class:`tropt.integrations.lightning.TroptCallback`; ``stop_on`` sets ``control.should_training_stop``.
    out_dir
        Where ``report.html`` and ``findings.json`` go; default ``<args.output_dir>/tropt``.
    log_to
        Where to log tropt's numbers, verdicts and figures (see :func:`tropt.sinks.as_sink`). By
        default the Trainer's ``report_to``: TensorBoard (a writer in ``<output_dir>/runs/tropt``, or
        ``$TENSORBOARD_LOGGING_DIR``), the MLflow run and the W&B run the Trainer's own callbacks started.
    log_figures
        Also log the report's figures at the end of training.
    loss_from
        ``"model"`` (default: the model's ``outputs.loss`` per step, the Trainer's logs when it returns none) or
        ``"logs"`` (the Trainer's logged ``loss`` only).

    After training, ``callback.report``, ``callback.paths`` and ``callback.events`` hold what was seen.
    """

    def __init__(self, checks: Iterable[str] | str = CHECKS, every: int = 50, *, sample_every: int = 10,
                 stop_on: Iterable[str] | str | None = None, out_dir: str | os.PathLike | None = None,
                 log_to: Any = None, log_figures: bool = True, warn: bool = True, thresholds: dict | None = None,
                 curve_thresholds: Any = None, budget: float = 0.01, loss_from: str = "model",
                 sync_every: int | None = 200) -> None:
        from ._frameworks import supported
        from ._hf_setup import HIGH, LOW

        supported("transformers", LOW, HIGH, "hf")  # the callback relies on TrainerCallback's hooks of these versions
        if loss_from not in ("model", "logs"):
            raise TroptError(f"TroptTrainerCallback: loss_from={loss_from!r}", "use 'model' or 'logs'")
        self.loss_from = loss_from
        self._options = dict(checks=checks, every=every, sample_every=sample_every, stop_on=stop_on, warn=warn,
                             thresholds=thresholds, curve_thresholds=curve_thresholds, budget=budget,
                             sync_every=sync_every,
                             logger=logging.getLogger("transformers.trainer"))
        LiveMonitor(**self._options)  # validate now
        self.out_dir = out_dir
        self.log_to = log_to
        self.log_figures = log_figures
        self.live: LiveMonitor | None = None
        self.report = None
        self.paths: dict[str, str] = {}
        self._hook = None
        self._micro: list[torch.Tensor] = []
        self._summed = False
        self._forward_losses = False
        self._targets: list[Any] = []
        self._owned: list[Any] = []

    @property
    def events(self) -> list:
        return list(self.live.events) if self.live is not None else []

    # ------------------------------------------------------------------ train
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            return
        self.live = LiveMonitor(**self._options).attach(model)
        self.report, self.paths, self._micro, self._forward_losses = None, {}, [], False
        if self.loss_from == "model":
            self._hook = model.register_forward_hook(self._capture, with_kwargs=True)
        self._targets = self._log_targets(args) if state.is_world_process_zero else []

    def _capture(self, module: torch.nn.Module, args: Any, kwargs: dict, output: Any) -> None:
        """Keep the loss a training forward returned (``ModelOutput.loss`` / ``output['loss']``); no sync.

        When the Trainer passes ``num_items_in_batch``, each micro-batch's loss is its token-loss sum over the whole
        step's token count, so the step's loss is their sum, not their mean."""
        if not module.training:
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._micro.append(loss.detach())
            self._summed = kwargs.get("num_items_in_batch") is not None

    def on_step_end(self, args, state, control, **kwargs):
        if self.live is None:
            return
        step = int(state.global_step)
        if self._micro:
            self._forward_losses = True
            stacked = torch.stack([m.reshape(()) for m in self._micro])
            loss = stacked.sum() if self._summed else stacked.mean()
            self.live.add_loss(step, loss)
            self._micro = []
        new = self.live.step_end(step)
        if new:
            self._log_events(new, step)
        if self.live.should_stop:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.live is None or not logs:
            return
        step = int(state.global_step)
        if "eval_loss" in logs:
            self.live.add_val_loss(step, logs["eval_loss"])
        if "loss" in logs and not self._forward_losses:
            self.live.add_loss(step, logs["loss"])

    def on_train_end(self, args, state, control, **kwargs):
        if self.live is None:
            return
        live = self.live
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        step = int(state.global_step)
        new = live.check(step, force=True)
        if new:
            self._log_events(new, step)
        live.detach()
        import transformers

        self.report = live.report({"framework": "transformers", "transformers": transformers.__version__})
        if not state.is_world_process_zero:
            return
        self.paths = live.write(self.report, self.out_dir or os.path.join(args.output_dir, "tropt"))
        sink = self._sink()
        if sink is not None:
            live.log(sink, step, figures=False)
            self.report.log_to(sink, step, figures=self.log_figures)
        for writer in self._owned:
            writer.close()
        self._owned = []

    # ------------------------------------------------------------------ logging
    def _log_targets(self, args: Any) -> list[Any]:
        """What to log to: ``log_to``, else the run/writer of each ``report_to`` integration that is active."""
        if self.log_to is not None:
            return list(self.log_to) if isinstance(self.log_to, (list, tuple)) else [self.log_to]
        report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
        report_to = [r for r in report_to if r]
        targets: list[Any] = []
        if "all" in report_to:
            report_to = ["tensorboard", "mlflow", "wandb"]
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter

                writer = SummaryWriter(os.environ.get("TENSORBOARD_LOGGING_DIR")
                                       or os.path.join(args.output_dir, "runs", "tropt"))
                self._owned.append(writer)  # closed at the end of training
                targets.append(writer)
            except ImportError:
                pass
        if "mlflow" in report_to:
            try:
                import mlflow

                run = mlflow.active_run()  # the Trainer's MLflowCallback started it in its on_train_begin
                if run is not None:
                    targets.append(run)  # logged by run id: the callback ends the run before our on_train_end
            except ImportError:
                pass
        if "wandb" in report_to:
            try:
                import wandb

                if wandb.run is not None:
                    targets.append(wandb.run)
            except ImportError:
                pass
        return targets

    def _sink(self) -> Any:
        from ..sinks import log_targets

        return log_targets(self._targets) if self._targets else None

    def _log_events(self, events: list, step: int) -> None:
        from ..sinks import log_events

        sink = self._sink()
        if sink is not None:
            log_events(events, sink, step)


__all__ = ["TroptTrainerCallback"]
