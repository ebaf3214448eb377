"""Running probes: the `kvprobe` command, the watched runner and its worker."""
