"""tpu-inference 0.32.0's two KV connectors, unmodified, driven as its model
runner drives them against the drop-in facade (kvref.compat.tpu_sync) or
tpu-sync-jax: see driver.py."""
