"""The engine environment (issue 50): vLLM's engine with tpu-inference's
worker, model runner and KV cache, on JAX's CPU backend, with kvref editable.
`python -m tests.engine.build_env` creates `.venv-engine` under the repo root
and writes what it built, how long it took and how big it is to
`.venv-engine/engine-env.json`.

The pins are the set found to install together (Python 3.11): torchax 0.0.13
fails on torch 2.13 (aten.prod has no overload dim_Dimname); tokamax
0.0.17.dev uses Python 3.12 syntax. torch==2.13.0 is the CPU wheel on this
disk (/opt/wheels); any other torch request downloads CUDA, so torch is
installed first and nothing after it may replace it (checked at the end).
vllm-tpu 0.32.0 is an sdist only: built with VLLM_TARGET_DEVICE=tpu, without
build isolation, against a cmake from PyPI (Debian's 3.25.1 is below 3.26).
tpu-inference is installed --no-deps (its requirements pin the TPU stack,
libtpu and the tpu_raiden name). Never `tpu-raiden-*`: an unrelated package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from probes.iut.peer_env import PeerEnv, PeerEnvError, base_python, check_dists

REPO = Path(__file__).resolve().parents[2]
ENV = PeerEnv("engine", REPO / ".venv-engine", {
    "vllm-tpu": "0.32.0", "tpu-inference": "0.32.0", "torch": "2.13.0",
    "jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8", "torchax": "0.0.14.dev20261026",
    "qwix": "0.1.2", "tokamax": "0.0.12", "transformers": "5.19.0",
    "xgrammar": "0.2.8", "apache-tvm-ffi": "0.1.15.post2", "numba": "0.68.1", "torchvision": "0.28.0"},
    python_version="3.11", report=("triton", "numpy"))
# What building vllm-tpu's sdist without isolation needs (its pyproject's build-system).
BUILD = {"cmake": "3.31.6", "ninja": "1.11.1.4", "setuptools": "80.9.0", "setuptools-scm": "8.3.1", "setuptools-rust": "1.11.1",
         "wheel": "0.45.1", "packaging": "25.0", "jinja2": "3.1.6",
         "scikit-build-core": "0.11.5", "nanobind": "2.9.2"}
# Installed first, alone: pinned before anything can ask for another torch.
FIRST = ("torch",)
# Installed --no-deps after the rest: tpu-inference (its requirements name
# TPU-only packages); xgrammar (vLLM imports it at start-up; its requirement
# of triton, about 1 GB, is for GPU kernels never run here); torchvision (the
# only build for torch 2.13.0 is CUDA's, whose extension does not load on the
# CPU torch: standins/torchvision_ops.py).
NO_DEPS = ("tpu-inference", "xgrammar", "torchvision")
BUILT = ("vllm-tpu",)
# vllm-tpu's own requirements it is installed without (it goes in --no-deps,
# then its other requirements, read from the wheel, beside the pins):
# tpu-inference (installed --no-deps above: its requirements pin libtpu and
# the TPU jax), ray and nixl (multi-host executors and NIXL transfers, not
# used by one in-process engine), xgrammar (installed --no-deps above).
# numba is not among them, but vLLM's n-gram proposer, which tpu-inference's
# runner imports, needs it.
WITHOUT = {"tpu-inference", "ray", "nixl", "xgrammar"}


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional requirements and those whose markers hold
    here, less WITHOUT (names normalized)."""
    import zipfile
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from probes.iut.peer_env import normal_name
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    here = default_environment() | {"python_version": ENV.python_version, "extra": ""}
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = Requirement(line.split(": ", 1)[1])
        if normal_name(req.name) in WITHOUT or (req.marker and not req.marker.evaluate(here)):
            continue
        out.append(str(req).split(";")[0].strip())
    return out


def run(cmd, **kw) -> None:
    print("+", " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    done = subprocess.run(list(map(str, cmd)), **kw)
    if done.returncode:
        raise PeerEnvError(f"command failed ({done.returncode}): {' '.join(map(str, cmd))}")


def pins(names) -> list[str]:
    return [f"{n}=={ENV.pins[n]}" for n in names]


def build_vllm(python: str, out: Path) -> Path:
    """vllm-tpu's wheel, built from its sdist for the TPU target, in one pip
    call: without build isolation (an isolated build would fetch its build
    requirements again, and with --no-binary from source) and --no-binary for
    vllm-tpu alone."""
    # VLLM_VERSION_OVERRIDE: its setup.py otherwise versions the build
    # 0.32.0+<target>, which pip discards as inconsistent with vllm-tpu==0.32.0.
    env = {**os.environ, "VLLM_TARGET_DEVICE": "tpu", "MAX_JOBS": "1",
           "VLLM_VERSION_OVERRIDE": ENV.pins["vllm-tpu"],
           "PATH": f"{Path(python).parent}:{os.environ['PATH']}"}
    run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-binary", "vllm-tpu",
         "-w", out, f"vllm-tpu=={ENV.pins['vllm-tpu']}"], env=env)
    return next(out.glob("vllm*.whl"))


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def create() -> dict:
    times = {}
    start = time.monotonic()
    built = sorted((ENV.venv / "wheels").glob("vllm*.whl"))
    if not (ENV.venv / "bin" / "python").exists():
        run([*base_python(ENV.python_version), "-m", "venv", ENV.venv])
    python = str(ENV.venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q"]
    run([*pip, "--upgrade", "pip==25.3"])
    run([*pip, *pins(FIRST)])
    run([*pip, *(f"{k}=={v}" for k, v in BUILD.items()), f"torch=={ENV.pins['torch']}"])
    times["base_s"] = round(time.monotonic() - start, 1)
    t = time.monotonic()
    wheel = built[0] if built else build_vllm(python, ENV.venv / "wheels")
    times["vllm_build_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    rest = [n for n in ENV.pins if n not in FIRST + NO_DEPS + BUILT]
    run([*pip, "--no-deps", str(wheel)])
    run([*pip, *wheel_requirements(wheel), *pins(rest), f"torch=={ENV.pins['torch']}"])
    run([*pip, "--no-deps", *pins(NO_DEPS)])
    run([*pip, "--no-build-isolation", "-e", REPO, "--config-settings=build-dir=build/engine-{wheel_tag}"])
    times["install_s"] = round(time.monotonic() - t, 1)
    times["total_s"] = round(time.monotonic() - start, 1)
    found = verify(python)
    site = next((ENV.venv / "lib").glob("python3.*/site-packages"))
    sizes = {"venv_bytes": du(ENV.venv),
             "triton_bytes": du(site / "triton") if (site / "triton").exists() else 0}
    summary = {"pins": ENV.pins, "build": BUILD, "found": found, "times": times, "sizes": sizes}
    (ENV.venv / "engine-env.json").write_text(json.dumps(summary, indent=1))
    return summary


def verify(python: str) -> dict:
    from probes.iut.peer_env import CHECK_SCRIPT
    done = subprocess.run([python, "-c", CHECK_SCRIPT], capture_output=True, text=True)
    if done.returncode:
        raise PeerEnvError(done.stderr[-500:])
    found = json.loads(done.stdout)
    dists = check_dists(ENV, found["dists"], tuple(found["python"]))
    return {d: dists.get(d, "") for d in (*ENV.pins, *ENV.report)}


if __name__ == "__main__":
    if "--verify" in sys.argv:
        print(json.dumps(verify(str(ENV.venv / "bin" / "python")), indent=1))
    else:
        print(json.dumps(create(), indent=1))
