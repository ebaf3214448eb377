"""Stand-in for torchvision's operator schemas.

transformers imports torchvision.transforms for image processors that
tpu-inference's model registry imports (every architecture's module is
imported when the model class is looked up). The only torchvision built for
torch 2.13.0 on the package index (0.28.0) is the CUDA build: its C
extension does not load against the CPU torch on this disk, so its operators
are never defined, and `import torchvision` fails registering fake kernels
for two of them ("operator torchvision::nms does not exist"). The engine
runs a text-only model and no vision operator: the two schemas are defined
with no kernel (calling them fails, naming the operator), so the Python
part of torchvision, the only part used, imports. With a torchvision whose
extension loads, nothing is done."""

import importlib.util
from pathlib import Path

# Defined by torchvision's C extension; torchvision/_meta_registrations.py
# registers fake kernels for these two whether or not the extension loaded.
SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
           "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_LIBRARY = []  # the torch.library.Library that holds the schemas must stay alive


def install() -> str:
    if importlib.util.find_spec("torchvision") is None:
        return "torchvision: not installed, nothing to stand in"
    import torch
    extension = next(Path(importlib.util.find_spec("torchvision").origin).parent.glob("_C*.so"), None)
    try:
        if extension is not None:
            torch.ops.load_library(str(extension))
            return "torchvision: its C extension loads, left as is"
    except OSError:
        pass
    library = torch.library.Library("torchvision", "DEF")
    for schema in SCHEMAS:
        library.define(schema)
    _LIBRARY.append(library)
    import torchvision  # noqa: F401 (now imports)
    return "torchvision: nms and qnms schemas defined without kernels (its CUDA extension does not load)"
