"""Run at the start of every Python process the engine starts (its folder is
on PYTHONPATH, set by standins.install()): vLLM inspects a model's class in
a child process of its own, which imports torchvision through transformers,
so the torchvision schema stand-in is applied there as in the driver. (A
machine that had inspected the model before skips the child: vLLM caches
what it found.)"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_engine_torchvision_ops",
                                               Path(__file__).resolve().parents[1] / "torchvision_ops.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_module.install()
