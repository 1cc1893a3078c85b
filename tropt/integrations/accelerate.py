"""Hugging Face accelerate: tell a user's ``Accelerator`` what each of tropt's runs is.

The public name of the adapter in :mod:`tropt.core.accelerate` (the core holds it because ``Setup.run_step`` and
``loop.ddp`` use it, and the core never imports ``integrations``). Nothing here imports accelerate: each helper is a
no-op unless the user's code already did.
"""

from __future__ import annotations

from ..core.accelerate import accelerate_num_steps, accelerate_told, tell_distributed

__all__ = ["accelerate_num_steps", "accelerate_told", "tell_distributed"]
