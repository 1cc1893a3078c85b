"""Stages 2-3: is the loss at init right, can the model learn, does the signal reach every layer?

Checks (registered ids): ``model.init_loss`` (:func:`check_init_loss`), ``model.eval_metric``
(:func:`check_eval_metric`), ``model.overfit_batch``
(:func:`check_overfit_batch`), ``model.gradient_flow`` (:func:`check_gradient_flow`) and
``model.activation_stats`` (:func:`check_activation_stats`). :class:`GradientMonitor` is the public gradient
recorder the gradient-flow check is built on; use it in your own loop too.
"""

from .activation_stats import check_activation_stats
from .eval_metric import check_eval_metric
from .gradient_flow import check_gradient_flow, judge_gradient_flow
from .init_loss import check_init_loss
from .monitor import GradientMonitor
from .overfit_batch import check_overfit_batch

__all__ = ["GradientMonitor", "check_activation_stats", "check_eval_metric", "check_gradient_flow", "check_init_loss",
           "check_overfit_batch", "judge_gradient_flow"]
