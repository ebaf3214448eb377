"""What the forkserver loads once for every case it forks: the worker's
modules and the shipped layout table (reading it costs each fresh worker
about a tenth of a second). Nothing here opens a device or starts a thread."""

from kvref.oracle import table
from probes.run import probe_case, worker  # noqa: F401  (imported for the forked cases)

table.load()
