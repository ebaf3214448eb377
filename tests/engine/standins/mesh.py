"""Stand-in for jax.experimental.mesh_utils.create_device_mesh on CPU devices.

tpu-inference's runner builds its device mesh with create_device_mesh, which
orders devices by their physical TPU topology (device.coords,
core_on_chip): attributes a CPU device does not have, so it fails with an
AttributeError the runner does not catch (it falls back to a logical reshape
only on AssertionError/ValueError/RuntimeError). For CPU devices this is
that same logical reshape; TPU devices still go to the real function."""

import numpy as np


def install() -> str:
    from jax.experimental import mesh_utils
    real = mesh_utils.create_device_mesh
    if getattr(real, "kvprobe_standin", False):
        return "mesh: already installed"

    def create_device_mesh(mesh_shape, devices=None, *args, **kwargs):
        import jax
        devices = list(jax.devices() if devices is None else devices)
        if devices and all(d.platform == "cpu" for d in devices):
            return np.array(devices).reshape(tuple(mesh_shape))
        return real(mesh_shape, devices, *args, **kwargs)

    create_device_mesh.kvprobe_standin = True
    mesh_utils.create_device_mesh = create_device_mesh
    return "mesh: create_device_mesh -> logical reshape for CPU devices"
