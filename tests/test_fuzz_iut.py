"""`kvprobe fuzz`: random call sequences find nothing in the reference, and
with a fault model on they find it, shrink it and write a reproducer that
fails the same way when run alone."""

import pytest

import kvref
from probes.run import cli, fuzz_command


def test_the_reference_survives_random_sequences(tmp_path, capsys):
    assert cli.main(["fuzz", "--model", "blocks", "--iut", "kvref-sim", "-g", "tpu7x", "--sequences", "6",
                     "--out", str(tmp_path)]) == 0
    assert "6 sequences: PASS 6" in capsys.readouterr().out
    assert not (tmp_path / "tpu7x" / "findings").exists()


def test_a_fault_is_found_shrunk_and_reproduced_alone(tmp_path):
    results, findings = fuzz_command.fuzz_iut(
        "kvref-sim", "tpu7x", sequences=4, seed=1,
        faults=kvref.Faults(no_await_before_transfer=True), out=tmp_path)
    assert findings and all(f.result.outcome.verdict != "PASS" for f in findings)
    finding = findings[0]
    assert len(finding.result.case.calls["calls"]) <= 2  # shrunk from 10 calls
    assert finding.script.parent == tmp_path / "tpu7x" / "findings"
    status, printed = fuzz_command.reproduces(finding.script)
    assert status == 1, printed[-2000:]
    assert printed.startswith(finding.result.outcome.verdict) or \
        f"\n{finding.result.outcome.verdict} " in printed


def test_sequences_need_a_layout_whose_rows_are_ranges():
    with pytest.raises(ValueError, match="tpu-sync-jax runs on cpu, not 'v5e'"):
        fuzz_command.fuzz_iut("tpu-sync-jax", "v5e", sequences=1)


def test_the_production_adapter_passes_what_it_cannot_convert_to_the_library():
    # A fuzzed block list holds None or a float: the library must be the one
    # that takes or refuses it, never the adapter failing first.
    import numpy as np

    from probes.iut.tpu_sync import _ints

    converted = _ints(np.array([3, 4], np.int64))
    assert converted == [3, 4] and all(type(x) is int for x in converted)
    kept = _ints([np.int32(1), None, 2.5, "7"])
    assert kept[0] == 1 and type(kept[0]) is int and kept[1:] == [None, 2.5, "7"]
