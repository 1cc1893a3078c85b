"""The generated data of the vision probe ports: the corpus's image_classification generator (3x8x8 noise images with
a bright blob in the quadrant of the class) and its accuracy metric."""
from __future__ import annotations

from ports.image_classification import HW, C, accuracy, image_batches, images

__all__ = ["HW", "C", "accuracy", "image_batches", "images"]
