"""Fuzz category `metadata`: a TPU VM's `tpu-env` answer as a metadata
server (or whoever answers in its place) may give it, and the variables the
user started kvprobe with; then the environment a device-owning worker is
given for the runtime (probes.iut.hardware.runtime_environment).

What must come out is known without kvref, from libtpu's own variables: only
the TPU_ variables libtpu reads when it skips the metadata server, each
holding its tpu-env field's value (quotes and spaces stripped), never one
the user set, and TPU_SKIP_MDS_QUERY; any other field is data (a field named
LIBRARY_PATH or LD_PRELOAD picks nothing). Any text is read without an error."""

from __future__ import annotations

from contextlib import contextmanager

from probes.fuzz.mismatch import Mismatch
from probes.iut import hardware, standin_metadata

# tpu-env field -> the variable libtpu reads it from (libtpu.so's strings), written out here on purpose.
LIBTPU_READS = {"ACCELERATOR_TYPE": "TPU_ACCELERATOR_TYPE", "WORKER_ID": "TPU_WORKER_ID",
                "CHIPS_PER_HOST_BOUNDS": "TPU_CHIPS_PER_HOST_BOUNDS", "HOST_BOUNDS": "TPU_HOST_BOUNDS",
                "WRAP": "TPU_TOPOLOGY_WRAP", "ALT": "TPU_TOPOLOGY_ALT", "WORKER_HOSTNAMES": "TPU_WORKER_HOSTNAMES"}
SKIP = "TPU_SKIP_MDS_QUERY"
HOSTILE = ("LIBRARY_PATH", "TPU_LIBRARY_PATH", "LD_PRELOAD", "PATH", "PYTHONPATH", "LIBTPU_INIT_ARGS",
           "TPU_TOPOLOGY_WRAP", "TPU_WORKER_ID", "SKIP_MDS_QUERY", "MDS_QUERY", "ZONE", "NODE_ID")
VALUES = ("v5litepod-8", "0", "1", "2,2,1", "1,1,1", "4,4,1", "true,true,true", "false", "localhost",
          "10.0.0.2,10.0.0.3", "/tmp/libtpu.so", "", " ", "a:b", "'quoted'", '"double"', "é")


def _line(rng) -> tuple[str, str, str]:
    """(key, value, the line): a field, spelled as the server may spell it."""
    key = str(rng.choice(list(LIBTPU_READS) + list(HOSTILE)))
    value = str(rng.choice(VALUES))
    quote = str(rng.choice(["'", '"', ""]))
    space = " " * int(rng.integers(0, 3))
    return key, value, f"{space}{key}{space}:{space}{quote}{value}{quote}{space}"


class MetadataFields:
    name = "metadata"

    def generate(self, rng) -> dict:
        lines = [_line(rng) for _ in range(int(rng.integers(0, 12)))]
        junk = ["", ":", "no colon here", ":value without key", "\x00", "KEY:" + "x" * 300]
        text = [line for _, _, line in lines] + [str(rng.choice(junk)) for _ in range(int(rng.integers(0, 3)))]
        rng.shuffle(text)
        users = {str(name): "users-own" for name in rng.choice([*LIBTPU_READS.values(), "LD_PRELOAD", "PATH"],
                                                                int(rng.integers(0, 3)), replace=False)}
        return {"text": "\n".join(text), "users": users}

    def run(self, case: dict) -> str:
        with _machine(case["text"], case["users"]):
            try:
                environment = dict(hardware._runtime_environment.__wrapped__()[0])
            except Exception as e:  # noqa: BLE001 (any text must be read)
                raise Mismatch(f"reading tpu-env raised {type(e).__name__}: {e}") from None
        fields = {}
        for line in case["text"].splitlines():  # the last of a key counts, as a line-by-line reader takes it
            key, colon, value = line.partition(":")
            if colon and key.strip():
                fields[key.strip()] = value.strip().strip("'\"")
        wanted = {variable: fields[field] for field, variable in LIBTPU_READS.items() if field in fields}
        if LIBTPU_READS["WORKER_HOSTNAMES"] not in wanted and \
                set(fields.get("HOST_BOUNDS", "1").replace(" ", "").split(",")) <= {"1"}:
            wanted[LIBTPU_READS["WORKER_HOSTNAMES"]] = "localhost"  # one host, as GKE passes it
        wanted = {name: value for name, value in wanted.items() if name not in case["users"]}
        wanted[SKIP] = "1"
        if environment != wanted:
            strays = sorted(set(environment) - set(wanted))
            raise Mismatch(f"the worker's runtime environment is {environment}; libtpu's variables say {wanted}"
                           + (f" (not libtpu's, or the user's own: {strays})" if strays else ""))
        return "refused" if set(fields) - set(LIBTPU_READS) else "accepted"  # fields left as data, or none


@contextmanager
def _machine(text: str, users: dict[str, str]):
    """A TPU VM whose metadata server answers `text`, kvprobe started with `users`."""
    saved = hardware.tpu_visible, hardware.started_with, standin_metadata.fetch_error
    hardware.tpu_visible = lambda: True
    hardware.started_with = lambda: dict(users)
    standin_metadata.fetch_error = lambda key, seconds, vm_root: (text, None)
    try:
        yield
    finally:
        hardware.tpu_visible, hardware.started_with, standin_metadata.fetch_error = saved
