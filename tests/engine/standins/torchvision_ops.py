"""Stand-in for torchvision's operator registration.

transformers and vLLM import torchvision when it is installed; its C
extension registers `torchvision::nms` against torch's dispatcher, and a
torchvision wheel built for another torch than the CPU 2.13.0 on this disk
fails with "operator torchvision::nms does not exist". The engine runs a
text-only model and no vision operator, so torchvision is made unimportable
for the engine's processes (transformers then takes its no-vision paths).
If torchvision imports cleanly, nothing is done."""

import importlib.util
import sys


def install() -> str:
    if importlib.util.find_spec("torchvision") is None:
        return "torchvision: not installed, nothing to stand in"
    try:
        import torchvision  # noqa: F401
        return "torchvision: imports cleanly, left as is"
    except Exception as error:  # the operator schema error, when torch and torchvision disagree
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None  # import torchvision -> ImportError
        return f"torchvision: made unimportable ({type(error).__name__}: {str(error)[:80]})"
