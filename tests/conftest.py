import os


def pytest_configure(config):
    # JAX arrays in the tests live on the CPU (the TPU compiler is only used
    # ahead of time through explicit topologies, which this does not affect);
    # `pytest -m tpu` on a TPU VM must see the TPU.
    if "tpu" not in (config.getoption("markexpr") or ""):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
