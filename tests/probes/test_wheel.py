"""kvprobe as a team installs it: `make wheel`'s wheels (kvref's, made
manylinux by auditwheel, and the plugin's) and the example package
installed into an empty environment outside the checkout, everything else
from the package index; the example then qualified with the CLI and with
the plugin under xdist, each writing one summary of every case, which
names the installed copy as the code that ran."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "example-manager"
PROBES = "roundtrip,bad_input"


def run(command, cwd, timeout=900):
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """The bin folder of an empty environment with the wheels and the example installed, and a folder to work in."""
    run(["make", "-s", "wheel"], REPO)
    wheels = sorted((REPO / "dist").glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["kvref", "pytest_kvprobe"], wheels
    assert wheels[0].name.endswith("-manylinux_2_35_x86_64.whl"), wheels[0].name
    root = tmp_path_factory.mktemp("team")
    run([sys.executable, "-m", "venv", str(root / "env")], root)
    bin_ = root / "env" / "bin"
    run([str(bin_ / "python"), "-m", "pip", "install", "-q", *map(str, wheels), str(EXAMPLE), "pytest-xdist==3.8.0"],
        root)
    return bin_, root


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_the_installed_wheel_qualifies_the_example_with_the_cli_and_the_plugin_under_xdist(team):
    bin_, root = team
    run([str(bin_ / "kvprobe"), "run", "--iut", "example-manager", "-g", "tpu7x", "--probe", PROBES, "--out",
         str(root / "cli")], root)
    run([str(bin_ / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--kvprobe-iut",
         "example-manager", "--kvprobe-generation", "tpu7x", "--kvprobe-probe", PROBES, "--kvprobe-out",
         str(root / "plugin"), "-q"], root)
    cli, plugin = summary(root / "cli"), summary(root / "plugin")
    assert cli["cases"] == plugin["cases"] > 20 and not cli["disagreements"] and not plugin["disagreements"]
    for said in (cli, plugin):  # the installed copy ran, not a source tree
        assert said["kvprobe"].startswith(f"0.1.0, installed at {root / 'env'}"), said["kvprobe"]
