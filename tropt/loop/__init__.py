"""Stage 4: is the user's own update step right? Invariance checks of the training loop.

Each check runs the Setup's ``step`` (the user's, or :func:`tropt.standard_step`) on identically seeded copies
under a change that must not change the update, captures what reaches ``optimizer.step()``
(:mod:`tropt.core.capture`), and compares (:mod:`tropt.core.compare`). One module per check, named after its id.

Exported: the seven check functions, and tropt's full checkpoint (``default_save_state`` / ``default_load_state``,
what ``loop.resume`` uses when a Setup gives no ``save_state``/``load_state``; docs/guide.md, "loop.resume").
"""

from .accumulation import check_accumulation
from .ddp import check_ddp
from .loss_scaling import check_loss_scaling
from .resume import check_resume, default_load_state, default_save_state
from .scheduler_cadence import check_scheduler_cadence
from .train_mode import check_train_mode
from .zero_grad import check_zero_grad

__all__ = [
    "check_accumulation",
    "check_ddp",
    "check_loss_scaling",
    "check_resume",
    "check_scheduler_cadence",
    "check_train_mode",
    "check_zero_grad",
    "default_load_state",
    "default_save_state",
]
