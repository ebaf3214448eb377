"""One fuzz worker: `python -m probes.fuzz.input_runner MODULE:CLASS START COUNT SEED
LOG SECONDS` runs inputs START..COUNT-1 of a category, logging each input
before it runs and its outcome after, one JSON line each, so the parent can
pin a crash or a hang (faulthandler's watchdog, re-armed per input) to its
input."""

from __future__ import annotations

import faulthandler
import importlib
import json
import sys
import traceback

import numpy as np

from probes.fuzz.mismatch import Mismatch


def main(spec: str, start: int, count: int, seed: int, log_path: str, seconds: float) -> int:
    module, name = spec.split(":")
    category = getattr(importlib.import_module(module), name)()
    faulthandler.enable()
    with open(log_path, "a") as log:
        for index in range(start, count):
            case = category.generate(np.random.default_rng([seed, index]))
            log.write(json.dumps({"event": "start", "index": index, "input": case}) + "\n")
            log.flush()
            faulthandler.dump_traceback_later(seconds, exit=True)
            try:
                record = {"event": category.run(case)}
            except Mismatch as e:
                record = {"event": "mismatch", "detail": str(e)}
            except Exception as e:  # any other exception is a failure of its own kind
                record = {"event": "unexpected", "detail": f"{type(e).__name__}: {e}\n"
                          f"{traceback.format_exc(limit=-4)}"}
            faulthandler.cancel_dump_traceback_later()
            record.update(index=index, input=case)
            log.write(json.dumps(record) + "\n")
            log.flush()
    return 0


if __name__ == "__main__":
    spec, start, count, seed, log_path, seconds = sys.argv[1:]
    sys.exit(main(spec, int(start), int(count), int(seed), log_path, float(seconds)))
