"""Hugging Face transformers: a Setup from a ``Trainer``, and a ``TrainerCallback`` that watches ``train()`` live."""
from ..lazy import lazy_attrs

__all__ = ["TroptTrainerCallback", "setup_from_trainer"]  # noqa: F822 - lazy attributes served by __getattr__
__getattr__, __dir__ = lazy_attrs(__name__, {"setup_from_trainer": "._hf_setup",
                                             "TroptTrainerCallback": "._hf_callback"})
