"""Where results go: the Recorder interface runners write to, and its MLflow edge."""

from k25exp.tracking.recorder import MemoryRecorder, Recorder

__all__ = ["MemoryRecorder", "Recorder"]
