"""The interpreter of a peer environment, for tests that need it: the test
skips, with what is missing, where the environment was not built."""

import pytest


def peer_python_or_skip(env):
    python = env.python()
    if python is None:
        pytest.skip(env.missing())
    return python
