"""``ascend-patch demo``: the main job, end to end on a tiny model."""

from .pipeline import DemoError, DemoResult, register, run_demo

__all__ = ["DemoError", "DemoResult", "register", "run_demo"]
