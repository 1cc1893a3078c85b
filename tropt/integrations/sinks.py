"""The loggers tropt writes to (MLflow, W&B, TensorBoard, Lightning loggers): they live in :mod:`tropt.sinks`, so
the core types and the stage checks can log without importing ``integrations``; this path stays for users."""

from ..sinks import MultiSink, Sink, as_sink, log_events, log_monitor, log_report, log_result, log_targets, verdict_text

__all__ = ["MultiSink", "Sink", "as_sink", "log_events", "log_monitor", "log_report", "log_result", "log_targets",
           "verdict_text"]
