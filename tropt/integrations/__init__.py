"""Integrations with the frameworks users train with: Lightning, Hugging Face, accelerate, and the loggers
they already read (TensorBoard, MLflow, W&B). Each submodule imports its framework only when used."""
