"""A TPU type the shipped table does not know, probed with no source edited:
named chip or chip:topology, compiled live and cached, reported under its
chip's name, and qualified against one already known."""

import subprocess
import sys

import pandas as pd
import pytest

from kvref.generations import check_generation, report_name
from probes.report import qualification, results

NEW, OLD = "v2:2x2", "v3"


@pytest.mark.parametrize("text", ["v2", "v2:2x2", "tpu7x:1x1x1", "v4:2x2x2"])
def test_tpu_types_are_named_chip_or_chip_topology(text):
    assert check_generation(text) == text


@pytest.mark.parametrize("text", ["", "V2", "v2:", "v2:2", "v2:2x", "v2:0x2", "v2 2x2", None])
def test_a_malformed_type_names_what_is_expected(text):
    with pytest.raises(ValueError, match=r"written chip or chip:topology \(v2, v2:2x2\)"):
        check_generation(text)


def test_reports_of_a_new_chip_go_under_its_name():
    assert [report_name(g) for g in ("v2:2x2", "v2", "v3", "v4:2x2x2")] == ["v2", "v2", "v3", "v4-2x2x2"]


@pytest.mark.oracle
def test_the_installed_libtpu_says_which_types_it_compiles_for():
    from kvref.oracle import compiler, device_kind

    assert compiler.accepts(NEW) is None and device_kind(NEW) == "TPU v2"
    assert "Invalid TPU external name" in compiler.accepts("v9")
    listed = subprocess.run([sys.executable, "-m", "probes.run.cli", "generations", "v9"], capture_output=True,
                            text=True, timeout=300)
    assert listed.returncode == 0 and "v2             compiles for it: TPU v2" in listed.stdout
    assert "v9             no: " in listed.stdout


def test_an_unknown_type_is_refused_before_anything_runs(tmp_path):
    done = subprocess.run([sys.executable, "-m", "probes.run.cli", "run", "-g", "v9", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "TPU type 'v9'" in done.stderr and "Invalid TPU external name" in done.stderr
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def qualified(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    done = subprocess.run([sys.executable, "-m", "probes.run.cli", "qualify", NEW, "--against", OLD,
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.oracle
def test_qualify_writes_the_new_types_reports_and_the_qualification(qualified):
    new = results.read_run(results.latest_run(qualified / "v2"))
    assert set(new["generation"]) == {NEW} and set(new["device_kind"]) == {"TPU v2"}
    assert new["layout_source"].str.startswith("compiler").all()
    assert (qualified / "v2" / "summary.md").read_text().startswith("# v2:2x2 (TPU v2)")
    report = (qualified / "v2" / "qualification-vs-v3.md").read_text()
    for title in ("Layouts that changed", "Block slice sizes that changed", "Shapes newly refused",
                  "Shapes newly accepted", "Every verdict that differs"):
        assert f"## {title} (" in report


@pytest.mark.oracle
def test_the_qualification_shows_each_change_with_both_sides(qualified):
    """Plant a changed layout, slice size and verdict in a copy of the new
    type's rows: each shows up, with both details."""
    new = results.read_run(results.latest_run(qualified / "v2"))
    old = results.read_run(results.latest_run(qualified / "v3"))
    planted = new.copy()
    trip = planted.index[(planted["probe"] == "roundtrip") & (planted["verdict"] == "PASS")][0]
    planted.loc[trip, ["layout", "slice_bytes", "verdict", "detail"]] = [
        "bf16[1]{0}", 7, "REJECTED", "planted refusal"]
    sections = qualification.compare(planted, old)
    shape = planted.loc[trip, "shape"]
    assert list(sections["Layouts that changed"]["shape"]) == [shape]
    assert list(sections["Block slice sizes that changed"]["shape"]) == [shape]
    assert list(sections["Shapes newly refused"]["shape"]) == [shape]
    differs = sections["Every verdict that differs"]
    assert len(differs) == 1 and differs["detail_new"].iloc[0] == "planted refusal"
    assert differs["detail_old"].iloc[0] == old.set_index("shape").loc[shape].query("probe == 'roundtrip'")[
        "detail"].iloc[0]
    assert qualification.compare(new, new.assign(run_id="x"))["Every verdict that differs"].empty
    assert isinstance(sections["Shapes newly accepted"], pd.DataFrame) and sections["Shapes newly accepted"].empty


@pytest.mark.oracle
def test_production_rows_are_held_to_the_prediction_not_compared_across_types(qualified):
    """On a TPU VM of the new type the run also holds the production libraries
    to the prediction: their disagreeing cases get a section of their own,
    and they never enter the comparison between the two types."""
    new = results.read_run(results.latest_run(qualified / "v2"))
    old = results.read_run(results.latest_run(qualified / "v3"))
    production = new[new["probe"] == "roundtrip"].head(2).assign(iut="tpu-sync-jax-tpu")
    production.loc[production.index[0], ["verdict", "detail"]] = ["CORRUPT", "planted wrong bytes"]
    sections = qualification.compare(pd.concat([new, production]), old)
    held = sections["Production libraries against the prediction"]
    assert list(held["detail"]) == ["planted wrong bytes"]
    assert sections["Every verdict that differs"].empty
    assert "Production libraries against the prediction" not in qualification.compare(new, old)


def test_qualify_adds_the_hardware_libraries_only_on_a_tpu_of_the_new_type(monkeypatch):
    from probes.run import command

    monkeypatch.setattr(command, "tpu_visible", lambda: True)  # where the run looks the machine's TPU up
    monkeypatch.setattr(command, "local_generation", lambda: "v4")
    assert command.hardware_iuts("v4") == ["tpu-sync-jax-tpu", "tpu-sync-torch-tpu"]
    assert command.hardware_iuts("v5e") == []
    monkeypatch.setattr(command, "tpu_visible", lambda: False)
    assert command.hardware_iuts("v4") == []
