"""Stand-in for tpu_inference.utils.make_optimized_mesh on CPU devices.

tpu-inference's runner builds its device mesh with make_optimized_mesh, which
first sorts the devices by their physical TPU position (`device.coords`): an
attribute a CPU device does not have, so it fails with an AttributeError.
For CPU devices this is the logical mesh its own fallback builds (devices in
order, reshaped); TPU devices still go to the real function."""

import sys

import numpy as np


def install() -> str:
    from tpu_inference import utils
    real = utils.make_optimized_mesh
    if getattr(real, "kvprobe_standin", False):
        return "mesh: already installed"

    def make_optimized_mesh(axis_shapes, axis_names, *, devices=None):
        import jax
        devices = list(jax.devices() if devices is None else devices)
        if devices and all(d.platform == "cpu" for d in devices):
            count = int(np.prod(axis_shapes))
            return jax.sharding.Mesh(np.array(devices[:count]).reshape(tuple(axis_shapes)), tuple(axis_names),
                                     axis_types=(jax.sharding.AxisType.Auto,) * len(axis_shapes))
        return real(axis_shapes, axis_names, devices=devices)

    make_optimized_mesh.kvprobe_standin = True
    utils.make_optimized_mesh = make_optimized_mesh
    runner = sys.modules.get("tpu_inference.runner.tpu_runner")  # took the name at import, if imported already
    if runner is not None:
        runner.make_optimized_mesh = make_optimized_mesh
    return "mesh: make_optimized_mesh -> logical mesh for CPU devices"
