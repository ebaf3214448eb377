import os

# JAX arrays in the tests live on the CPU; the TPU compiler is only used ahead
# of time through explicit topologies, which this does not affect.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
