"""Fuzz categories that fail on purpose, to show a campaign pins each
failure to its input and goes on."""

import os
import time


class Crashes:
    name = "crashes"

    def generate(self, rng):
        return {"value": int(rng.integers(0, 4))}

    def run(self, case):
        if case["value"] == 3:
            os.abort()  # SIGABRT, as a C++ assertion would
        return "accepted"


class Hangs:
    name = "hangs"

    def generate(self, rng):
        return {"value": int(rng.integers(0, 4))}

    def run(self, case):
        if case["value"] == 2:
            time.sleep(3600)
        return "refused"
