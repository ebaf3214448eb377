"""kvprobe as a pytest plugin: its hooks are probes.run.pytest_plugin's."""

from probes.run.pytest_plugin import *  # noqa: F401,F403 (pytest finds the hooks by name)
