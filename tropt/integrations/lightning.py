"""PyTorch Lightning: a Setup from a LightningModule, and a callback that watches ``Trainer.fit`` live."""
from ..lazy import lazy_attrs

__all__ = ["TroptCallback", "setup_from_lightning"]  # noqa: F822 - lazy attributes served by __getattr__
__getattr__, __dir__ = lazy_attrs(__name__, {"setup_from_lightning": "._lightning_setup",
                                             "TroptCallback": "._lightning_callback"})
