"""`kvprobe fuzz`: random call sequences find nothing in the reference, and
with a fault model on they find it, shrink it and keep it as data, whose
rendered reproducer fails the same way when run alone."""

import ast
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import kvref
from probes.run import cli, findings, fuzz_command, reproducers
from probes.suite.cases import Case
from probes.suite.verdicts import Outcome


def test_the_reference_survives_random_sequences(tmp_path, capsys):
    assert cli.main(["fuzz", "--model", "blocks", "--iut", "kvref-sim", "-g", "tpu7x", "--sequences", "6",
                     "--out", str(tmp_path)]) == 0
    assert "6 sequences: PASS 6" in capsys.readouterr().out
    assert not (tmp_path / "tpu7x" / "findings").exists()


def test_a_fault_is_found_shrunk_kept_as_data_and_reproduced_alone(tmp_path, capsys):
    results, findings = fuzz_command.fuzz_iut(
        "kvref-sim", "tpu7x", sequences=4, seed=1,
        faults=kvref.Faults(no_await_before_transfer=True), out=tmp_path)
    assert findings and all(f.result.outcome.verdict != "PASS" for f in findings)
    finding = findings[0]
    assert len(finding.result.case.calls["calls"]) <= 2  # shrunk from 10 calls
    assert finding.path.parent == tmp_path / "tpu7x" / "findings" and finding.path.suffix == ".json"
    kept = json.loads(finding.path.read_text())
    assert kept["case"]["calls"] == finding.result.case.calls and kept["verdict"] == finding.result.outcome.verdict
    capsys.readouterr()
    assert cli.main(["fuzz", "--reproducer", str(finding.path)]) == 0
    script = tmp_path / "reproducer.py"
    script.write_text(capsys.readouterr().out)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    printed = done.stdout + done.stderr
    assert done.returncode == 1, printed[-2000:]
    assert printed.startswith(finding.result.outcome.verdict) or \
        f"\n{finding.result.outcome.verdict} " in printed


def test_a_finding_seen_under_two_option_sets_is_kept_once(tmp_path):
    """The same sequence failing alike under two ways of building the
    manager is one finding listing both; a sequence that fails otherwise is
    a finding of its own."""
    case = Case("call_sequence", "cpu", "tpu-sync-jax", "fuzz-0-0", kvref.ShapeKey.parse("bf16[64,2,32,640]"),
                calls={"shape": "bf16[64,2,32,640]", "layers": 1, "host_blocks": 4, "mode": "ready",
                       "calls": [{"d2h": True, "src": [0], "dst": [9], "sizes": [1]}]})
    crash = Outcome("CRASH", "killed by SIGSEGV\nI1204 10:00:00.000000 7107 tpu_utils.cc:630] Detected eth0")
    def write(case, found_in):
        return findings.write_finding(case, crash.verdict, crash.detail, "", found_in, tmp_path)
    first = write(case, "cpu/call_sequence/fuzz-0-0")
    again = write(replace(case, iut_options=(("RAIDEN_ENABLE_ASYNC_DISPATCH", "1"),)), "cpu/call_sequence/fuzz-0-0")
    other = write(replace(case, calls={**case.calls, "layers": 2}), "x")
    assert first == again != other
    kept = json.loads(first.read_text())
    assert kept["option_sets"] == [[], [["RAIDEN_ENABLE_ASYNC_DISPATCH", "1"]]]
    assert kept["detail"] == "killed by SIGSEGV"  # the library's log lines taken out
    assert "failed alike built with RAIDEN_ENABLE_ASYNC_DISPATCH='1'" in reproducers.render(first)
    with pytest.raises(ValueError, match="option set 2; it has 2"):
        reproducers.render(first, 2)


def test_a_new_finding_never_takes_the_name_of_one_kept_and_a_torn_file_breaks_nothing(tmp_path):
    case = Case("call_sequence", "cpu", "tpu-sync-jax", "fuzz-0-0", kvref.ShapeKey.parse("bf16[64,8,128]"),
                calls={"steps": []})
    stem = "blocks-tpu_sync_jax-error"
    (tmp_path / f"{stem}-1.json").write_text('{"model": "blocks", "cas')  # torn by a campaign that died
    (tmp_path / f"{stem}-3.json").write_text("{}")  # 2 was deleted
    written = [findings.write_finding(replace(case, calls={"steps": [n]}), "ERROR", f"reason {n}", "", "x", tmp_path)
               for n in range(2)]
    assert [p.name for p in written] == [f"{stem}-4.json", f"{stem}-5.json"]
    assert (tmp_path / f"{stem}-3.json").read_text() == "{}"
    assert not list(tmp_path.glob(".*.part"))


def test_a_rendered_reproducer_holds_a_findings_fields_as_data_never_as_code(tmp_path):
    """A finding is someone else's data: whatever its text fields say stays
    inside the reproducer's docstring."""
    hostile = 'x"""\nimport os; os.system("touch owned")\n"""\\'
    case = Case("call_sequence", "cpu", "tpu-sync-jax", "fuzz-0-0", kvref.ShapeKey.parse("bf16[64,2,32,640]"),
                calls={"shape": "bf16[64,2,32,640]", "layers": 1, "host_blocks": 4, "mode": "ready",
                       "calls": [{"d2h": True, "src": [0], "dst": [9], "sizes": [1]}]})
    path = findings.write_finding(case, "ERROR", hostile + "\x00\x1b[2J", hostile, hostile, tmp_path)
    script = reproducers.render(path)
    tree = ast.parse(script)  # it parses: no NUL, no stray quote
    said = ast.get_docstring(tree)
    assert hostile in said and said.count("os.system") == 3  # the detail, the title's first line, found_in
    assert "os.system" not in script.split(said.splitlines()[-1])[-1]  # none of it after the docstring


@pytest.mark.parametrize("faults, verdict, exit_code", [(("unchecked_unlock",), "ERROR", 1), ((), "PASS", 0)])
def test_a_contract_finding_renders_a_reproducer_that_replays_it_on_its_iut(tmp_path, faults, verdict, exit_code):
    """Any IUT's contract finding (a team's own too): its case held as data,
    replayed through the harness's worker code with the IUT's environment."""
    sequence = {"spec": {"shape": "bf16[64,8,128]", "layers": 1, "host_blocks": 8, "mode": "put"}, "seed": 3,
                "steps": [{"rule": "unlock", "ids": [0]}]}  # a chunk nobody locked: it must be refused
    case = fuzz_command.contract_case("kvref-sim", "tpu7x", kvref.Faults.parse(faults, environ={}), 60.0, 0,
                                      calls=sequence)
    path = findings.write_finding(case, "ERROR", "step 0: unlock [0]: accepted", "", "tpu7x/contract", tmp_path)
    script = tmp_path / "reproducer.py"
    script.write_text(reproducers.render(path))
    assert "shrunk to a sequence of 1 step(s)" in ast.get_docstring(ast.parse(script.read_text()))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == exit_code and done.stdout.startswith(verdict), done.stdout[-2000:] + done.stderr[-2000:]


def test_a_file_that_is_no_finding_is_refused_naming_it(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"sequence": {}}')
    with pytest.raises(ValueError, match="x.json: expected a finding of `kvprobe fuzz --model blocks` or "
                                         "`kvprobe fuzz --model contract`"):
        reproducers.render(path)


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


def _kept_finding(tmp_path, change):
    """A copy of a kept contract finding with `change` made to it."""
    kept = sorted((Path(__file__).resolve().parents[2] / "reports" / "cpu" / "findings").glob("contract-*.json"))[0]
    finding = json.loads(kept.read_text())
    change(finding)
    path = tmp_path / "shared.json"
    path.write_text(json.dumps(finding))
    return path


@pytest.mark.parametrize("change, said", [
    (lambda f: f["case"].update(timeout="60"), r"at case/timeout: '60' is not of type 'number'"),
    (lambda f: f["case"]["calls"].update(steps={"rule": "check"}), r"at case/calls/steps: .* is not of type 'array'"),
    (lambda f: f["case"]["calls"]["steps"].append({"blocks": [1]}), r"at case/calls/steps/\d+: 'rule' is a required"),
    (lambda f: f["case"]["calls"]["spec"].update(layers=10**6), r"at case/calls/spec/layers: 1000000 is greater"),
    (lambda f: f["case"]["calls"]["spec"].update(shape="f32[65536,65536]"),
     r"at spec/shape: f32\[65536,65536\] is a cache of 17,179,869,184 bytes a layer"),
    (lambda f: f.update(option_sets="all"), r"at option_sets: 'all' is not of type 'array'"),
    (lambda f: f["case"].update(extra=1), r"at case: 'extra' is not one of \['probe'"),  # no case has it
])
def test_a_shared_finding_of_the_wrong_form_is_refused_naming_where(tmp_path, change, said):
    """A finding from another team's campaign is checked whole before any of it is used."""
    path = _kept_finding(tmp_path, change)
    with pytest.raises(ValueError, match=f"shared.json: {said}"):
        fuzz_command.replay(path, None, None, kvref.Faults(), 10)


def test_a_bare_sequence_asking_for_huge_caches_is_refused_before_a_worker_starts(tmp_path):
    path = tmp_path / "bare.json"
    path.write_text('{"spec": {"shape": "bf16[1048576,8,1024]", "layers": 2, "host_blocks": 8, "mode": "put"}, '
                    '"seed": 1, "steps": []}')
    with pytest.raises(ValueError, match=r"--replay .*bare.json: at spec/shape: .* a cache of 17,179,869,184 bytes"):
        fuzz_command.replay(path, None, None, kvref.Faults(), 10)


def test_a_finding_file_too_long_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(findings, "MOST_FINDING_BYTES", 1000)
    path = tmp_path / "long.json"
    path.write_text('{"model": "contract", "detail": "' + "x" * 5000 + '"}')
    with pytest.raises(ValueError, match="long.json: not a readable JSON finding .*longer than the 1,000 bytes"):
        findings.read_finding(path, "contract")


def test_a_file_nested_past_the_parsers_depth_is_refused_naming_it(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="deep.json: not a readable JSON finding .nested too deep"):
        findings.read_finding(path, "contract")
    with pytest.raises(ValueError, match="deep.json: not a readable JSON sequence .nested too deep"):
        fuzz_command.replay(path, None, None, kvref.Faults(), 10)
