"""Builds of the production library as part of the IUT, and bisection over
the published builds."""

import subprocess
import sys

import pytest

from probes.iut import builds
from probes.iut.peer_env import PEER_ENVS, PeerEnvError
from probes.iut.registry import iut
from probes.report import results
from probes.run.bisect import Step, between, bisect
from probes.suite.verdicts import Outcome

RC, NIGHTLY = "0.0.1rc20261023185136", "0.0.1.dev20261027082629"


def test_a_build_is_named_name_equals_version():
    declared = iut(f"tpu-sync-jax=={NIGHTLY}")
    assert declared.build == NIGHTLY and declared.name == f"tpu-sync-jax=={NIGHTLY}"
    assert iut("tpu-sync-jax").build is None
    with pytest.raises(ValueError, match="'not-a-version' is not a version"):
        iut("tpu-sync-jax==not-a-version")
    with pytest.raises(ValueError, match="kvref-sim has no builds to choose"):
        iut("kvref-sim==0.1.0")


def test_builds_are_ordered_by_their_build_stamp_not_pep440():
    versions = [RC, NIGHTLY, "0.0.1.dev20261022073132"]
    assert builds.in_build_order(versions) == ["0.0.1.dev20261022073132", RC, NIGHTLY]


def test_an_install_holding_anything_but_the_build_is_refused(tmp_path):
    for name, version in (("tpu_sync_jax", "1.0"), ("tpu-raiden-jax", "1.0")):
        info = tmp_path / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    with pytest.raises(PeerEnvError, match="unrelated package"):
        builds.check(tmp_path, "tpu-sync-jax", "1.0")
    (tmp_path / "tpu-raiden-jax-1.0.dist-info" / "METADATA").unlink()
    (tmp_path / "tpu-raiden-jax-1.0.dist-info").rmdir()
    with pytest.raises(PeerEnvError, match="expected exactly that build"):
        builds.check(tmp_path, "tpu-sync-jax", "2.0")
    builds.check(tmp_path, "tpu-sync-jax", "1.0")


def stand_in(verdicts: dict[str, str]):
    calls = []

    def verdict_of(build: str) -> Outcome:
        calls.append(build)
        return Outcome(verdicts[build], f"detail of {build}")
    return verdict_of, calls


@pytest.mark.parametrize("change_at", range(1, 16))
def test_bisect_finds_the_adjacent_pair_where_the_verdict_changed(change_at):
    series = [f"b{i:02}" for i in range(16)]
    verdict_of, calls = stand_in({b: ("PASS" if i < change_at else "CRASH") for i, b in enumerate(series)})
    found = bisect(series, verdict_of)
    assert (found.before.build, found.after.build) == (series[change_at - 1], series[change_at])
    assert found.after.outcome.detail == f"detail of {series[change_at]}"
    assert len(calls) == len(set(calls)) <= 2 + 4  # both ends, then log2(16) steps at most


def test_bisect_finds_the_first_build_with_the_newest_verdict_past_a_third_one():
    series = ["a", "b", "c", "d", "e", "f"]
    verdict_of, _ = stand_in(dict(zip(series, ["CRASH", "CRASH", "HANG", "HANG", "PASS", "PASS"])))
    found = bisect(series, verdict_of)
    assert (found.before.build, found.before.outcome.verdict) == ("d", "HANG")
    assert (found.after.build, found.after.outcome.verdict) == ("e", "PASS")


def test_bisect_says_when_nothing_changed_in_the_range():
    verdict_of, calls = stand_in({"a": "HANG", "b": "HANG", "c": "HANG"})
    found = bisect(["a", "b", "c"], verdict_of)
    assert found.after is None and calls == ["c", "a"]
    assert [s.build for s in found.steps] == ["c", "a"] and isinstance(found.steps[0], Step)


def test_bisect_range_is_checked():
    published = ["a", "b", "c"]
    assert between(published, "a", "c") == published
    with pytest.raises(ValueError, match="'x' is not a published build|x is not a published build"):
        between(published, "x", "c")
    with pytest.raises(ValueError, match="not older"):
        between(published, "c", "a")


@pytest.fixture(scope="module")
def registry():
    if PEER_ENVS["jax"].python() is None:
        pytest.skip(PEER_ENVS["jax"].missing())
    try:
        return builds.published("tpu-sync-jax")
    except builds.BuildUnavailable as e:
        pytest.skip(f"the registry cannot be reached: {e}")


@pytest.mark.peer
def test_two_builds_side_by_side(registry, tmp_path):
    """One real run of a few cases on the pinned release candidate and a
    nightly: each row's iut_version is the build's own."""
    assert RC in registry and NIGHTLY in registry
    matrix = tmp_path / "m.csv"
    matrix.write_text('name,shape,probes\nsmall,"bf16[512,8,256]",roundtrip\n')
    done = subprocess.run([sys.executable, "-m", "probes.run.cli", "run", "--iut",
                           f"tpu-sync-jax=={RC},tpu-sync-jax=={NIGHTLY}", "--generation", "cpu",
                           "--matrix", str(matrix), "--probe", "roundtrip,bad_input", "--out",
                           str(tmp_path / "r")], capture_output=True, text=True, timeout=900)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    frame = results.read_run(results.latest_run(tmp_path / "r" / "cpu"))
    assert done.returncode == (1 if len(results.disagreements(frame)) else 0), done.stderr[-3000:]
    ran = frame[frame["verdict"] != "SKIP"]
    assert set(ran["iut"]) == {f"tpu-sync-jax=={RC}", f"tpu-sync-jax=={NIGHTLY}"}, frame[["iut", "detail"]]
    assert all(name.endswith("==" + version) for name, version in zip(ran["iut"], ran["iut_version"]))
    summary = (tmp_path / "r" / "cpu" / "summary.md").read_text()
    assert f"tpu-sync-jax=={RC}" in summary and f"tpu-sync-jax=={NIGHTLY}" in summary
