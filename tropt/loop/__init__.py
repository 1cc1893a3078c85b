"""Stage 4: is the user's own update step right? Invariance checks of the training loop.

Each check runs the Setup's ``step`` (the user's, or :func:`tropt.standard_step`) on identically seeded copies
under a change that must not change the update, captures what reaches ``optimizer.step()``, and compares.
"""

from .harness import StepRecord, StepRecorder, compare_tensors, run_steps
from .ddp import check_ddp
from .invariance import check_accumulation, check_loss_scaling, check_scheduler_cadence, check_zero_grad
from .resume import check_resume, default_load_state, default_save_state
from .train_mode import check_train_mode

__all__ = [
    "check_zero_grad",
    "check_accumulation",
    "check_loss_scaling",
    "check_scheduler_cadence",
    "check_resume",
    "check_ddp",
    "check_train_mode",
    "default_save_state",
    "default_load_state",
    "StepRecorder",
    "StepRecord",
    "run_steps",
    "compare_tensors",
]
